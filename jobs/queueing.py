"""Kueue in the plan: which LocalQueue and WorkloadPriorityClass a job gets, whether the platform allows
them, what the job asks of its ClusterQueue's quota and whether that fits now. Pure: plain data in (the job,
its runtime, the site's per-namespace Kueue settings, the Kueue objects planning read), plain data out.

- The queue: the job's `queue_name`, else its namespace's default queue (a site setting; the key "*" is the
  default for every namespace without one of its own). No queue and no priority class: Kueue plays no part
  and nothing is read from it.
- Refusals (DESIGN.md): `queue-not-found` when the LocalQueue does not exist in the job's namespace, or
  Kueue is not installed at all; `priority-class-not-allowed` when the job asks for a WorkloadPriorityClass
  the site does not allow in its namespace, one that does not exist, or one without a queue to apply it in;
  `queue-over-capacity` when the job's total request exceeds what its ClusterQueue can ever admit (nominal
  quota plus borrowing limit, in one flavor per resource group), so Kueue would keep it pending for ever.
- What the job asks: per pod the sum of its containers' requests (a limit stands in for a missing request,
  as Kubernetes defaults it), at least its largest init container's, times the pods of each replicated job
  (jobs.naming.pod_counts). The job's `resources_per_node` replaces the `node` container's resources of the
  trainer job, as Kueue v0.19.2 counts a TrainJob (recorded: a job asking only for nvidia.com/gpu reserves
  no cpu or memory; tests/jobs/supervision/kueue-fixtures/pending-insufficient-quota.json).
- Fits now: for each resource group of the ClusterQueue that covers a requested resource, some flavor has
  nominal quota minus reserved quota (status.flavorsReservation) at least the request for every requested
  resource of the group, tried in the group's order as Kueue's flavor assigner does. Borrowing from a cohort
  and flavors' node labels and taints are not counted: the message says so where a cohort exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, Literal

from jobs.naming import pod_counts
from jobs.spec import JobSpec, parse_quantity
from runtimes.reasons import TRAINER_ANCESTOR_LABEL, TRAINER_ANCESTOR_STEP, Reason
from runtimes.settings_checks import ALL_NAMESPACES as ALL_NAMESPACES  # re-exported: the queue choice's rules
from runtimes.settings_checks import allowed_priority_classes as allowed_priority_classes
from runtimes.settings_checks import default_queue

QUEUE_NOT_FOUND: Final = "queue-not-found"
PRIORITY_CLASS_NOT_ALLOWED: Final = "priority-class-not-allowed"
QUEUE_OVER_CAPACITY: Final = "queue-over-capacity"

NODE_CONTAINER: Final = "node"

QueueSource = Literal["job", "namespace-default"]


# --- choosing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueChoice:
    """The queue and priority class a job gets, before anything is read from the cluster."""

    queue: str | None
    source: QueueSource | None  # None without a queue
    priority_class: str | None

    @property
    def uses_kueue(self) -> bool:
        return bool(self.queue or self.priority_class)


def choose_queue(spec: JobSpec, default_queues: Mapping[str, str]) -> QueueChoice:
    if spec.queue_name:
        return QueueChoice(spec.queue_name, "job", spec.priority_class)
    queue = default_queue(spec.namespace, default_queues)
    return QueueChoice(queue, "namespace-default" if queue else None, spec.priority_class)


NO_QUEUE: Final = QueueChoice(None, None, None)


MULTIKUEUE_CONTROLLER: Final = "kueue.x-k8s.io/multikueue"


def admission_check_names(cluster_queue: Mapping[str, Any]) -> list[str]:
    """The AdmissionChecks a ClusterQueue names: spec.admissionChecks (names) and
    spec.admissionChecksStrategy.admissionChecks[].name, each once, in order. Pure."""
    spec = _m(cluster_queue.get("spec"))
    names = [str(n) for n in _list(spec.get("admissionChecks")) if n]
    strategy = _list(_m(spec.get("admissionChecksStrategy")).get("admissionChecks"))
    names += [str(_m(c).get("name") or "") for c in strategy]
    return list(dict.fromkeys(n for n in names if n))


def multikueue_config_name(check: Mapping[str, Any] | None) -> str | None:
    """The MultiKueueConfig an AdmissionCheck hands its workloads to, when it is MultiKueue's. Pure."""
    spec = _m((check or {}).get("spec"))
    params = _m(spec.get("parameters"))
    if spec.get("controllerName") != MULTIKUEUE_CONTROLLER or params.get("kind") != "MultiKueueConfig":
        return None
    return str(params.get("name") or "") or None


def multikueue_workers(config: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The MultiKueueCluster names a MultiKueueConfig lists (spec.clusters). Pure."""
    return tuple(str(c) for c in _list(_m((config or {}).get("spec")).get("clusters")) if c)


@dataclass(frozen=True)
class KueueInputs:
    """What planning knows about Kueue for one job: the choice, the site's allowed classes for the job's
    namespace, and the objects it read (None where one does not exist; not read when `installed` is False).
    `read` is False when planning read nothing (the namespace is not granted, which refuses the job
    anyway)."""

    choice: QueueChoice
    allowed_classes: tuple[str, ...] = ()
    read: bool = True
    installed: bool = True
    local_queue: Mapping[str, Any] | None = None
    cluster_queue: Mapping[str, Any] | None = None
    priority_class: Mapping[str, Any] | None = None  # the WorkloadPriorityClass object
    # MultiKueue: the worker clusters the queue's ClusterQueue dispatches to (its MultiKueueConfigs), and
    # those of them dispatch has no credentials for (so it cannot put the job's runtime there).
    workers: tuple[str, ...] = ()
    workers_without_credentials: tuple[str, ...] = ()


NO_KUEUE: Final = KueueInputs(choice=NO_QUEUE)


# --- quantities --------------------------------------------------------------------------------------


def _m(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _quantity(value: object) -> Decimal:
    """A quantity as a number; anything unreadable counts as 0 (the API server validated what it stores)."""
    try:
        return parse_quantity(str(value))
    except ValueError:
        return Decimal(0)


_BINARY_UNITS: Final = (
    ("Ei", 2**60),
    ("Pi", 2**50),
    ("Ti", 2**40),
    ("Gi", 2**30),
    ("Mi", 2**20),
    ("Ki", 2**10),
)


# Past this many digits a number is written with an exponent: no resource amount is that long, and Python
# refuses to write an int of more than 4,300 digits (a request of "1e999999" passes the syntax).
_PLAIN_DIGITS_MAX: Final = 30


def format_quantity(value: Decimal) -> str:
    """A number as a Kubernetes quantity: "200m", "4", "64Mi", "16Gi" (binary units for whole multiples of
    1024 from 1Ki up, millis for fractions), "1e999999" for one too long to write out."""
    if value.is_finite() and value != 0 and value.adjusted() >= _PLAIN_DIGITS_MAX:
        sign, digits, exponent = value.normalize().as_tuple()
        return f"{'-' if sign else ''}{''.join(map(str, digits))}e{exponent}"
    if value == value.to_integral_value():
        whole = int(value)
        for unit, size in _BINARY_UNITS:
            if whole >= size and whole % size == 0:
                return f"{whole // size}{unit}"
        return str(whole)
    millis = value * 1000
    if millis == millis.to_integral_value():
        return f"{int(millis)}m"
    return format(value.normalize(), "f")


def _container_requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
    resources = _m(container.get("resources"))
    limits = {str(k): _quantity(v) for k, v in _m(resources.get("limits")).items()}
    requests = {str(k): _quantity(v) for k, v in _m(resources.get("requests")).items()}
    return {**limits, **requests}  # a limit stands in for a missing request


def _add(total: dict[str, Decimal], more: Mapping[str, Decimal], times: int = 1) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, Decimal(0)) + amount * times


def _pod_requests(pod_spec: Mapping[str, Any], node_override: Mapping[str, Any] | None) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for container in _list(pod_spec.get("containers")):
        container = _m(container)
        if node_override is not None and container.get("name") == NODE_CONTAINER:
            container = {**container, "resources": node_override}
        _add(total, _container_requests(container))
    sidecars: dict[str, Decimal] = {}
    largest_init: dict[str, Decimal] = {}
    for init in _list(pod_spec.get("initContainers")):
        init = _m(init)
        requests = _container_requests(init)
        if init.get("restartPolicy") == "Always":  # a sidecar runs beside the containers
            _add(sidecars, requests)
        else:
            for name, amount in requests.items():
                largest_init[name] = max(largest_init.get(name, Decimal(0)), amount)
    _add(total, sidecars)
    for name, amount in largest_init.items():
        total[name] = max(total.get(name, Decimal(0)), amount)
    return total


def job_requests(spec: JobSpec, runtime: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the whole job asks of its ClusterQueue, per resource (zero amounts left out)."""
    jobs = _list(_m(_m(_m(runtime.get("spec")).get("template")).get("spec")).get("replicatedJobs"))
    counts = {name: replicas * pods for name, replicas, pods in pod_counts(runtime, spec.num_nodes)}
    override = spec.resources_per_node or None
    total: dict[str, Decimal] = {}
    for job in jobs:
        job = _m(job)
        template = _m(job.get("template"))
        step = _m(_m(template.get("metadata")).get("labels")).get(TRAINER_ANCESTOR_LABEL)
        pod_spec = _m(_m(_m(template.get("spec")).get("template")).get("spec"))
        per_pod = _pod_requests(pod_spec, override if step == TRAINER_ANCESTOR_STEP else None)
        _add(total, per_pod, counts.get(str(job.get("name", "")), 1))
    return {name: amount for name, amount in sorted(total.items()) if amount > 0}


# --- the ClusterQueue --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceQuota:
    flavor: str
    resource: str
    quota: Decimal  # nominal quota
    reserved: Decimal  # status.flavorsReservation: quota held by admitted and quota-reserving workloads
    usage: Decimal  # status.flavorsUsage: quota used by admitted workloads
    requested: Decimal | None  # what this job asks (None: it asks none of this resource)

    @property
    def free(self) -> Decimal:
        return max(self.quota - self.reserved, Decimal(0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "flavor": self.flavor,
            "resource": self.resource,
            "quota": format_quantity(self.quota),
            "reserved": format_quantity(self.reserved),
            "usage": format_quantity(self.usage),
            "free": format_quantity(self.free),
            "requested": None if self.requested is None else format_quantity(self.requested),
        }


def _status_amounts(status: Mapping[str, Any], key: str) -> dict[tuple[str, str], Decimal]:
    amounts: dict[tuple[str, str], Decimal] = {}
    for flavor in _list(status.get(key)):
        flavor = _m(flavor)
        for resource in _list(flavor.get("resources")):
            resource = _m(resource)
            amounts[(str(flavor.get("name")), str(resource.get("name")))] = _quantity(
                resource.get("total", 0)
            )
    return amounts


@dataclass(frozen=True)
class ResourceGroup:
    covered: tuple[str, ...]
    flavors: tuple[str, ...]


def cluster_queue_quotas(
    cluster_queue: Mapping[str, Any], requests: Mapping[str, Decimal]
) -> tuple[list[ResourceGroup], list[ResourceQuota]]:
    """The ClusterQueue's resource groups and, per flavor and resource, quota, reservation and usage."""
    spec, status = _m(cluster_queue.get("spec")), _m(cluster_queue.get("status"))
    reserved = _status_amounts(status, "flavorsReservation")
    usage = _status_amounts(status, "flavorsUsage")
    groups: list[ResourceGroup] = []
    quotas: list[ResourceQuota] = []
    for group in _list(spec.get("resourceGroups")):
        group = _m(group)
        names: list[str] = []
        for flavor in _list(group.get("flavors")):
            flavor = _m(flavor)
            fname = str(flavor.get("name"))
            names.append(fname)
            for resource in _list(flavor.get("resources")):
                resource = _m(resource)
                rname = str(resource.get("name"))
                quotas.append(
                    ResourceQuota(
                        flavor=fname,
                        resource=rname,
                        quota=_quantity(resource.get("nominalQuota", 0)),
                        reserved=reserved.get((fname, rname), Decimal(0)),
                        usage=usage.get((fname, rname), Decimal(0)),
                        requested=requests.get(rname),
                    )
                )
        groups.append(
            ResourceGroup(tuple(str(r) for r in _list(group.get("coveredResources"))), tuple(names))
        )
    return groups, quotas


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in _list(_m(obj.get("status")).get("conditions")):
        if _m(cond).get("type") == kind:
            return _m(cond)
    return None


def fits_now(
    cluster_queue: Mapping[str, Any], requests: Mapping[str, Decimal]
) -> tuple[bool, str, list[ResourceQuota]]:
    """Whether the job's requests fit the ClusterQueue's free quota now, why (or why not), and the quotas."""
    name = str(_m(cluster_queue.get("metadata")).get("name", ""))
    groups, quotas = cluster_queue_quotas(cluster_queue, requests)
    by_key = {(q.flavor, q.resource): q for q in quotas}
    active = _condition(cluster_queue, "Active")
    if active is not None and active.get("status") != "True":
        return (
            False,
            f"ClusterQueue {name} is not active: {active.get('reason')}: {active.get('message')}",
            quotas,
        )
    cohort = str(_m(cluster_queue.get("spec")).get("cohortName") or "")
    borrowing = f" (not counting what it may borrow in cohort {cohort})" if cohort else ""
    if not requests:
        return True, "the job requests no resources", quotas
    uncovered = [r for r in requests if not any(r in g.covered for g in groups)]
    if uncovered:
        return (
            False,
            f"ClusterQueue {name} has no quota for {', '.join(uncovered)}: Kueue cannot admit the job",
            quotas,
        )
    chosen: list[str] = []
    for group in groups:
        wanted = {r: a for r, a in requests.items() if r in group.covered}
        if not wanted:
            continue
        fitting = next(
            (
                f
                for f in group.flavors
                if all((q := by_key.get((f, r))) is not None and q.free >= a for r, a in wanted.items())
            ),
            None,
        )
        if fitting is not None:
            chosen.append(fitting)
            continue
        never = all(
            any((q := by_key.get((f, r))) is None or q.quota < a for r, a in wanted.items())
            for f in group.flavors
        )
        short = "; ".join(
            f"{r}: {format_quantity(a)} requested, {format_quantity(q.free)} of "
            f"{format_quantity(q.quota)} free in flavor {f}"
            for f in group.flavors
            for r, a in wanted.items()
            if (q := by_key.get((f, r))) is not None and q.free < a
        )
        if never:
            return (
                False,
                f"the job asks more than ClusterQueue {name}'s quota{borrowing}, so it can never be admitted "
                f"there: {short}",
                quotas,
            )
        return False, f"waits for quota in ClusterQueue {name}{borrowing}: {short}", quotas
    return True, f"fits ClusterQueue {name}'s free quota now (flavor {', '.join(chosen)})", quotas


# --- what a ClusterQueue can ever admit ---------------------------------------------------------------


def _capacities(cluster_queue: Mapping[str, Any]) -> dict[tuple[str, str], Decimal | None]:
    """Per (flavor, resource): the most the ClusterQueue can ever admit, nominal quota plus borrowing limit;
    None when it is unbounded (in a cohort with no borrowing limit: what it may borrow depends on the
    cohort's other queues). Outside a cohort nothing can be borrowed."""
    spec = _m(cluster_queue.get("spec"))
    in_cohort = bool(spec.get("cohortName") or spec.get("cohort"))
    out: dict[tuple[str, str], Decimal | None] = {}
    for group in _list(spec.get("resourceGroups")):
        for flavor in _list(_m(group).get("flavors")):
            flavor = _m(flavor)
            for resource in _list(flavor.get("resources")):
                resource = _m(resource)
                nominal = _quantity(resource.get("nominalQuota", 0))
                limit = resource.get("borrowingLimit")
                if not in_cohort:
                    most: Decimal | None = nominal
                elif limit is None:
                    most = None
                else:
                    most = nominal + _quantity(limit)
                out[(str(flavor.get("name")), str(resource.get("name")))] = most
    return out


def over_capacity_reasons(cluster_queue: Mapping[str, Any], requests: Mapping[str, Decimal]) -> list[Reason]:
    """`queue-over-capacity`: the job's total request exceeds what its ClusterQueue can ever admit, so Kueue
    would keep it pending for ever. Kueue puts all the resources of one resource group in one flavor (its
    flavor assigner), so per group: a resource no flavor can ever hold is one reason; resources that each
    fit some flavor but never together in one are one reason for the group. A resource the ClusterQueue has
    no quota for at all is a reason of its own. Every reason names the request and each flavor's most."""
    name = str(_m(cluster_queue.get("metadata")).get("name", ""))
    groups, _ = cluster_queue_quotas(cluster_queue, requests)
    most = _capacities(cluster_queue)
    reasons: list[Reason] = []

    def reason(text: str) -> None:
        reasons.append(Reason(QUEUE_OVER_CAPACITY, text, "queue_name"))

    def shown(flavor: str, resource: str) -> str:
        if (flavor, resource) not in most:
            return f"none in flavor {flavor}"
        amount = most[(flavor, resource)]
        return f"at most {'unbounded' if amount is None else format_quantity(amount)} in flavor {flavor}"

    def fits(flavor: str, resource: str, amount: Decimal) -> bool:
        if (flavor, resource) not in most:
            return False
        limit = most[(flavor, resource)]
        return limit is None or limit >= amount

    for resource, amount in requests.items():
        if not any(resource in g.covered for g in groups):
            reason(
                f"the job requests {resource} {format_quantity(amount)} in total, and ClusterQueue {name} "
                f"has no quota for {resource}: Kueue can never admit it"
            )
    for group in groups:
        wanted = {r: a for r, a in requests.items() if r in group.covered}
        if not wanted or not group.flavors:
            continue
        if any(all(fits(f, r, a) for r, a in wanted.items()) for f in group.flavors):
            continue
        alone = [r for r, a in wanted.items() if not any(fits(f, r, a) for f in group.flavors)]
        for resource in alone:
            places = "; ".join(shown(f, resource) for f in group.flavors)
            reason(
                f"the job requests {resource} {format_quantity(wanted[resource])} in total, more than "
                f"ClusterQueue {name} can ever admit (nominal quota plus borrowing limit): {places}"
            )
        if not alone:
            per_flavor = "; ".join(
                f"flavor {f}: "
                + ", ".join(f"{r} {shown(f, r).removesuffix(f' in flavor {f}')}" for r in wanted)
                for f in group.flavors
            )
            asked = ", ".join(f"{r} {format_quantity(a)}" for r, a in wanted.items())
            reason(
                f"the job requests {asked} in total, which no single flavor of ClusterQueue {name} can ever "
                f"hold together (Kueue assigns one flavor per resource group): {per_flavor}"
            )
    return reasons


# --- the plan's queue section ------------------------------------------------------------------------


@dataclass(frozen=True)
class QueuePlan:
    local_queue: str | None
    source: QueueSource | None
    cluster_queue: str | None
    priority_class: str | None
    priority: int | None  # the WorkloadPriorityClass's value
    requests: dict[str, Decimal] = field(default_factory=dict)
    quotas: tuple[ResourceQuota, ...] = ()
    fits_now: bool | None = None  # None: not known (no queue, or nothing read)
    fit_message: str = ""
    pending_workloads: int | None = None  # the ClusterQueue's status.pendingWorkloads
    workers: tuple[str, ...] = ()  # MultiKueue: the worker clusters the job may land on

    def to_dict(self) -> dict[str, Any]:
        return {
            "local_queue": self.local_queue,
            "source": self.source,
            "cluster_queue": self.cluster_queue,
            "priority_class": self.priority_class,
            "priority": self.priority,
            "requests": {k: format_quantity(v) for k, v in self.requests.items()},
            "quota": [q.to_dict() for q in self.quotas],
            "fits_now": self.fits_now,
            "fit_message": self.fit_message,
            "pending_workloads": self.pending_workloads,
            "workers": list(self.workers),
        }


def queue_plan(
    *, spec: JobSpec, runtime: Mapping[str, Any] | None, kueue: KueueInputs
) -> tuple[QueuePlan | None, list[Reason], list[str]]:
    """The plan's queue section, its refusal reasons and its warnings; (None, [], []) without Kueue."""
    choice = kueue.choice
    if not choice.uses_kueue:
        return None, [], []
    if not kueue.read:
        unread = QueuePlan(choice.queue, choice.source, None, choice.priority_class, None)
        return unread, [], []
    reasons: list[Reason] = []
    warnings: list[str] = []
    ns = spec.namespace
    where = (
        "the job's queue_name" if choice.source == "job" else "the namespace's default queue, a site setting"
    )
    if choice.queue and not kueue.installed:
        reasons.append(
            Reason(
                QUEUE_NOT_FOUND,
                "Kueue is not installed in the cluster (the API server does not serve "
                f"kueue.x-k8s.io/v1beta2), so LocalQueue {choice.queue} ({where}) cannot queue the job",
                "queue_name",
            )
        )
    elif choice.queue and kueue.local_queue is None:
        reasons.append(
            Reason(
                QUEUE_NOT_FOUND,
                f"LocalQueue {choice.queue} does not exist in namespace {ns} ({where})",
                "queue_name",
            )
        )

    priority: int | None = None
    if choice.priority_class:
        klass = choice.priority_class
        allowed = kueue.allowed_classes
        if klass not in allowed:
            listed = (
                f"the allowed ones are {', '.join(allowed)}"
                if allowed
                else "none is allowed there; the platform team allows them in the site settings"
            )
            reasons.append(
                Reason(
                    PRIORITY_CLASS_NOT_ALLOWED,
                    f"priority class {klass} is not allowed in namespace {ns}: {listed}",
                    "priority_class",
                )
            )
        elif not choice.queue:
            reasons.append(
                Reason(
                    PRIORITY_CLASS_NOT_ALLOWED,
                    f"priority class {klass} needs a Kueue queue: the job names no queue_name and namespace "
                    f"{ns} has no default queue",
                    "priority_class",
                )
            )
        elif kueue.installed and kueue.priority_class is None:
            reasons.append(
                Reason(
                    PRIORITY_CLASS_NOT_ALLOWED,
                    f"priority class {klass} is allowed in namespace {ns}, but no WorkloadPriorityClass "
                    f"{klass} exists in the cluster",
                    "priority_class",
                )
            )
        elif kueue.priority_class is not None:
            value = kueue.priority_class.get("value")
            priority = value if type(value) is int else None

    cluster_queue_name: str | None = None
    requests = job_requests(spec, runtime) if runtime is not None else {}
    quotas: list[ResourceQuota] = []
    fits: bool | None = None
    message = ""
    pending: int | None = None
    if kueue.local_queue is not None:
        cluster_queue_name = str(_m(kueue.local_queue.get("spec")).get("clusterQueue") or "") or None
        stop = str(_m(kueue.local_queue.get("spec")).get("stopPolicy") or "None")
        if stop != "None":
            warnings.append(
                f"LocalQueue {ns}/{choice.queue} is stopped (stopPolicy {stop}): nothing is admitted"
            )
        if kueue.cluster_queue is None:
            fits = False
            message = f"ClusterQueue {cluster_queue_name} of LocalQueue {ns}/{choice.queue} does not exist"
            warnings.append(f"{message}: Kueue keeps the job pending until it does")
        else:
            fits, message, quotas = fits_now(kueue.cluster_queue, requests)
            count = _m(kueue.cluster_queue.get("status")).get("pendingWorkloads")
            pending = count if type(count) is int else None
            if runtime is None:
                fits, message = None, "unknown: the runtime does not exist"
            else:
                reasons.extend(over_capacity_reasons(kueue.cluster_queue, requests))
    if kueue.workers_without_credentials:
        missing = ", ".join(kueue.workers_without_credentials)
        warnings.append(
            f"MultiKueue may place the job on worker cluster(s) {missing}, for which dispatch has no "
            "credentials (WORKER_KUBECONFIG_DIR): it cannot put the job's runtime there, so their Kueue "
            "refuses the job and it runs on the others"
        )
    return (
        QueuePlan(
            local_queue=choice.queue,
            source=choice.source,
            cluster_queue=cluster_queue_name,
            priority_class=choice.priority_class,
            priority=priority,
            requests=requests,
            quotas=tuple(quotas),
            fits_now=fits,
            fit_message=message,
            pending_workloads=pending,
            workers=kueue.workers,
        ),
        reasons,
        warnings,
    )
