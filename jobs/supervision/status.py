"""Status derivation: one execution's observed objects -> state, typed cause, evidence. Pure.

Input is plain data as the API server returns it (a TrainJob, its JobSet, Jobs, Pods, Events, the Nodes
they ran on, and Kueue Workloads when installed), plus what earlier cycles saw of pods that are gone now
(`memory`):
a preempted, evicted or node-lost pod often vanishes within a second, and its last seen state is the evidence.

The precedence follows `shared/reference/status-facts.md` §10:
- aggregate reasons (Job BackoffLimitExceeded, JobSet/TrainJob FailedJobs) are never the cause by themselves;
  the chain is followed to the failed pods, which are classified one by one;
- per pod: DisruptionTarget > pod status.reason > OOMKilled > config reasons > image pull > a non-zero exit;
- the first rank to fail is the cause, the others are evidence; `unknown-failure` only when nothing explains
  a failure, with the raw conditions kept;
- no-capacity and image-pull are waiting causes: the execution stays `queued` until a threshold, then fails;
- identity findings group pods by (attempt A, JobSet restart-attempt J, rank): a container restarted in place,
  or two pods for one rank within one (A, J), is a rank that ran twice under one identity.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from dispatch_site.names import DEFAULT_LABEL_DOMAIN
from jobs.naming import KUEUE_QUEUE_LABEL, kueue_mark_key
from jobs.waits import Thresholds, parse_time

# States and causes as strings (the values of jobs.models.JobState / Cause; this module imports no Django).
QUEUED: Final = "queued"
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"

PREEMPTED: Final = "preempted"
NODE_LOST: Final = "node-lost"
OOM: Final = "oom"
TIMEOUT: Final = "timeout"
NO_CAPACITY: Final = "no-capacity"
IMAGE_PULL: Final = "image-pull"
EVICTED: Final = "evicted"
CONFIG_ERROR: Final = "config-error"
APP_ERROR: Final = "app-error"
RUNTIME_MISSING: Final = "runtime-missing"
IDENTITY_VIOLATION: Final = "identity-violation"
UNKNOWN_FAILURE: Final = "unknown-failure"

COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
RESTART_ATTEMPT: Final = "jobset.sigs.k8s.io/restart-attempt"
REPLICATED_JOB: Final = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX: Final = "jobset.sigs.k8s.io/job-index"

IMAGE_PULL_REASONS: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "ImageInspectError"}
)
CONFIG_WAITING_REASONS: Final = frozenset(
    {
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "PreCreateHookError",
        "PreStartHookError",
        "PostStartHookError",
    }
)
CONFIG_TERMINATED_REASONS: Final = frozenset({"StartError"})
NO_CAPACITY_POD_REASONS: Final = frozenset(
    {"UnexpectedAdmissionError", "TopologyAffinityError", "NodeAffinity", "TaintToleration"}
)
NODE_LOST_TAINTS: Final = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})
RUNTIME_NOT_FOUND: Final = re.compile(
    r"TrainingRuntime specified in TrainJob is not found|"
    r"not found ClusterTrainingRuntime specified in TrainJob|"
    r"must be created before the TrainJob",
    re.IGNORECASE,
)
_FIRST_FAILED_JOB: Final = re.compile(r"first failed job: ([a-z0-9.-]+)")
_EXIT_CODE_IN_MESSAGE: Final = re.compile(r"Container (\S+) for pod (\S+) failed with exit code (\d+)")
# A Job's failure when a runtime's podFailurePolicy FailJob rule on DisruptionTarget matched (platform teams
# may add one): it names the pod after the pod is gone [K: pod_failure_policy.go, status-facts §3].
DISRUPTION_IN_MESSAGE: Final = re.compile(
    r"Pod (\S+)/(\S+) has condition DisruptionTarget matching FailJob rule"
)
# The scheduler's event on a pod it placed: which node a pod that is gone now ran on.
_SCHEDULED_TO: Final = re.compile(r"Successfully assigned (\S+)/(\S+) to (\S+)")

# What a job whose TrainJob is not among the objects read says (jobs.supervision.cycle confirms it first).
TRAINJOB_GONE = "the TrainJob is gone: it was deleted outside dispatch"


@dataclass(frozen=True)
class Context:
    now: datetime
    label_domain: str = DEFAULT_LABEL_DOMAIN
    attempt: int | None = None  # None: read from the objects' labels
    identity_warned: bool = False  # the plan carried an allowRankRestart identity warning
    thresholds: Thresholds = field(default_factory=Thresholds)
    # The execution was seen running before (a job that ran never reads `queued` again, unless Kueue requeued
    # it): the cycle sets it from Execution.started_at; the pods' memory says so too.
    ran: bool = False
    # Nodes the cycle could not read (forbidden, unreachable): a pod on one of them is not judged node-lost
    # for want of its node; a node absent from the input and not named here was not found (deleted).
    unread_nodes: frozenset[str] = frozenset()


@dataclass
class DerivedStatus:
    state: str
    cause: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    message: str = ""
    evidence: list[dict[str, Any]] = field(default_factory=list)  # {object, field, value, at}
    queued_reason: dict[str, Any] = field(default_factory=dict)  # {reason, message, since}
    identity_findings: list[dict[str, Any]] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    restart_attempt: int = 0
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # pod uid -> condensed pod (the memory)
    # Set when dispatch itself has to act: stop the TrainJob (a waiting cause ran out, or the promise broke).
    stop: bool = False
    # What the page may show beside the status, plain data {kind, message, object}: objects that carry the
    # job's labels outside its TrainJob's owner chain (ignored), reads that failed. Filled by the cycle.
    warnings: list[dict[str, Any]] = field(default_factory=list)
    # When a waiting cause's threshold runs out: the result may change then with no object changing.
    recheck_at: datetime | None = None
    # Set when dispatch must deactivate the execution's Kueue Workload before anything else (an eviction ends
    # the attempt): {namespace, name, uid, annotations}. The cycle acts; the derivation only says so.
    deactivate: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.state in (SUCCEEDED, FAILED, CANCELLED)

    def contract(self) -> dict[str, Any]:
        """The `derive_status --json` shape (kept exact: checks outside the test suite read it)."""
        return {
            "state": self.state,
            "cause": self.cause,
            "rank": self.rank,
            "exit_code": self.exit_code,
            "evidence": [{k: e.get(k) for k in ("object", "field", "value")} for e in self.evidence],
            "identity_findings": [
                {k: f.get(k) for k in ("rank", "attempt", "restart_attempt", "pods", "why")}
                for f in self.identity_findings
            ],
        }


# ---------------------------------------------------------------- small readers


def _m(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _l(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else None


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _m(obj.get("metadata"))


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _m(_meta(obj).get("labels"))


def _name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name", ""))


def object_ref(kind: str, obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    namespace = meta.get("namespace")
    return f"{kind} {namespace}/{meta.get('name', '')}" if namespace else f"{kind} {meta.get('name', '')}"


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in _l(_m(obj.get("status")).get("conditions")):
        if _m(cond).get("type") == kind:
            return _m(cond)
    return None


def _true(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    cond = condition(obj, kind)
    return cond if cond is not None and cond.get("status") == "True" else None


def _attempt_of(obj: Mapping[str, Any], label_domain: str) -> int | None:
    labels = _labels(obj)
    value = _int(labels.get(f"{label_domain}/attempt"))
    if value is not None:
        return value
    for key, raw in labels.items():  # another label domain: any "<domain>/attempt" that is not JobSet's
        if str(key).endswith("/attempt") and not str(key).startswith("jobset.sigs.k8s.io"):
            found = _int(raw)
            if found is not None:
                return found
    return None


# ---------------------------------------------------------------- pods, condensed


def _container_rows(statuses: object, sidecars: frozenset[str]) -> list[dict[str, Any]]:
    rows = []
    for raw in _l(statuses):
        status = _m(raw)
        state = _m(status.get("state"))
        last = _m(_m(status.get("lastState")).get("terminated"))
        terminated = _m(state.get("terminated"))
        waiting = _m(state.get("waiting"))
        rows.append(
            {
                "name": status.get("name", ""),
                "restarts": _int(status.get("restartCount")) or 0,
                "sidecar": status.get("name") in sidecars,
                "running": "running" in state,
                "waiting": waiting.get("reason") if waiting else None,
                "waiting_message": waiting.get("message") if waiting else None,
                "terminated": terminated.get("reason") if terminated else None,
                "exit_code": _int(terminated.get("exitCode")) if terminated else None,
                "finished_at": terminated.get("finishedAt") if terminated else None,
                "last_terminated": last.get("reason") if last else None,
                "last_exit_code": _int(last.get("exitCode")) if last else None,
                "last_finished_at": last.get("finishedAt") if last else None,
            }
        )
    return rows


def condense_pod(pod: Mapping[str, Any], label_domain: str) -> dict[str, Any]:
    """What supervision needs of a pod, small enough to remember across cycles (JSON)."""
    meta = _meta(pod)
    spec = _m(pod.get("spec"))
    status = _m(pod.get("status"))
    labels = _labels(pod)
    annotations = _m(meta.get("annotations"))
    sidecars = frozenset(
        str(_m(c).get("name"))
        for c in _l(spec.get("initContainers"))
        if _m(c).get("restartPolicy") == "Always"
    )
    disruption = _true(pod, "DisruptionTarget")
    scheduled = condition(pod, "PodScheduled")
    rank = _int(labels.get(COMPLETION_INDEX))
    if rank is None:
        rank = _int(annotations.get(COMPLETION_INDEX))
    return {
        "uid": meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}",
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "rank": rank,
        "attempt": _attempt_of(pod, label_domain),
        "restart_attempt": _int(labels.get(RESTART_ATTEMPT)) or 0,
        "replicated_job": labels.get(REPLICATED_JOB, ""),
        "job_index": _int(labels.get(JOB_INDEX)) or 0,
        "created": meta.get("creationTimestamp"),
        "deleting": meta.get("deletionTimestamp"),
        "phase": status.get("phase", ""),
        "node": spec.get("nodeName") or "",
        "reason": status.get("reason") or "",
        "reason_message": status.get("message") or "",
        "disruption": (
            {
                "reason": disruption.get("reason", ""),
                "message": disruption.get("message", ""),
                "at": disruption.get("lastTransitionTime"),
            }
            if disruption
            else None
        ),
        "unschedulable": (
            {
                "reason": scheduled.get("reason", ""),
                "message": scheduled.get("message", ""),
                "since": scheduled.get("lastTransitionTime"),
            }
            if scheduled is not None and scheduled.get("status") == "False"
            else None
        ),
        "containers": _container_rows(status.get("containerStatuses"), frozenset()),
        "init_containers": _container_rows(status.get("initContainerStatuses"), sidecars),
        "gone": None,
    }


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class EventView:
    kind: str
    name: str
    uid: str
    reason: str
    message: str
    type: str
    at: datetime | None
    # When it first happened: a legacy event's firstTimestamp (its lastTimestamp moves on every repeat), an
    # events.k8s.io event's eventTime (status-facts §5).
    first: datetime | None = None


def event_view(event: Mapping[str, Any]) -> EventView:
    involved = _m(event.get("involvedObject")) or _m(event.get("regarding"))
    at = (
        parse_time(event.get("eventTime"))
        or parse_time(event.get("lastTimestamp"))
        or parse_time(_m(event.get("series")).get("lastObservedTime"))
        or parse_time(event.get("firstTimestamp"))
        or parse_time(_meta(event).get("creationTimestamp"))
    )
    return EventView(
        kind=str(involved.get("kind", "")),
        name=str(involved.get("name", "")),
        uid=str(involved.get("uid", "")),
        reason=str(event.get("reason", "")),
        message=str(event.get("message") or event.get("note") or ""),
        type=str(event.get("type", "")),
        at=at,
        first=parse_time(event.get("firstTimestamp")) or parse_time(event.get("eventTime")) or at,
    )


# ---------------------------------------------------------------- per-pod classification


@dataclass(frozen=True)
class PodFailure:
    cause: str
    pod: dict[str, Any]
    at: datetime | None
    evidence: list[dict[str, Any]]
    exit_code: int | None = None
    container: str = ""


def _ev(obj: str, fld: str, value: Any, at: Any = None) -> dict[str, Any]:
    when = at if isinstance(at, str) or at is None else _iso(at)
    return {"object": obj, "field": fld, "value": value, "at": when}


def _pod_ref(pod: Mapping[str, Any]) -> str:
    return f"Pod {pod.get('namespace')}/{pod.get('name')}"


def _node_lost(
    node_name: str, nodes: Mapping[str, Mapping[str, Any]], unread: frozenset[str] = frozenset()
) -> tuple[bool, list[dict[str, Any]]]:
    """Is the node gone or unreachable, with the evidence that says so. A node that could not be read proves
    nothing either way."""
    if not node_name:
        return False, []
    node = nodes.get(node_name)
    if node is None and node_name in unread:
        return False, [_ev(f"Node {node_name}", "metadata", "could not be read")]
    if node is None:
        return True, [_ev(f"Node {node_name}", "metadata", "not found (deleted)")]
    evidence = []
    for taint in _l(_m(node.get("spec")).get("taints")):
        taint = _m(taint)
        if taint.get("key") in NODE_LOST_TAINTS:
            evidence.append(
                _ev(f"Node {node_name}", "spec.taints", f"{taint.get('key')}:{taint.get('effect')}")
            )
    ready = condition(node, "Ready")
    if ready is not None and ready.get("status") != "True":
        evidence.append(
            _ev(
                f"Node {node_name}",
                "status.conditions[Ready]",
                f"{ready.get('status')} {ready.get('reason', '')}".strip(),
                ready.get("lastTransitionTime"),
            )
        )
    return bool(evidence), evidence


def _failed_container(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The regular container that ended with a non-zero exit (the earliest), else None."""
    rows = [c for c in pod.get("containers", []) if c.get("terminated") and (c.get("exit_code") or 0) != 0]
    rows += [
        c
        for c in pod.get("init_containers", [])
        if not c.get("sidecar") and c.get("terminated") and (c.get("exit_code") or 0) != 0
    ]
    if not rows:
        return None
    return min(rows, key=lambda c: c.get("finished_at") or "~")


def classify_pod(
    pod: Mapping[str, Any],
    pod_events: Sequence[EventView],
    nodes: Mapping[str, Mapping[str, Any]],
    unread_nodes: frozenset[str] = frozenset(),
) -> PodFailure | None:
    """Why this pod failed, or None when it shows no failure. `pod` is a condensed pod."""
    ref = _pod_ref(pod)
    d = pod
    disruption = d.get("disruption")
    container = _failed_container(d)
    exit_code = container.get("exit_code") if container else None
    finished = parse_time(container.get("finished_at")) if container else None
    reason = d.get("reason") or ""

    def failure(cause: str, at: Any, evidence: list[dict[str, Any]]) -> PodFailure:
        extra = []
        if container:
            extra.append(
                _ev(
                    ref,
                    f"status.containerStatuses[{container['name']}].state.terminated",
                    f"{container.get('terminated')} (exit code {exit_code})",
                    container.get("finished_at"),
                )
            )
        when = parse_time(at) if isinstance(at, str) else at
        return PodFailure(
            cause=cause,
            pod=dict(d),
            at=when or finished,
            evidence=evidence + extra,
            exit_code=exit_code,
            container=container["name"] if container else "",
        )

    # 1. DisruptionTarget: who took the pod away.
    if disruption:
        dr = disruption.get("reason", "")
        at = disruption.get("at")
        ev = [_ev(ref, "status.conditions[DisruptionTarget].reason", dr, at)]
        if dr == "PreemptionByScheduler":
            return failure(PREEMPTED, at, ev)
        if dr == "DeletionByPodGC":
            return failure(NODE_LOST, at, ev + _node_lost(d.get("node", ""), nodes, unread_nodes)[1])
        if dr == "DeletionByTaintManager":
            lost, node_ev = _node_lost(d.get("node", ""), nodes, unread_nodes)
            return failure(NODE_LOST if lost else EVICTED, at, ev + node_ev)
        if dr == "TerminationByKubelet":
            message = disruption.get("message", "")
            if "node shutdown" in message:
                return failure(NODE_LOST, at, ev)
            if "critical pod" in message:
                return failure(PREEMPTED, at, ev)
            return failure(EVICTED, at, ev)
        return failure(EVICTED, at, ev)  # EvictionByEvictionAPI, device taints, exclusive placement

    # 2. The pod's own status.reason (kubelet).
    if reason:
        ev = [_ev(ref, "status.reason", reason)]
        if reason == "Evicted":
            return failure(EVICTED, None, ev)
        if reason == "Preempting":
            return failure(PREEMPTED, None, ev)
        if reason in ("Terminated", "NodeShutdown"):
            return failure(NODE_LOST, None, ev)
        if reason == "DeadlineExceeded":
            return failure(TIMEOUT, None, ev)
        if reason.startswith("OutOf") or reason in NO_CAPACITY_POD_REASONS:
            return failure(NO_CAPACITY, None, ev)

    # 3. OOM in any container, now or in its previous run.
    for row in [*d.get("containers", []), *d.get("init_containers", [])]:
        for key, code_key in (("terminated", "exit_code"), ("last_terminated", "last_exit_code")):
            if row.get(key) == "OOMKilled":
                where = "state" if key == "terminated" else "lastState"
                oom_at = row.get("finished_at" if key == "terminated" else "last_finished_at")
                return PodFailure(
                    cause=OOM,
                    pod=dict(d),
                    at=parse_time(oom_at) or finished,
                    evidence=[
                        _ev(
                            ref,
                            f"status.containerStatuses[{row['name']}].{where}.terminated.reason",
                            "OOMKilled",
                            oom_at,
                        )
                    ],
                    exit_code=row.get(code_key),
                    container=row["name"],
                )

    # 4. Configuration: the container could not be created or started.
    for row in [*d.get("containers", []), *d.get("init_containers", [])]:
        if row.get("terminated") in CONFIG_TERMINATED_REASONS or row.get("waiting") in CONFIG_WAITING_REASONS:
            which = row.get("terminated") or row.get("waiting")
            where = (
                "state.terminated" if row.get("terminated") in CONFIG_TERMINATED_REASONS else "state.waiting"
            )
            return PodFailure(
                cause=CONFIG_ERROR,
                pod=dict(d),
                at=finished,
                evidence=[
                    _ev(ref, f"status.containerStatuses[{row['name']}].{where}.reason", which),
                    *(
                        [_ev(ref, f"status.containerStatuses[{row['name']}].{where}.message", msg)]
                        if (msg := row.get("waiting_message"))
                        else []
                    ),
                ],
                exit_code=row.get("exit_code"),
                container=row["name"],
            )

    # 5. Events that outlive the pod's conditions.
    for event in pod_events:
        if event.reason == "Preempted":
            return failure(PREEMPTED, event.at, [_ev(ref, "event[Preempted]", event.message, event.at)])
        if event.reason == "TaintManagerEviction" and event.message.startswith("Marking for deletion"):
            lost, node_ev = _node_lost(d.get("node", ""), nodes, unread_nodes)
            return failure(
                NODE_LOST if lost else EVICTED,
                event.at,
                [_ev(ref, "event[TaintManagerEviction]", event.message, event.at), *node_ev],
            )
        if event.reason == "Evicted":
            return failure(EVICTED, event.at, [_ev(ref, "event[Evicted]", event.message, event.at)])

    # 6. Image pull: only a failure when it is what stopped the pod.
    for row in [*d.get("containers", []), *d.get("init_containers", [])]:
        if row.get("waiting") in IMAGE_PULL_REASONS and d.get("phase") == "Failed":
            return PodFailure(
                cause=IMAGE_PULL,
                pod=dict(d),
                at=None,
                evidence=[
                    _ev(ref, f"status.containerStatuses[{row['name']}].state.waiting.reason", row["waiting"])
                ],
                container=row["name"],
            )

    # 7. The application exited non-zero.
    if container is not None:
        return failure(APP_ERROR, container.get("finished_at"), [])

    # 8. Gone without a word: the node it ran on is gone or unreachable. A pod only being deleted (the Job or
    # JobSet controller sets no DisruptionTarget, status-facts §1.2) needs its node seen NotReady or tainted
    # unreachable (§10): a node merely absent from the input proves nothing for a pod still listed (PodGC
    # would have written DeletionByPodGC on it).
    if d.get("gone") or d.get("deleting"):
        lost, node_ev = _node_lost(d.get("node", ""), nodes, unread_nodes)
        if lost and (d.get("gone") or d.get("node", "") in nodes):
            return failure(
                NODE_LOST,
                d.get("gone") or d.get("deleting"),
                [_ev(ref, "metadata", "gone" if d.get("gone") else "deleting", d.get("gone")), *node_ev],
            )
    if d.get("phase") == "Failed":
        return failure(UNKNOWN_FAILURE, None, [_ev(ref, "status.phase", "Failed")])
    return None


# ---------------------------------------------------------------- identity


def identity_findings(pods: Iterable[Mapping[str, Any]], *, warned: bool) -> list[dict[str, Any]]:
    """Ranks that ran twice under one identity (A, J, rank): a container restarted in place, or two pods."""
    groups: dict[tuple[int, int, int, int], list[Mapping[str, Any]]] = {}
    findings: list[dict[str, Any]] = []
    for pod in pods:
        rank = pod.get("rank")
        if rank is None:
            continue
        key = (pod.get("attempt") or 0, pod.get("restart_attempt") or 0, pod.get("job_index") or 0, rank)
        groups.setdefault(key, []).append(pod)
        for row in [*pod.get("containers", []), *pod.get("init_containers", [])]:
            if row.get("sidecar"):
                continue
            if row.get("restarts", 0) > 0 or row.get("last_terminated"):
                findings.append(
                    {
                        "rank": rank,
                        "attempt": key[0],
                        "restart_attempt": key[1],
                        "pods": [pod.get("name")],
                        "why": (
                            f"container {row['name']} of pod {pod.get('name')} restarted in place "
                            f"(restartCount {row.get('restarts', 0)}"
                            + (
                                f", previous run {row['last_terminated']}"
                                if row.get("last_terminated")
                                else ""
                            )
                            + ")"
                        ),
                        "expected": warned,
                    }
                )
    for (attempt, restart, _job_index, rank), members in sorted(groups.items()):
        if len(members) > 1:
            names = [str(p.get("name")) for p in sorted(members, key=lambda p: p.get("created") or "")]
            findings.append(
                {
                    "rank": rank,
                    "attempt": attempt,
                    "restart_attempt": restart,
                    "pods": names,
                    "why": (
                        f"{len(names)} pods ran rank {rank} in attempt {attempt}, restart-attempt {restart}"
                    ),
                    "expected": warned,
                }
            )
    for finding in findings:
        if warned:
            finding["why"] += " (expected: the plan's allowRankRestart identity warning)"
    findings.sort(key=lambda f: (f["attempt"], f["restart_attempt"], f["rank"]))
    return findings


# ---------------------------------------------------------------- the derivation


def _rank_row(pod: Mapping[str, Any], first_failed_uid: str | None) -> dict[str, Any]:
    containers = pod.get("containers", [])
    node_row = next((c for c in containers if c.get("name") == "node"), containers[0] if containers else {})
    failed = _failed_container(pod)
    waiting = next((c.get("waiting") for c in containers if c.get("waiting")), None)
    reason = (
        (pod.get("disruption") or {}).get("reason")
        or pod.get("reason")
        or (failed or {}).get("terminated")
        or node_row.get("terminated")
        or waiting
        or ((pod.get("unschedulable") or {}).get("reason"))
        or ""
    )
    return {
        "rank": pod.get("rank"),
        "attempt": pod.get("attempt"),
        "restart_attempt": pod.get("restart_attempt", 0),
        "pod": pod.get("name"),
        "phase": "Gone" if pod.get("gone") else pod.get("phase") or "Pending",
        "exit_code": (failed or node_row).get("exit_code"),
        "restarts": sum(c.get("restarts", 0) for c in containers),
        "node": pod.get("node", ""),
        "reason": reason,
        "first_failure": pod.get("uid") == first_failed_uid,
    }


def _sentence(failure: PodFailure, attempt: int | None) -> str:
    pod = failure.pod
    rank = pod.get("rank")
    when = failure.at.strftime("%H:%M:%S") if failure.at else ""
    at = f" at {when}" if when else ""
    inn = f" in attempt {attempt}" if attempt else ""
    who = f"rank {rank}" if rank is not None else f"pod {pod.get('name')}"
    texts = {
        APP_ERROR: f"{who} exited with code {failure.exit_code}{at}{inn}",
        OOM: f"{who} was OOM-killed{at}{inn}",
        PREEMPTED: f"{who} was preempted{at}{inn}",
        NODE_LOST: f"{who} lost its node {pod.get('node') or ''}{at}{inn}".replace("  ", " "),
        EVICTED: f"{who} was evicted{at}{inn}",
        CONFIG_ERROR: f"{who} could not start its container{at}{inn}",
        IMAGE_PULL: f"{who} could not pull its image{at}{inn}",
        TIMEOUT: f"{who} ran past its deadline{at}{inn}",
        NO_CAPACITY: f"{who} was rejected by its node for lack of resources{at}{inn}",
    }
    return texts.get(failure.cause, f"{who} failed{at}{inn}")


def _raw_conditions(kind: str, obj: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if not obj:
        return []
    rows = []
    for cond in _l(_m(obj.get("status")).get("conditions")):
        cond = _m(cond)
        if cond.get("status") == "True":
            rows.append(
                _ev(
                    object_ref(kind, obj),
                    f"status.conditions[{cond.get('type')}]",
                    f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": "),
                    cond.get("lastTransitionTime"),
                )
            )
    return rows


def derive(
    objects: Sequence[Mapping[str, Any]],
    ctx: Context,
    memory: Mapping[str, Mapping[str, Any]] | None = None,
) -> DerivedStatus:
    """The state and typed cause of one execution from its observed objects (see the module docstring)."""
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(str(obj.get("kind", "")), []).append(obj)
    trainjob = next(iter(by_kind.get("TrainJob", [])), None)
    jobset = next(iter(by_kind.get("JobSet", [])), None)
    jobs = by_kind.get("Job", [])
    nodes = {_name(n): n for n in by_kind.get("Node", [])}
    workloads = by_kind.get("Workload", [])
    events = sorted(
        (event_view(e) for e in by_kind.get("Event", [])),
        key=lambda e: e.at or datetime.min.replace(tzinfo=UTC),
    )

    attempt = ctx.attempt
    if attempt is None:
        candidates = [o for o in (trainjob, jobset) if o is not None] + [*jobs, *by_kind.get("Pod", [])]
        for obj in candidates:
            if (found := _attempt_of(obj, ctx.label_domain)) is not None:
                attempt = found
                break

    # Pods: what is there now, plus what earlier cycles saw that is gone now.
    pods: dict[str, dict[str, Any]] = {}
    for uid, remembered in (memory or {}).items():
        pods[uid] = dict(remembered)
    present = set()
    for raw in by_kind.get("Pod", []):
        pod = condense_pod(raw, ctx.label_domain)
        if pod.get("attempt") is None:
            pod["attempt"] = attempt
        earlier = pods.get(pod["uid"])
        if earlier and earlier.get("disruption") and not pod.get("disruption"):
            pod["disruption"] = earlier["disruption"]
        pods[pod["uid"]] = pod
        present.add(pod["uid"])
    now_iso = _iso(ctx.now)
    for uid, pod in pods.items():
        if uid not in present and not pod.get("gone"):
            pod["gone"] = now_iso

    restart_attempt = _int(_m((jobset or {}).get("status")).get("restarts")) or 0
    restart_attempt = max([restart_attempt, *(p.get("restart_attempt", 0) for p in pods.values())])
    status = DerivedStatus(state=QUEUED, restart_attempt=restart_attempt, pods=pods)

    pod_events: dict[str, list[EventView]] = {}
    for event in events:
        if event.kind == "Pod":
            pod_events.setdefault(event.name, []).append(event)

    failures = [
        f
        for pod in pods.values()
        if (f := classify_pod(pod, pod_events.get(str(pod.get("name")), []), nodes, ctx.unread_nodes))
        is not None
    ]
    failures.sort(key=lambda f: (f.at or datetime.max.replace(tzinfo=UTC), f.pod.get("rank") or 0))
    current_failures = [f for f in failures if f.pod.get("restart_attempt", 0) == restart_attempt]
    first = current_failures[0] if current_failures else (failures[0] if failures else None)

    status.identity_findings = identity_findings(pods.values(), warned=ctx.identity_warned)
    status.ranks = sorted(
        (_rank_row(p, first.pod.get("uid") if first else None) for p in pods.values()),
        key=lambda r: (
            r["attempt"] or 0,
            r["restart_attempt"],
            r["rank"] if r["rank"] is not None else -1,
            r["pod"],
        ),
    )
    if restart_attempt:
        status.evidence.append(
            _ev(
                object_ref("JobSet", jobset) if jobset else "JobSet",
                "status.restarts",
                restart_attempt,
                (_true(jobset, "RestartingJobSet") or {}).get("lastTransitionTime") if jobset else None,
            )
        )

    def fail(
        cause: str, message: str, evidence: list[dict[str, Any]], failure: PodFailure | None = None
    ) -> None:
        status.state = FAILED
        status.cause = cause
        status.message = message
        status.evidence = evidence + status.evidence
        if failure is not None:
            status.rank = failure.pod.get("rank")
            status.exit_code = failure.exit_code

    def fail_from_pods(aggregate: list[dict[str, Any]]) -> None:
        """The chain behind an aggregate failure: the first failed pod is the cause, the others evidence.
        The chain runs through the current restart-attempt's failed Jobs (status-facts §10 precedence 1),
        whose conditions are kept as evidence; a Job whose terminal reason is its deadline makes the failure
        a timeout (precedence 4): its pods' 143s are the kill, not the cause."""
        chain = [e for e in _failed_job_conditions(jobs, restart_attempt) if e not in aggregate]
        if any(e["value"].startswith("DeadlineExceeded") for e in chain):
            pods_ev = [e for f in current_failures for e in f.evidence]
            fail(TIMEOUT, "a Job ran past its activeDeadlineSeconds", chain + pods_ev + aggregate)
            return
        if first is not None:
            others = [e for f in current_failures if f is not first for e in f.evidence]
            fail(first.cause, _sentence(first, attempt), first.evidence + others + chain + aggregate, first)
            return
        message_failure = _failure_from_job_messages(jobs) or disruption_from_job_messages(
            jobs, pod_events, nodes, ctx.unread_nodes
        )
        if message_failure is not None:
            cause, text, ev, rank, code = message_failure
            fail(cause, text, ev + aggregate)
            status.rank, status.exit_code = rank, code
            return
        raw = (
            _raw_conditions("TrainJob", trainjob)
            + _raw_conditions("JobSet", jobset)
            + [e for job in jobs for e in _raw_conditions("Job", job)]
        )
        fail(UNKNOWN_FAILURE, "the job failed and nothing observed explains why", raw or aggregate)

    # --- the TrainJob
    if trainjob is None:
        if first is not None:
            fail_from_pods([])
            return status
        status.state = CANCELLED
        status.cause = CANCELLED
        status.message = TRAINJOB_GONE
        status.evidence = [_ev("TrainJob", "metadata", "not found")]
        return status
    tj_ref = object_ref("TrainJob", trainjob)
    if _meta(trainjob).get("deletionTimestamp"):
        status.state = CANCELLED
        status.cause = CANCELLED
        status.message = "the TrainJob is being deleted outside dispatch"
        status.evidence = [
            _ev(tj_ref, "metadata.deletionTimestamp", _meta(trainjob).get("deletionTimestamp"))
        ]
        return status

    complete = _true(trainjob, "Complete") or (_true(jobset, "Completed") if jobset else None)
    if complete:
        # Complete wins the state (status-facts §12): a preempted rank that exits 0 on SIGTERM completes its
        # index. A rank that ran twice is still a finding: kept on the status (and the timeline), and said.
        status.state = SUCCEEDED
        status.message = str(complete.get("message") or "completed")
        unexpected = [f for f in status.identity_findings if not f.get("expected")]
        if unexpected:
            status.message += f"; identity finding: {unexpected[0]['why']}"
        return status

    failed = _true(trainjob, "Failed")
    if failed:
        reason = str(failed.get("reason", ""))
        ev = [
            _ev(
                tj_ref,
                "status.conditions[Failed]",
                f"{reason}: {failed.get('message', '')}",
                failed.get("lastTransitionTime"),
            )
        ]
        if reason == "DeadlineExceeded":
            waiting = _waiting_evidence(pods.values(), events)
            fail(TIMEOUT, "the TrainJob ran past its activeDeadlineSeconds", ev + waiting)
            return status
        if reason == "TrainingRuntimeNotSupported":
            fail(CONFIG_ERROR, str(failed.get("message", "")), ev)
            return status
        fail_from_pods(ev)
        return status

    # Kueue: an eviction ends the attempt (status-facts §12). Kueue would resume this same TrainJob, and its
    # ranks would run again under the same identity: dispatch deactivates the Workload (with its mark, so the
    # `Deactivated` that follows reads as its own act), records the cause and stops the TrainJob; A+1, if the
    # recovery policy allows, is a new TrainJob. A Workload a user deactivated is the job cancelled.
    eviction = kueue_eviction(workloads, ctx.label_domain)
    if eviction is not None:
        status.queued_reason = {}
        if eviction.cause == CANCELLED:
            status.state = CANCELLED
            status.cause = CANCELLED
            status.message = eviction.message
            status.evidence = eviction.evidence
            return status
        fail(eviction.cause, eviction.message, eviction.evidence)
        status.stop = True
        status.deactivate = eviction.act
        return status

    if jobset is not None and _true(jobset, "Failed"):
        js_failed = _true(jobset, "Failed") or {}
        fail_from_pods(
            [
                _ev(
                    object_ref("JobSet", jobset),
                    "status.conditions[Failed]",
                    f"{js_failed.get('reason')}: {js_failed.get('message')}",
                )
            ]
        )
        return status

    # A Job of the current restart attempt failed (FailureTarget is written first, Failed follows once its
    # pods are gone): the TrainJob will fail with it, since the rules allow no restarts.
    for job in jobs:
        job_attempt = _int(_labels(job).get(RESTART_ATTEMPT)) or 0
        if job_attempt != restart_attempt:
            continue
        cond = _true(job, "Failed") or _true(job, "FailureTarget")
        if cond:
            if str(cond.get("reason")) == "DeadlineExceeded":
                fail(
                    TIMEOUT,
                    "a Job ran past its activeDeadlineSeconds",
                    [
                        _ev(
                            object_ref("Job", job),
                            f"status.conditions[{cond.get('type')}]",
                            "DeadlineExceeded",
                        )
                    ],
                )
                return status
            fail_from_pods(
                [
                    _ev(
                        object_ref("Job", job),
                        f"status.conditions[{cond.get('type')}]",
                        f"{cond.get('reason')}: {cond.get('message')}",
                        cond.get("lastTransitionTime"),
                    )
                ]
            )
            return status

    suspended = _true(trainjob, "Suspended")
    if suspended or _m(trainjob.get("spec")).get("suspend") is True:
        status.state = QUEUED
        since = (suspended or {}).get("lastTransitionTime")
        status.queued_reason = kueue_queued_reason(workloads) or {
            "reason": "awaiting-admission",
            "message": "the TrainJob is suspended, waiting for admission",
        }
        status.queued_reason.setdefault("since", since)
        if not workloads and not _labels(trainjob).get(KUEUE_QUEUE_LABEL):
            # No Kueue queue manages it (dispatch sets the label for a job's queue_name): somebody suspended
            # it by hand, and nothing will resume it. Reversible, so not cancelled; named, so not a mystery.
            status.queued_reason = {
                "reason": "suspended",
                "message": "the TrainJob was suspended outside dispatch (spec.suspend: true) and no Kueue "
                "queue manages it: it waits until spec.suspend is set back to false, or the job is cancelled",
                "since": since,
            }
        return status

    if jobset is None:
        creation = [
            e for e in events if e.reason == "TrainJobResourcesCreationFailed" and e.name == _name(trainjob)
        ]
        if creation:
            latest = creation[-1]
            ev = [_ev(tj_ref, "event[TrainJobResourcesCreationFailed]", latest.message, latest.at)]
            if RUNTIME_NOT_FOUND.search(latest.message):
                fail(
                    RUNTIME_MISSING,
                    "the TrainJob's runtime copy is gone; the Trainer cannot build its JobSet",
                    ev,
                )
                status.stop = True
                return status
            since = creation[0].at
            if since and (ctx.now - since).total_seconds() >= ctx.thresholds.resources_failed_after:
                fail(CONFIG_ERROR, latest.message, ev)
                status.stop = True
                return status
            if since:
                _recheck(status, since, ctx.thresholds.resources_failed_after)
        status.queued_reason = {
            "reason": "awaiting-jobset",
            "message": "the Trainer has not built the JobSet yet",
            "since": _meta(trainjob).get("creationTimestamp"),
        }
        return status

    live = [
        p
        for p in pods.values()
        if not p.get("gone") and not p.get("deleting") and p.get("restart_attempt", 0) == restart_attempt
    ]

    # The identity promise: a rerun nothing else explains stops the execution.
    unexpected = [
        f
        for f in status.identity_findings
        if not f.get("expected") and f["restart_attempt"] == restart_attempt
    ]
    if unexpected:
        finding = unexpected[0]
        identity_ev = [
            _ev(f"Pod {_meta(trainjob).get('namespace')}/{name}", "identity", finding["why"])
            for name in finding["pods"]
        ]
        # §10 precedence 7: when a preemption, a lost node or an eviction caused the rerun, that is the
        # cause and the identity evidence is attached.
        disrupted = [
            f
            for f in current_failures
            if f.cause in (PREEMPTED, NODE_LOST, EVICTED) and f.pod.get("name") in finding["pods"]
        ]
        if disrupted:
            fail(disrupted[0].cause, _sentence(disrupted[0], attempt), disrupted[0].evidence + identity_ev)
            status.rank = finding["rank"]
            status.stop = True
            return status
        fail(
            IDENTITY_VIOLATION,
            f"rank {finding['rank']} ran twice under one identity: {finding['why']}",
            identity_ev,
        )
        status.rank = finding["rank"]
        status.stop = True
        return status

    # Under dispatch's rules (backoffLimit 0, no podFailurePolicy Ignore, no per-index retries, no JobSet
    # restarts) a rank pod that ended Failed fails its Job, and the JobSet and TrainJob with it: read it now,
    # not after the Job controller writes it (it batches pod updates for a second, longer when busy). With the
    # plan's allowRankRestart warning the Job may replace the pod: then its condition decides.
    if not ctx.identity_warned and any(f.pod.get("phase") == "Failed" for f in current_failures):
        fail_from_pods([])
        return status

    running = [p for p in live if p.get("phase") == "Running"]
    if running:
        status.state = RUNNING
        status.message = f"{len(running)} of {len(live)} pods running"
        _waiting(status, live, events, ctx, running=True)
    elif live and all(p.get("phase") == "Succeeded" for p in live):
        status.state = RUNNING
        status.message = "all pods succeeded; the TrainJob is completing"
    else:
        status.state = QUEUED
        _waiting(status, live, events, ctx, running=False)
        if not status.queued_reason:
            status.queued_reason = {
                "reason": "awaiting-pods",
                "message": "the JobSet's pods are being created",
                "since": _meta(jobset).get("creationTimestamp"),
            }
        note = pods_ready_note(workloads)
        if note:
            status.queued_reason = {
                **status.queued_reason,
                "kueue": "awaiting-pods-ready",
                "message": f"{status.queued_reason.get('message', '')}; {note}".strip("; "),
            }
    if status.state in (RUNNING, QUEUED):
        _create_failures(status, events, jobs, pods, restart_attempt, ctx, _meta(trainjob).get("namespace"))
    if status.state == QUEUED and (ctx.ran or _ran(pods.values())):
        # A job that ran never reads `queued` again unless Kueue requeued it (a suspended TrainJob, above):
        # its pods ended or are going (the Job reports the failure a moment later), or are being replaced.
        status.state = RUNNING
        status.message = f"0 of {len(live)} pods running"
        if current_failures:
            status.message += (
                f"; {_sentence(current_failures[0], attempt)}, waiting for its Job to report the failure"
            )
    return status


def _ran(pods: Iterable[Mapping[str, Any]]) -> bool:
    """Did any pod run: seen Running or finished, or a container that started or ended."""
    for pod in pods:
        if pod.get("phase") in ("Running", "Succeeded", "Failed") and not pod.get("unschedulable"):
            return True
        for row in [*pod.get("containers", []), *pod.get("init_containers", [])]:
            started = row.get("running") or row.get("terminated") or row.get("last_terminated")
            if started and not row.get("sidecar"):
                return True
    return False


def _create_failures(
    status: DerivedStatus,
    events: Sequence[EventView],
    jobs: Sequence[Mapping[str, Any]],
    pods: Mapping[str, Mapping[str, Any]],
    restart_attempt: int,
    ctx: Context,
    namespace: Any,
) -> None:
    """A Job of the current restart attempt that cannot create its pods (admission, quota): FailedCreate
    events newer than the newest pod that Job made. An old FailedCreate (a quota that was raised since, the
    pods then made) says nothing about now. Waits like any waiting cause: "exceeded quota" is no capacity
    (NO_CAPACITY_AFTER_SECONDS), anything else a configuration error (an admission denial, 15 s); past it
    the execution fails and dispatch stops it."""
    current = {_name(j): j for j in jobs if (_int(_labels(j).get(RESTART_ATTEMPT)) or 0) == restart_attempt}
    streaks: dict[str, list[EventView]] = {}
    for event in events:
        if event.kind != "Job" or event.reason != "FailedCreate" or event.name not in current:
            continue
        job_uid = str(_meta(current[event.name]).get("uid") or "")
        if event.uid and job_uid and event.uid != job_uid:
            continue  # about an earlier Job of that name (a JobSet restart recreates the same names)
        streaks.setdefault(event.name, []).append(event)
    for job_name, streak in sorted(streaks.items()):
        made = [
            parse_time(p.get("created"))
            for p in pods.values()
            if str(p.get("name", "")).startswith(f"{job_name}-")
            and p.get("restart_attempt", 0) == restart_attempt
        ]
        newest_pod = max((m for m in made if m), default=None)
        # Pod creation times have whole seconds: a pod made in the second of a failure counts as after it.
        after = [
            e
            for e in streak
            if e.at is not None and (newest_pod is None or e.at.replace(microsecond=0) > newest_pod)
        ]
        if not after:
            continue  # a pod was made after the last failure: resolved
        latest = max(after, key=lambda e: e.at or datetime.min.replace(tzinfo=UTC))
        since = min(e.first or e.at or ctx.now for e in after)
        if newest_pod is not None and since < newest_pod:
            since = newest_pod  # a repeated event's first time may predate the pod that resolved it once
        quota = "exceeded quota" in latest.message
        cause = NO_CAPACITY if quota else CONFIG_ERROR
        threshold = ctx.thresholds.no_capacity_after if quota else ctx.thresholds.resources_failed_after
        status.queued_reason = {
            "reason": "pods-not-created",
            "message": latest.message,
            "since": _iso(since),
        }
        waited = (ctx.now - since).total_seconds()
        if waited < threshold:
            _recheck(status, since, threshold)
            return
        ev = [_ev(f"Job {namespace}/{job_name}", "event[FailedCreate]", latest.message, latest.at)]
        status.state = FAILED
        status.cause = cause
        status.message = f"the Job {job_name} could not create its pods for {int(waited)} s: {latest.message}"
        status.evidence = ev + status.evidence
        status.stop = True
        return


def _recheck(status: DerivedStatus, since: datetime, threshold: float) -> None:
    due = since + timedelta(seconds=threshold)
    if status.recheck_at is None or due < status.recheck_at:
        status.recheck_at = due


def _waiting(
    status: DerivedStatus,
    live: list[dict[str, Any]],
    events: Sequence[EventView],
    ctx: Context,
    *,
    running: bool,
) -> None:
    """Waiting causes of live pods: unschedulable (no-capacity), image pull, container config errors.
    Past their threshold the execution fails with that cause, and dispatch stops it."""
    unschedulable = [p for p in live if p.get("unschedulable") and p.get("phase") == "Pending"]
    if unschedulable:
        pod = min(unschedulable, key=lambda p: p["unschedulable"].get("since") or "~")
        info = pod["unschedulable"]
        message = info.get("message") or _latest_event_message(events, pod["name"], "FailedScheduling")
        _wait_or_fail(
            status,
            ctx,
            pod,
            reason="unschedulable",
            cause=NO_CAPACITY,
            message=message,
            since_text=info.get("since"),
            threshold=ctx.thresholds.no_capacity_after,
            evidence=(
                "status.conditions[PodScheduled]",
                f"{info.get('reason')}: {message}",
            ),
            doing="be scheduled",
        )
        return
    for pod in live:
        for row in pod.get("containers", []) + pod.get("init_containers", []):
            waiting = row.get("waiting")
            if waiting in IMAGE_PULL_REASONS or waiting in CONFIG_WAITING_REASONS:
                cause = IMAGE_PULL if waiting in IMAGE_PULL_REASONS else CONFIG_ERROR
                since_text = _first_event_time(
                    events, pod["name"], ("Failed", "BackOff", "ErrImageNeverPull")
                ) or pod.get("created")
                message = row.get("waiting_message") or waiting
                _wait_or_fail(
                    status,
                    ctx,
                    pod,
                    reason=cause,
                    cause=cause,
                    message=f"{waiting}: {message}",
                    since_text=since_text,
                    threshold=ctx.thresholds.stuck_after,
                    evidence=(f"status.containerStatuses[{row['name']}].state.waiting.reason", waiting),
                    doing="start",
                )
                return


def _wait_or_fail(
    status: DerivedStatus,
    ctx: Context,
    pod: Mapping[str, Any],
    *,
    reason: str,
    cause: str,
    message: str,
    since_text: str | None,
    threshold: float,
    evidence: tuple[str, Any],
    doing: str,
) -> None:
    """A waiting cause: the queued reason, and past its threshold a failure with that cause (dispatch then
    stops the TrainJob: it would never run)."""
    status.queued_reason = {"reason": reason, "message": message, "since": since_text, "pod": pod["name"]}
    since = parse_time(since_text)
    if since is None or (ctx.now - since).total_seconds() < threshold:
        if since is not None:
            _recheck(status, since, threshold)
        return
    waited = int((ctx.now - since).total_seconds())
    status.state = FAILED
    status.cause = cause
    status.rank = pod.get("rank")
    status.message = f"rank {pod.get('rank')} could not {doing} for {waited} s: {message}"
    status.evidence = [_ev(_pod_ref(pod), evidence[0], evidence[1], since_text), *status.evidence]
    status.stop = True


def _latest_event_message(events: Sequence[EventView], pod_name: str, reason: str) -> str:
    found = [e for e in events if e.kind == "Pod" and e.name == pod_name and e.reason == reason]
    return found[-1].message if found else ""


def _first_event_time(events: Sequence[EventView], pod_name: str, reasons: tuple[str, ...]) -> str | None:
    firsts = [
        event.first
        for event in events
        if event.kind == "Pod" and event.name == pod_name and event.reason in reasons and event.first
    ]
    return _iso(min(firsts)) if firsts else None


def _waiting_evidence(pods: Iterable[Mapping[str, Any]], events: Sequence[EventView]) -> list[dict[str, Any]]:
    """What kept a timed-out job waiting (no-capacity, image pull), as evidence under the timeout."""
    out = []
    for pod in pods:
        info = pod.get("unschedulable")
        if info:
            out.append(
                _ev(
                    _pod_ref(pod),
                    "status.conditions[PodScheduled]",
                    f"{info.get('reason')}: {info.get('message')}",
                    info.get("since"),
                )
            )
        for row in pod.get("containers", []):
            if row.get("waiting") in IMAGE_PULL_REASONS:
                out.append(
                    _ev(
                        _pod_ref(pod),
                        f"status.containerStatuses[{row['name']}].state.waiting.reason",
                        row["waiting"],
                    )
                )
    return out


def _failure_from_job_messages(
    jobs: Sequence[Mapping[str, Any]],
) -> tuple[str, str, list[dict[str, Any]], int | None, int | None] | None:
    """A Job's PodFailurePolicy message names the container and exit code even after the pod is gone."""
    for job in jobs:
        for kind in ("Failed", "FailureTarget"):
            cond = _true(job, kind)
            if not cond:
                continue
            match = _EXIT_CODE_IN_MESSAGE.search(str(cond.get("message", "")))
            if match:
                code = int(match.group(3))
                ev = [_job_message_evidence(job, kind, cond)]
                # An Indexed Job's pod is named <job>-<index>-<suffix> [K: podGenerateNameWithIndex].
                pod_name = match.group(2).rpartition("/")[2]
                index = pod_name.removeprefix(f"{_name(job)}-").split("-")[0]
                rank = _int(index) if pod_name.startswith(f"{_name(job)}-") else None
                return APP_ERROR, f"pod {match.group(2)} exited with code {code}", ev, rank, code
            if cond.get("reason") == "DeadlineExceeded":
                ev = [_ev(object_ref("Job", job), f"status.conditions[{kind}].reason", "DeadlineExceeded")]
                return TIMEOUT, "a Job ran past its activeDeadlineSeconds", ev, None, None
    return None


def _job_message_evidence(job: Mapping[str, Any], kind: str, cond: Mapping[str, Any]) -> dict[str, Any]:
    return _ev(
        object_ref("Job", job),
        f"status.conditions[{kind}].message",
        cond.get("message"),
        cond.get("lastTransitionTime"),
    )


def disrupted_pods_named(jobs: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], str, str]]:
    """(Job, condition type, pod name) for each Job whose failure names a disrupted pod."""
    out = []
    for job in jobs:
        for kind in ("Failed", "FailureTarget"):
            cond = _true(job, kind)
            match = DISRUPTION_IN_MESSAGE.search(str(cond.get("message", ""))) if cond else None
            if match:
                out.append((job, kind, match.group(2)))
                break
    return out


def scheduled_node(events: Iterable[EventView], pod_name: str) -> str:
    """The node the scheduler placed this pod on, by its Scheduled event ("" when none is at hand)."""
    for event in events:
        match = _SCHEDULED_TO.search(event.message) if event.reason == "Scheduled" else None
        if match and match.group(2) == pod_name:
            return match.group(3)
    return ""


def disruption_from_job_messages(
    jobs: Sequence[Mapping[str, Any]],
    pod_events: Mapping[str, Sequence[EventView]],
    nodes: Mapping[str, Mapping[str, Any]],
    unread_nodes: frozenset[str] = frozenset(),
) -> tuple[str, str, list[dict[str, Any]], int | None, int | None] | None:
    """A disrupted pod that was gone before supervision saw it, from the Job's failure (a FailJob rule on
    DisruptionTarget in the runtime). Who took it comes from what outlives a pod: its events (the
    scheduler's Preempted, the taint manager's TaintManagerEviction, the kubelet's Evicted) and the node its
    Scheduled event names (gone or unreachable: node-lost). With none of these it was the Eviction API, the
    one disruption that leaves no other trace (status-facts §1.2)."""
    for job, kind, pod_name in disrupted_pods_named(jobs):
        ev = [_job_message_evidence(job, kind, _true(job, kind) or {})]
        index = pod_name.removeprefix(f"{_name(job)}-").split("-")[0]
        rank = _int(index) if pod_name.startswith(f"{_name(job)}-") else None
        events = pod_events.get(pod_name, [])
        ref = f"Pod {pod_name}"
        cause, how = EVICTED, "evicted: no preemption, taint eviction or lost node is recorded for it"
        for event in events:
            if event.reason == "Preempted":
                cause, how = PREEMPTED, "preempted by the scheduler"
                ev.append(_ev(ref, "event[Preempted]", event.message, event.at))
                break
            if event.reason == "Evicted":
                cause, how = EVICTED, "evicted by the kubelet"
                ev.append(_ev(ref, "event[Evicted]", event.message, event.at))
                break
            if event.reason == "TaintManagerEviction" and event.message.startswith("Marking for deletion"):
                ev.append(_ev(ref, "event[TaintManagerEviction]", event.message, event.at))
                cause, how = EVICTED, "evicted for a NoExecute taint"
                break
        node = scheduled_node(events, pod_name)
        if cause == EVICTED and node and (node in nodes or node not in unread_nodes):
            # needs_nodes (jobs.supervision.nodes) asked for this node: absent means deleted.
            lost, node_ev = _node_lost(node, nodes, unread_nodes)
            if lost:
                cause, how = NODE_LOST, f"its node {node} is gone or unreachable"
                ev += node_ev
        who = f"rank {rank}" if rank is not None else f"pod {pod_name}"
        text = (
            f"{who} was disrupted ({how}); the pod was gone before dispatch read it, "
            f"and Job {_name(job)}'s failure names it"
        )
        return cause, text, ev, rank, None
    return None


def _failed_job_conditions(jobs: Sequence[Mapping[str, Any]], restart_attempt: int) -> list[dict[str, Any]]:
    """The Failed (else FailureTarget) condition of each failed Job of the current JobSet restart-attempt."""
    out = []
    for job in jobs:
        if (_int(_labels(job).get(RESTART_ATTEMPT)) or 0) != restart_attempt:
            continue
        cond = _true(job, "Failed") or _true(job, "FailureTarget")
        if cond:
            out.append(
                _ev(
                    object_ref("Job", job),
                    f"status.conditions[{cond.get('type')}]",
                    f"{cond.get('reason')}: {cond.get('message')}",
                    cond.get("lastTransitionTime"),
                )
            )
    return out


_PREEMPTOR: Final = re.compile(r"\(UID: ([^,]+), JobUID: ([^)]+)\) due to ([^;]+)")


@dataclass(frozen=True)
class KueueEviction:
    cause: str
    message: str
    evidence: list[dict[str, Any]]
    act: dict[str, Any] | None = None  # the deactivation the cycle must do (None: nothing left to do)


def _eviction_cause(reason: str) -> str:
    if reason == "Preempted":
        return PREEMPTED
    if reason == "NodeFailures":
        return NODE_LOST
    if "MaximumExecutionTimeExceeded" in reason:
        return TIMEOUT
    return EVICTED


def _cond_ev(wl: Mapping[str, Any], cond: Mapping[str, Any] | None, name: str) -> list[dict[str, Any]]:
    if not cond:
        return []
    return [
        _ev(
            object_ref("Workload", wl),
            f"status.conditions[{name}]",
            f"{cond.get('reason', '')}: {cond.get('message', '')}",
            cond.get("lastTransitionTime"),
        )
    ]


def _kept(cond: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not cond:
        return None
    return {k: cond.get(k) for k in ("type", "status", "reason", "message", "lastTransitionTime")}


def _eviction_message(cause: str, evicted: Mapping[str, Any], preempted: Mapping[str, Any] | None) -> str:
    reason = str(evicted.get("reason", ""))
    text = f"Kueue evicted the Workload ({reason}"
    found = _PREEMPTOR.search(str((preempted or evicted).get("message", "")))
    if cause == PREEMPTED and found:
        how = str((preempted or {}).get("reason") or "")
        text += f" {how}" if how else ""
        text += f", by workload UID {found.group(1)} of job UID {found.group(2)}, due to {found.group(3)}"
    return text + "): dispatch ended the attempt so that its ranks do not run again under the same identity"


def _mark(wl: Mapping[str, Any], label_domain: str) -> dict[str, Any] | None:
    raw = _m(_meta(wl).get("annotations")).get(kueue_mark_key(label_domain))
    if not raw:
        return None
    try:
        value = json.loads(str(raw))
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get("cause") else None


def kueue_eviction(workloads: Sequence[Mapping[str, Any]], label_domain: str) -> KueueEviction | None:
    """What a Kueue eviction of the execution's Workload means (status-facts §7, §12). Pure.

    - dispatch's mark on the Workload (it deactivated it): the cause and evidence it recorded then; the
      `Deactivated` eviction that follows is dispatch's own act, not a user's. Nothing left to do unless the
      Workload was made active again.
    - Evicted=True `Deactivated` without the mark: a user set spec.active=false: cancelled outside dispatch.
    - Evicted=True `DeactivatedDueTo<cause>`: Kueue deactivated it (its maximum execution time: timeout; its
      requeuing limit and the rest: evicted). It is inactive already.
    - Evicted=True for any other reason (Preempted, PodsReadyTimeout, NodeFailures, ClusterQueueStopped, ...):
      Kueue would resume the same TrainJob; the attempt ends with the cause (preempted, node-lost, evicted),
      the Evicted and Preempted conditions as evidence, and the deactivation for the cycle to do.
    - re-admitted after an eviction dispatch did not see (Evicted False, status.schedulingStats.evictions
      counts one): the ranks ran again already; the attempt ends the same way."""
    for wl in workloads:
        meta = _meta(wl)
        active = _m(wl.get("spec")).get("active") is not False
        act = {
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "key": kueue_mark_key(label_domain),
        }
        mark = _mark(wl, label_domain)
        evicted = _true(wl, "Evicted")
        if mark is not None:
            kept = [c for c in (mark.get("evicted"), mark.get("preempted")) if isinstance(c, Mapping)]
            ev = [e for c in kept for e in _cond_ev(wl, c, str(c.get("type") or "Evicted"))]
            ev += [
                _ev(
                    object_ref("Workload", wl),
                    f"metadata.annotations[{kueue_mark_key(label_domain)}]",
                    f"deactivated by dispatch at {mark.get('at', '')}",
                )
            ]
            redo = {**act, "mark": mark} if active else None  # made active again: deactivate again
            return KueueEviction(str(mark["cause"]), str(mark.get("message") or ""), ev, redo)
        reason = str((evicted or {}).get("reason", ""))
        if evicted and reason == "Deactivated":
            return KueueEviction(
                CANCELLED,
                "the Kueue Workload was deactivated outside dispatch: it will not be admitted again",
                _cond_ev(wl, evicted, "Evicted"),
            )
        if evicted and reason.startswith("Deactivated"):
            cause = _eviction_cause(reason)
            message = (
                "the Kueue Workload ran past its maximum execution time"
                if cause == TIMEOUT
                else f"the Kueue Workload was deactivated ({reason.removeprefix('DeactivatedDueTo')}): "
                "it will not be admitted again"
            )
            return KueueEviction(cause, message, _cond_ev(wl, evicted, "Evicted"))
        preempted = condition(wl, "Preempted")
        if evicted:
            why = evicted
        else:
            history = [
                _m(e)
                for e in _l(_m(_m(wl.get("status")).get("schedulingStats")).get("evictions"))
                if not str(_m(e).get("reason", "")).startswith("Deactivated")
                and (_int(_m(e).get("count")) or 0)
            ]
            if not history:
                continue
            # Re-admitted: Evicted and Preempted read False "Previously: <message>".
            why = {
                "type": "Evicted",
                "status": "True",
                "reason": str(history[0].get("reason", "")),
                "message": str((condition(wl, "Evicted") or {}).get("message", "")),
                "lastTransitionTime": (condition(wl, "Evicted") or {}).get("lastTransitionTime"),
            }
        cause = _eviction_cause(str(why.get("reason", "")))
        preempted_true = preempted if (preempted or {}).get("status") == "True" or not evicted else None
        message = _eviction_message(cause, why, preempted_true)
        ev = _cond_ev(wl, why, "Evicted") + _cond_ev(wl, preempted_true, "Preempted")
        if not evicted:
            ev.append(_ev(object_ref("Workload", wl), "status.schedulingStats.evictions", str(history[0])))
        recorded = {
            "cause": cause,
            "message": message,
            "evicted": _kept(why),
            "preempted": _kept(preempted_true),
        }
        return KueueEviction(
            cause,
            message,
            ev,
            {**act, "mark": recorded} if active else None,
        )
    return None


def kueue_queued_reason(workloads: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Why the execution's Workload waits, from its conditions (status-facts §7): `awaiting-quota` (Kueue's
    message names the resource, the flavor and how much more is needed), `inadmissible` (a missing or stopped
    queue), `awaiting-admission-checks` (quota reserved, checks pending), `awaiting-admission` (admitted, the
    TrainJob not resumed yet). Empty without a Workload. The queue position is added by the cycle (the
    visibility API)."""
    for wl in workloads:
        spec, st = _m(wl.get("spec")), _m(wl.get("status"))
        where: dict[str, Any] = {
            "namespace": _meta(wl).get("namespace"),
            "workload": _meta(wl).get("name"),
            "local_queue": spec.get("queueName"),
        }
        cluster_queue = _m(st.get("admission")).get("clusterQueue")
        if cluster_queue:
            where["cluster_queue"] = cluster_queue
        reserved = condition(wl, "QuotaReserved")
        admitted = _true(wl, "Admitted")
        queue = f"LocalQueue {spec.get('queueName')}" if spec.get("queueName") else "its LocalQueue"
        if admitted:
            return {
                **where,
                "reason": "awaiting-admission",
                "message": "admitted by Kueue; the TrainJob is being resumed",
                "since": admitted.get("lastTransitionTime"),
            }
        if reserved is not None and reserved.get("status") == "True":
            return {
                **where,
                "reason": "awaiting-admission-checks",
                "message": f"quota reserved in {queue}; waiting for its admission checks",
                "since": reserved.get("lastTransitionTime"),
            }
        reason = str((reserved or {}).get("reason", ""))
        message = str((reserved or {}).get("message", ""))
        if reason == "Inadmissible":
            return {
                **where,
                "reason": "inadmissible",
                "message": f"Kueue cannot admit it: {message}",
                "since": reserved.get("lastTransitionTime") if reserved else None,
            }
        text = f"waiting for quota in {queue}"
        if message:
            text += f": {message}"
        else:  # not evaluated yet, or equivalent to a workload found inadmissible (no condition at all)
            text += ": Kueue has not admitted it yet"
        return {
            **where,
            "reason": "awaiting-quota",
            "message": text,
            "since": (reserved or {}).get("lastTransitionTime") or _meta(wl).get("creationTimestamp"),
        }
    return {}


def pods_ready_note(workloads: Sequence[Mapping[str, Any]]) -> str:
    """Kueue waits for the pods to be ready (waitForPodsReady), and evicts the Workload past its timeout."""
    for wl in workloads:
        ready = condition(wl, "PodsReady")
        if _true(wl, "Admitted") and ready is not None and ready.get("status") == "False":
            return (
                f"Kueue waits for the pods to be ready ({ready.get('reason', '')}) "
                "and evicts the Workload past its timeout"
            )
    return ""


def merge_memory(stored: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The pods' memory to write: what a derivation remembered (`new`), plus any pod another writer stored
    meanwhile that it did not see. Memory is only added to, and a pod's DisruptionTarget once seen is kept
    (the last state of a pod that vanished is the evidence), so it never goes back."""
    merged = dict(new)
    for uid, pod in stored.items():
        mine = merged.get(uid)
        if mine is None:
            merged[uid] = pod
        elif pod.get("disruption") and not mine.get("disruption"):
            merged[uid] = {**mine, "disruption": pod["disruption"]}
    return merged
