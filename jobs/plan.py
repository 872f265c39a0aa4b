"""The plan: what starting a job would do, computed without creating anything. Pure.

build_plan judges the runtime (runtimes.rules), adds the checks that need the whole job (start-only
reasons), and builds the exact objects start would create: a TrainingRuntime copy of the runtime (so a later
edit of the original changes nothing for this job) carrying the execution identity, and the TrainJob that
runs on the copy. It also says which image each container would run and, when Kueue queues the job, its
LocalQueue, ClusterQueue, quota and whether it fits now (jobs.queueing). A refused plan is still complete
(objects included when the runtime exists), so the user sees what would have been created.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from dispatch_site.names import MANAGED_BY, MANAGED_BY_LABEL
from jobs.naming import (
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    POD_NAME_LIMIT,
    pod_names,
    runtime_copy_name,
    trainjob_name,
)
from jobs.podresources import RESOURCES_INVALID, resources_reasons
from jobs.queueing import (
    NO_KUEUE,
    PRIORITY_CLASS_NOT_ALLOWED,
    QUEUE_NOT_FOUND,
    QUEUE_OVER_CAPACITY,
    KueueInputs,
    QueuePlan,
    queue_plan,
)
from jobs.spec import CLUSTER_TRAINING_RUNTIME, JobSpec
from runtimes.reasons import PUBLISH_INIT_CONTAINER, AllowListMiss, Capability, Reason, Review, SiteRules
from runtimes.rules import check_runtime, find_trainer_job

API_VERSION: Final = "trainer.kubeflow.org/v1alpha1"
API_GROUP: Final = "trainer.kubeflow.org"
NODE: Final = "node"
LAUNCHER: Final = "launcher"

# Start-only reason codes (DESIGN.md): they need the whole job, not just the runtime.
NAMESPACE_NOT_GRANTED: Final = "namespace-not-granted"
PROCS_PER_NODE_UNSUPPORTED: Final = "procs-per-node-unsupported"
NAME_TOO_LONG: Final = "name-too-long"
# The job's place in Kueue (jobs.queueing decides them), and pod templates the Job API would refuse
# (jobs.podresources): never waived.
START_ONLY_CODES: Final = (
    NAMESPACE_NOT_GRANTED,
    PROCS_PER_NODE_UNSUPPORTED,
    NAME_TOO_LONG,
    QUEUE_NOT_FOUND,
    PRIORITY_CLASS_NOT_ALLOWED,
    RESOURCES_INVALID,
    QUEUE_OVER_CAPACITY,
)

# The runtimePatches manager Kueue owns on a TrainJob (list-map key): dispatch never writes a patch under it.
KUEUE_MANAGER: Final = "kueue.x-k8s.io/manager"

# The identity env. Rank and JobSet restart attempt come from the downward API, so every pod reads its own.
ENV_JOB: Final = "DISPATCH_JOB"
ENV_ATTEMPT: Final = "DISPATCH_ATTEMPT"
ENV_RANK: Final = "DISPATCH_RANK"
ENV_RESTART_ATTEMPT: Final = "DISPATCH_RESTART_ATTEMPT"
RANK_FIELD_PATH: Final = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
RESTART_ATTEMPT_FIELD_PATH: Final = "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"

# PR #4301 ships in the first Trainer release after v2.3.x: from 2.4 the MPI plugin sets the TrainJob image
# on the launcher and the nodes instead of only on the trainer-ancestor job.
MPI_IMAGE_ON_NODES_SINCE: Final = (2, 4)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+][0-9A-Za-z.+-]*)?$")

ImageSource = Literal["job", "runtime"]


@dataclass(frozen=True)
class ImagePlacement:
    replicated_job: str
    container: str
    image: str | None  # None: neither the runtime nor the job names one
    source: ImageSource

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicated_job": self.replicated_job,
            "container": self.container,
            "image": self.image,
            "source": self.source,
        }


@dataclass(frozen=True)
class PlanNames:
    train_job: str
    training_runtime: str
    longest_pod_name: str | None  # None without a runtime (or one with no replicated jobs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "train_job": self.train_job,
            "training_runtime": self.training_runtime,
            "longest_pod_name": self.longest_pod_name,
        }


@dataclass(frozen=True)
class Plan:
    refused: bool
    reasons: tuple[Reason, ...]  # the rule checker's, then the start-only ones; waived ones included
    capabilities: tuple[Capability, ...]
    identity_warnings: tuple[str, ...]
    warnings: tuple[str, ...]
    training_runtime: dict[str, Any] | None  # None when the runtime does not exist
    train_job: dict[str, Any] | None
    images: tuple[ImagePlacement, ...]
    names: PlanNames
    queue: QueuePlan | None = None  # None: Kueue plays no part (no queue, no priority class)

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(r.code for r in self.reasons)

    def to_dict(self, *, copy_objects: bool = True) -> dict[str, Any]:
        """As plain data. copy_objects=False shares the object bodies: only for a caller that stores or
        serialises the dict at once and never edits it (start, recording the plan)."""
        objects = None
        if self.training_runtime is not None and self.train_job is not None:
            # Copies: the plan is frozen, and a caller editing the dict must not change it.
            clone = copy.deepcopy if copy_objects else (lambda value: value)
            objects = {
                "training_runtime": clone(self.training_runtime),
                "train_job": clone(self.train_job),
            }
        return {
            "refused": self.refused,
            "reasons": [r.to_dict() for r in self.reasons],
            "capabilities": [c.to_dict() for c in self.capabilities],
            "identity_warnings": list(self.identity_warnings),
            "warnings": list(self.warnings),
            "objects": objects,
            "images": [i.to_dict() for i in self.images],
            "names": self.names.to_dict(),
            "queue": self.queue.to_dict() if self.queue is not None else None,
        }


# --- helpers over plain data ----------------------------------------------------------------------


def _m(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _plain(value: Any) -> Any:
    """A deep copy as plain dicts and lists: never aliases (or mutates) the caller's runtime."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _child(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """parent[key] as a dict, created when absent (or not a mapping, which the rules already report)."""
    value = parent.get(key)
    if not isinstance(value, dict):
        value = {}
        parent[key] = value
    return value


def _replicated_jobs(spec: Mapping[str, Any]) -> list[Any]:
    jobs = _m(_m(spec.get("template")).get("spec")).get("replicatedJobs")
    return list(jobs) if isinstance(jobs, list | tuple) else []


def _pod_spec(job: Mapping[str, Any]) -> Mapping[str, Any]:
    return _m(_m(_m(_m(job.get("template")).get("spec")).get("template")).get("spec"))


def _containers(pod_spec: Mapping[str, Any], key: str = "containers") -> list[Mapping[str, Any]]:
    items = pod_spec.get(key)
    return [c for c in items if isinstance(c, Mapping)] if isinstance(items, list | tuple) else []


def parse_trainer_version(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of "v2.3.0", "2.4.0", "v2.4.0-rc.1". ValueError otherwise: the installed
    Trainer version decides image placement, so a misconfigured one must not be guessed."""
    match = _VERSION.match(version.strip())
    if not match:
        raise ValueError(f"Trainer version {version!r} is not a release version like v2.3.0 or 2.4.0-rc.1")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def mpi_image_on_nodes(trainer_version: str) -> bool:
    """Whether this Trainer sets the TrainJob image on the MPI nodes too (PR #4301, after v2.3.x)."""
    return parse_trainer_version(trainer_version)[:2] >= MPI_IMAGE_ON_NODES_SINCE


def identity_env(job_id: str, attempt: int) -> list[dict[str, Any]]:
    """The execution identity (job, A, J, rank) as container env."""
    return [
        {"name": ENV_JOB, "value": job_id},
        {"name": ENV_ATTEMPT, "value": str(attempt)},
        {"name": ENV_RANK, "valueFrom": {"fieldRef": {"fieldPath": RANK_FIELD_PATH}}},
        {"name": ENV_RESTART_ATTEMPT, "valueFrom": {"fieldRef": {"fieldPath": RESTART_ATTEMPT_FIELD_PATH}}},
    ]


def upsert_env(current: object, entries: list[dict[str, Any]]) -> list[Any]:
    """current with entries set: a same-name entry is replaced in place (later duplicates dropped), a new
    one appended. Replacing matters: a runtime stating DISPATCH_ATTEMPT must not shadow ours."""
    by_name = {e["name"]: e for e in entries}
    result: list[Any] = []
    placed: set[str] = set()
    for item in current if isinstance(current, list) else []:
        name = item.get("name") if isinstance(item, Mapping) else None
        if isinstance(name, str) and name in by_name:
            if name not in placed:
                result.append(by_name[name])
                placed.add(name)
            continue
        result.append(item)
    result.extend(e for e in entries if e["name"] not in placed)
    return result


# --- the objects ----------------------------------------------------------------------------------


def _dispatch_labels(label_domain: str, job_id: str, attempt: int) -> dict[str, str]:
    return {f"{label_domain}/job": job_id, f"{label_domain}/attempt": str(attempt)}


def _source_ref(spec: JobSpec) -> str:
    ref = spec.runtime
    if ref.kind == CLUSTER_TRAINING_RUNTIME:
        return f"{ref.kind}/{ref.name}"
    return f"{ref.kind}/{ref.namespace or spec.namespace}/{ref.name}"


def _source_labels(runtime: Mapping[str, Any]) -> dict[str, str]:
    labels = _m(_m(runtime.get("metadata")).get("labels"))
    return {str(k): str(v) for k, v in labels.items()}


def build_training_runtime(
    *,
    spec: JobSpec,
    runtime: Mapping[str, Any],
    rules: SiteRules,
    job_id: str,
    attempt: int,
    label_domain: str,
) -> dict[str, Any]:
    """The TrainingRuntime copy the TrainJob runs on, with the identity published and labels on the pods
    (the Trainer does not copy TrainJob labels to pods, so the copy's pod templates must carry them)."""
    name = runtime_copy_name(trainjob_name(job_id, attempt))
    ids = _dispatch_labels(label_domain, job_id, attempt)
    copy_spec: dict[str, Any] = _plain(_m(runtime.get("spec")))

    jobset_template = _child(copy_spec, "template")
    _child(_child(jobset_template, "metadata"), "labels").update(ids)
    # An attempt ends by deleting its TrainJob, never its JobSet: the Trainer (v2.3.0) recreates the JobSet of
    # a Failed TrainJob once a JobSet TTL removes it (status-facts §12). The copy sets no JobSet TTL.
    jobset_spec = jobset_template.get("spec")
    if isinstance(jobset_spec, dict):
        jobset_spec.pop("ttlSecondsAfterFinished", None)
    for job in _replicated_jobs(copy_spec):
        job_template = _m(job).get("template")
        if isinstance(job_template, dict):
            # On the Jobs too, so status can list an execution's Jobs by our labels.
            _child(_child(job_template, "metadata"), "labels").update(ids)
        pod_template = _m(_m(job_template).get("spec")).get("template")
        if isinstance(pod_template, dict):
            _child(_child(pod_template, "metadata"), "labels").update(ids)

    found = find_trainer_job({"spec": copy_spec})
    if found is not None:
        pod_spec = _pod_spec(found[1])
        key, target = (
            ("initContainers", rules.publish_container)
            if rules.publish_via == PUBLISH_INIT_CONTAINER
            else ("containers", NODE)
        )
        for container in _containers(pod_spec, key):
            # A missing target is a refusal reason (no-node-container / no-publish-init-container).
            if container.get("name") == target and isinstance(container, dict):
                container["env"] = upsert_env(container.get("env"), identity_env(job_id, attempt))
                break

    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingRuntime",
        "metadata": {
            "name": name,
            "namespace": spec.namespace,
            # The source runtime's labels come along (e.g. trainer.kubeflow.org/framework, or the Trainer's
            # webhook-validation opt-out the original was admitted with); ours win.
            "labels": {**_source_labels(runtime), **ids, MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {f"{label_domain}/source-runtime": _source_ref(spec)},
        },
        "spec": copy_spec,
    }


def build_train_job(
    *,
    spec: JobSpec,
    job_id: str,
    attempt: int,
    label_domain: str,
    queue_name: str | None = None,
    priority_class: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The TrainJob on the copy, and warnings (a user label that dispatch's own labels override). The Kueue
    labels come from the queue and priority class the plan chose (jobs.queueing), never from the spec alone,
    and dispatch writes no runtimePatch at all (Kueue owns the one under KUEUE_MANAGER)."""
    name = trainjob_name(job_id, attempt)
    ours = {**_dispatch_labels(label_domain, job_id, attempt), MANAGED_BY_LABEL: MANAGED_BY}
    if queue_name:
        ours[KUEUE_QUEUE_LABEL] = queue_name
        if priority_class:
            ours[KUEUE_PRIORITY_LABEL] = priority_class
    warnings = [
        f"label {key}={spec.labels[key]!r} is replaced by dispatch's {key}={value!r}"
        for key, value in ours.items()
        if key in spec.labels and spec.labels[key] != value
    ]
    metadata: dict[str, Any] = {"name": name, "namespace": spec.namespace, "labels": {**spec.labels, **ours}}
    if spec.display_name:
        metadata["annotations"] = {f"{label_domain}/display-name": spec.display_name}

    trainer: dict[str, Any] = {}
    if spec.image:
        trainer["image"] = spec.image
    if spec.command:
        trainer["command"] = list(spec.command)
    if spec.args:
        trainer["args"] = list(spec.args)
    if spec.env:
        # User env only: the identity is published in the runtime copy, where the user cannot override it.
        trainer["env"] = [{"name": k, "value": v} for k, v in spec.env]
    if spec.num_nodes is not None:
        trainer["numNodes"] = spec.num_nodes
    if spec.procs_per_node is not None:
        trainer["numProcPerNode"] = spec.procs_per_node
    if spec.resources_per_node:
        trainer["resourcesPerNode"] = {k: dict(v) for k, v in spec.resources_per_node.items()}

    job_spec: dict[str, Any] = {
        "runtimeRef": {"apiGroup": API_GROUP, "kind": "TrainingRuntime", "name": runtime_copy_name(name)},
        "trainer": trainer,
    }
    if spec.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if queue_name:
        job_spec["suspend"] = True  # Kueue admits (unsuspends) it
    return {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": job_spec}, warnings


# --- images ---------------------------------------------------------------------------------------


def place_images(
    runtime: Mapping[str, Any], image: str, trainer_version: str
) -> tuple[list[ImagePlacement], list[str]]:
    """Which image each container of each replicated job would run, and warnings.

    Up to v2.3.x the Trainer sets the TrainJob image on container `node` of the trainer-ancestor job, for
    every framework. From 2.4 (PR #4301) the MPI plugin sets it on container `node` of the replicated jobs
    named `launcher` and `node` (looked up by name) instead; other frameworks are unchanged.
    """
    spec = _m(runtime.get("spec"))
    jobs = _replicated_jobs(spec)
    mpi = isinstance(_m(spec.get("mlPolicy")).get("mpi"), Mapping)
    targets: set[int]
    if mpi and mpi_image_on_nodes(trainer_version):
        targets = {i for i, job in enumerate(jobs) if _m(job).get("name") in (LAUNCHER, NODE)}
    else:
        found = find_trainer_job(runtime)
        targets = {found[0]} if found is not None else set()

    placements: list[ImagePlacement] = []
    for index, job in enumerate(jobs):
        job_name = str(_m(job).get("name", ""))
        for container in _containers(_pod_spec(_m(job))):
            cname = str(container.get("name", ""))
            own = container.get("image")
            if image and index in targets and cname == NODE:
                placements.append(ImagePlacement(job_name, cname, image, "job"))
            else:
                placements.append(
                    ImagePlacement(job_name, cname, own if isinstance(own, str) else None, "runtime")
                )

    warnings: list[str] = []
    if mpi:
        # mpirun on the launcher starts the processes on the nodes: they must ship the same MPI version.
        node_image = {p.replicated_job: p.image for p in placements if p.container == NODE}
        launcher, nodes = node_image.get(LAUNCHER), node_image.get(NODE)
        if LAUNCHER in node_image and NODE in node_image and launcher != nodes:
            warnings.append(
                f"mismatched MPI versions: with Trainer {trainer_version} the MPI launcher runs image "
                f"{launcher!r} and the nodes run {nodes!r}; mpirun on the launcher starts the processes "
                "on the nodes, so both must ship the same application and MPI versions"
            )
    return placements, warnings


# --- start-only checks ----------------------------------------------------------------------------


def start_reasons(
    *, spec: JobSpec, runtime: Mapping[str, Any] | None, namespace_granted: bool, train_job_name: str
) -> tuple[list[Reason], str | None]:
    """The reasons only start checks (they need the whole job), and the longest pod name."""
    reasons: list[Reason] = []
    if not namespace_granted:
        reasons.append(
            Reason(
                NAMESPACE_NOT_GRANTED,
                f"namespace {spec.namespace!r} is not granted: dispatch may not create jobs there for you",
                "namespace",
            )
        )
    if runtime is None:
        return reasons, None  # runtime-not-found says the rest

    ml_policy = _m(_m(runtime.get("spec")).get("mlPolicy"))
    if spec.procs_per_node is not None and not isinstance(ml_policy.get("torch"), Mapping):
        others = [k for k in ml_policy if k != "numNodes"]
        has = f"mlPolicy.{others[0]}" if others else "no ML policy"
        reasons.append(
            Reason(
                PROCS_PER_NODE_UNSUPPORTED,
                f"procs_per_node is {spec.procs_per_node}, but runtime {_source_ref(spec)} has {has} "
                "(not mlPolicy.torch), so the Trainer would ignore it",
                "procs_per_node",
            )
        )

    candidates = pod_names(train_job_name, runtime, spec.num_nodes)
    longest = max(candidates, key=lambda c: len(c[1])) if candidates else None
    if longest is not None and len(longest[1]) > POD_NAME_LIMIT:
        rjob, pod = longest
        reasons.append(
            Reason(
                NAME_TOO_LONG,
                f"the JobSet would create pod {pod!r} ({len(pod)} characters; the limit is "
                f"{POD_NAME_LIMIT}): the TrainJob name {train_job_name!r} plus replicated job {rjob!r} and "
                "its highest indexes is too long; use a runtime with a shorter replicated job name or "
                "fewer nodes",
                "num_nodes" if spec.num_nodes is not None else "runtime",
            )
        )
    return reasons, longest[1] if longest is not None else None


# --- the plan -------------------------------------------------------------------------------------


def build_plan(
    *,
    spec: JobSpec,
    runtime: Mapping[str, Any] | None,
    rules: SiteRules,
    allow_listed: bool | AllowListMiss | None,
    namespace_granted: bool,
    review: Review | None = None,
    job_id: str,
    attempt: int,
    label_domain: str,
    trainer_version: str,
    kueue: KueueInputs | None = None,
) -> Plan:
    """Everything start would do for (job, attempt) on this runtime. ValueError for a Trainer version that
    is not a release version (a site misconfiguration), and for a job that asks for a queue or a priority
    class planned without `kueue` (what planning read of Kueue: jobs.queueing.KueueInputs)."""
    parse_trainer_version(trainer_version)  # fail on bad configuration even when no MPI runtime needs it
    if kueue is None:
        if spec.queue_name or spec.priority_class:
            raise ValueError(
                "a job with a queue_name or priority_class is planned with what was read of Kueue"
            )
        kueue = NO_KUEUE
    tj_name = trainjob_name(job_id, attempt)
    verdict = check_runtime(
        runtime, rules=rules, allow_listed=allow_listed, ref=_source_ref(spec), review=review
    )
    extra, longest = start_reasons(
        spec=spec, runtime=runtime, namespace_granted=namespace_granted, train_job_name=tj_name
    )
    if runtime is not None:
        extra += resources_reasons(spec, runtime)
    queue, queue_reasons, queue_warnings = queue_plan(spec=spec, runtime=runtime, kueue=kueue)
    extra = [*extra, *queue_reasons]
    reasons = (*verdict.reasons, *extra)

    warnings: list[str] = list(queue_warnings)
    training_runtime = train_job = None
    images: list[ImagePlacement] = []
    if runtime is not None:
        training_runtime = build_training_runtime(
            spec=spec, runtime=runtime, rules=rules, job_id=job_id, attempt=attempt, label_domain=label_domain
        )
        train_job, label_warnings = build_train_job(
            spec=spec,
            job_id=job_id,
            attempt=attempt,
            label_domain=label_domain,
            queue_name=kueue.choice.queue,
            priority_class=kueue.choice.priority_class,
        )
        images, image_warnings = place_images(runtime, spec.image, trainer_version)
        warnings = [*image_warnings, *label_warnings, *warnings]

    return Plan(
        refused=verdict.refused or any(not r.waived for r in extra),
        reasons=reasons,
        capabilities=verdict.capabilities,
        identity_warnings=(verdict.identity_warning,) if verdict.identity_warning else (),
        warnings=tuple(warnings),
        training_runtime=training_runtime,
        train_job=train_job,
        images=tuple(images),
        names=PlanNames(
            train_job=tj_name, training_runtime=runtime_copy_name(tj_name), longest_pod_name=longest
        ),
        queue=queue,
    )
