"""Is dispatch's admission guard in the cluster: each ValidatingAdmissionPolicy of deploy/guard present, bound
(a binding that denies), and which managed namespaces (labelled dispatch.dev/managed=true) it covers; and its
one MutatingAdmissionPolicy present and bound.

The namespaces looked at are the ones dispatch submits to (every namespace granted to a user or group), each
read by name: dispatch's ServiceAccount may get a namespace, never list them. A granted namespace without the
managed label is a warning too: the guard does not hold where it is not asked to.

The guard is what keeps a namespace member from forging a rank, a Job or a controller's Event
(docs/security.md); a cluster without it is a visible warning (`manage.py check_cluster`, the overview's
cluster box, /readyz for the platform role), never a silent gap. Five list calls read what is there;
`guard_report` decides (pure).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kubernetes import client

from cluster.calls import call_api, core, target
from cluster.client import api_client
from cluster.errors import ClusterError, NotFound
from cluster.reads import raw_list
from dispatch_site.roles import namespaces_granted_to_anyone

MANAGED_LABEL: Final = "dispatch.dev/managed"
# Set by the guard's MutatingAdmissionPolicy (deploy/guard/kueue.yaml, policy 4) on a dispatch TrainJob the
# first time Kueue resumes it: the cluster's mark, not dispatch's content (jobs.objects leaves it out of
# adoption).
RESUMED_ANNOTATION: Final = "guard.dispatch.dev/resumed"
MANAGED_SELECTOR: Final = f"{MANAGED_LABEL}=true"


@dataclass(frozen=True)
class Door:
    """One policy of deploy/guard: its name, its binding's name, and what it guards."""

    policy: str
    binding: str
    guards: str
    mutating: bool = False  # a MutatingAdmissionPolicy (its binding has no validationActions to deny with)


# deploy/guard, policy by policy (tests/deploy/test_guard_check.py keeps the two the same). A platform adapts
# the guard through each policy's variables (who dispatch and its controllers are), never by renaming it:
# docs/security.md.
DOORS: Final[tuple[Door, ...]] = (
    Door(
        "dispatch-trainjobs-through-dispatch",
        "dispatch-trainjobs-through-dispatch",
        "TrainJobs are created only by dispatch's worker (and sessions' by its web)",
    ),
    Door(
        "dispatch-managed-objects",
        "dispatch-managed-objects",
        "dispatch's TrainJobs and runtime copies are changed only by dispatch and the named controllers",
    ),
    Door(
        "dispatch-pods-from-the-job-controller",
        "dispatch-pods-from-the-job-controller",
        "a job's pods are created only by the Job controller",
    ),
    Door(
        "dispatch-jobsets-and-jobs-from-their-controllers",
        "dispatch-jobsets-and-jobs-from-their-controllers",
        "dispatch's JobSets and Jobs are created only by the Trainer and JobSet controllers",
    ),
    Door(
        "dispatch-evidence-from-its-reporter",
        "dispatch-evidence-from-its-reporter",
        "an Event in a system controller's name is written only by that controller",
    ),
    Door(
        "dispatch-ended-attempts-stay-ended",
        "dispatch-ended-attempts-stay-ended",
        "no pod of an attempt dispatch ended (fenced) is created again",
    ),
    Door(
        "dispatch-web-enters-only-session-pods",
        "dispatch-web-enters-only-session-pods",
        "dispatch's web runs commands only in session pods, never in a job's rank",
    ),
    Door(
        "dispatch-kueue-admits-an-attempt-once",
        "dispatch-kueue-admits-an-attempt-once",
        "Kueue does not admit an evicted attempt's Workload again",
    ),
    Door(
        "dispatch-kueue-marks-a-resumed-attempt",
        "dispatch-kueue-marks-a-resumed-attempt",
        "the API server marks a dispatch TrainJob the first time it is resumed",
        mutating=True,
    ),
    Door(
        "dispatch-kueue-resumes-an-attempt-once",
        "dispatch-kueue-resumes-an-attempt-once",
        "Kueue does not resume an attempt's TrainJob a second time, even under a Workload made again",
    ),
)


@dataclass(frozen=True)
class DoorState:
    door: Door
    policy_present: bool
    binding_present: bool
    denies: bool  # the binding's validationActions include Deny (Warn or Audit alone guard nothing)
    covered: tuple[str, ...]  # the managed namespaces the binding (and the policy's constraints) select
    uncovered: tuple[str, ...]  # the managed namespaces it does not

    @property
    def ok(self) -> bool:
        return self.policy_present and self.binding_present and self.denies and not self.uncovered

    @property
    def problem(self) -> str:
        """What is missing, in words ("" when the door is guarded everywhere dispatch manages)."""
        door = self.door
        if not self.policy_present:
            return f"policy {door.policy} is missing: nothing checks that {door.guards}"
        if not self.binding_present:
            return f"binding {door.binding} is missing: policy {door.policy} is installed but holds nowhere"
        if not self.denies:
            return (
                f"binding {door.binding} does not deny (validationActions without Deny): that {door.guards} "
                "is not enforced"
            )
        if self.uncovered:
            return (
                f"binding {door.binding} does not cover the managed namespace(s) "
                f"{', '.join(self.uncovered)}: there, nothing checks that {door.guards}"
            )
        return ""


@dataclass(frozen=True)
class GuardReport:
    doors: tuple[DoorState, ...]
    managed: tuple[str, ...]  # the namespaces looked at that are labelled dispatch.dev/managed=true
    unmanaged: tuple[str, ...] = ()  # the namespaces looked at that are not
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.warnings

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "managed_namespaces": list(self.managed),
            "unmanaged_namespaces": list(self.unmanaged),
            "warnings": list(self.warnings),
            "policies": [
                {
                    "policy": s.door.policy,
                    "binding": s.door.binding,
                    "guards": s.door.guards,
                    "present": s.policy_present,
                    "bound": s.binding_present and s.denies,
                    "covers": list(s.covered),
                    "ok": s.ok,
                }
                for s in self.doors
            ],
        }


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Does a Kubernetes label selector (matchLabels, matchExpressions) select these labels? An absent
    selector selects everything, like the API server's. Pure."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator = expression.get("key"), expression.get("operator")
        values = set(expression.get("values") or ())
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _namespace_selector(obj: Mapping[str, Any], where: str) -> Mapping[str, Any] | None:
    spec = obj.get("spec") or {}
    scope = spec.get(where) or {}
    selector = scope.get("namespaceSelector")
    return selector if isinstance(selector, Mapping) else None


def guard_report(
    *,
    policies: Sequence[Mapping[str, Any]],
    bindings: Sequence[Mapping[str, Any]],
    namespaces: Sequence[Mapping[str, Any]],
    doors: Sequence[Door] = DOORS,
) -> GuardReport:
    """Each door's policy and binding as the cluster holds them, and which of the managed namespaces among
    `namespaces` each covers (the binding's matchResources and the policy's matchConstraints namespace
    selectors, both). A namespace among them without the managed label is named: the guard holds nowhere it
    is not asked to. Pure."""
    by_policy = {_name(p): p for p in policies}
    by_binding = {_name(b): b for b in bindings}
    labels_of = {_name(n): dict((n.get("metadata") or {}).get("labels") or {}) for n in namespaces}
    managed = {name: labels for name, labels in labels_of.items() if labels.get(MANAGED_LABEL) == "true"}
    names = tuple(sorted(managed))
    unmanaged = tuple(sorted(set(labels_of) - set(managed)))
    states = []
    for door in doors:
        policy = by_policy.get(door.policy)
        binding = by_binding.get(door.binding)
        bound = binding is not None and (binding.get("spec") or {}).get("policyName") == door.policy
        denies = bound and (
            door.mutating or "Deny" in ((binding or {}).get("spec") or {}).get("validationActions", ())
        )
        covered: tuple[str, ...] = ()
        if policy is not None and binding is not None and bound:
            covered = tuple(
                ns
                for ns in names
                if selector_matches(_namespace_selector(binding, "matchResources"), managed[ns])
                and selector_matches(_namespace_selector(policy, "matchConstraints"), managed[ns])
            )
        uncovered = tuple(ns for ns in names if ns not in covered) if policy and bound else ()
        states.append(DoorState(door, policy is not None, bound, bool(denies), covered, uncovered))
    warnings = [s.problem for s in states if s.problem]
    if unmanaged:
        warnings.append(
            f"namespace(s) {', '.join(unmanaged)} are granted in dispatch but not labelled "
            f"{MANAGED_SELECTOR}: there the guard does not hold; label them"
        )
    if not labels_of:
        warnings.append(
            'no namespace is granted in dispatch (or only "*", which names none): the guard\'s coverage is '
            "not known; grant the namespaces dispatch submits to"
        )
    return GuardReport(tuple(states), names, unmanaged, tuple(warnings))


def read_guard(namespaces: Sequence[str] | None = None) -> GuardReport:
    """The guard as the cluster holds it now, over `namespaces` (default: every namespace granted in
    dispatch), each read by name; one that does not exist is left out. ClusterError when it cannot be
    read."""
    admission = client.AdmissionregistrationV1Api(api_client())
    policies = raw_list(
        "ValidatingAdmissionPolicies",
        "ValidatingAdmissionPolicy",
        admission.list_validating_admission_policy,
    )
    bindings = raw_list(
        "ValidatingAdmissionPolicyBindings",
        "ValidatingAdmissionPolicyBinding",
        admission.list_validating_admission_policy_binding,
    )
    # The guard's one mutating policy (deploy/guard/kueue.yaml: the mark a second resume is refused on).
    policies += raw_list(
        "MutatingAdmissionPolicies", "MutatingAdmissionPolicy", admission.list_mutating_admission_policy
    )
    bindings += raw_list(
        "MutatingAdmissionPolicyBindings",
        "MutatingAdmissionPolicyBinding",
        admission.list_mutating_admission_policy_binding,
    )
    found = []
    for name in namespaces_granted_to_anyone() if namespaces is None else namespaces:
        try:
            namespace = call_api(target("Namespace", None, name), core().read_namespace, name)
        except NotFound:
            continue
        found.append({"metadata": {"name": name, "labels": dict(namespace.metadata.labels or {})}})
    return guard_report(policies=policies, bindings=bindings, namespaces=found)


# The overview's cluster box is polled by every open page: its answer is reused this long.
CACHE_SECONDS: Final = 15.0
_cache: dict[str, tuple[float, dict[str, Any]]] = {}
_cache_lock = threading.Lock()


def check_guard(max_age: float = 0.0) -> dict[str, Any]:
    """The guard as a check: {"ok", "managed_namespaces", "warnings", "policies"}, or {"ok": False, "error"}
    when the cluster cannot be read. `max_age` > 0 reuses an answer that recent."""
    now = time.monotonic()
    if max_age > 0:
        with _cache_lock:
            cached = _cache.get("guard")
        if cached is not None and now - cached[0] < max_age:
            return cached[1]
    try:
        answer = read_guard().as_dict()
    except ClusterError as exc:
        answer = {"ok": False, "error": f"the admission guard could not be read: {exc}"}
    except Exception as exc:  # the grants could not be read (the database): a check never raises
        answer = {
            "ok": False,
            "error": f"the admission guard could not be checked: {type(exc).__name__}: {exc}",
        }
    with _cache_lock:
        _cache["guard"] = (now, answer)
    return answer


def forget_cached_guard() -> None:
    with _cache_lock:
        _cache.clear()
