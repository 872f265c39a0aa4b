"""Pods: condensed to what supervision remembers across cycles, and classified one by one (status-facts §10
precedence: DisruptionTarget > pod status.reason > OOMKilled > config reasons > events > image pull > a
non-zero exit > a lost node). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jobs.podresources import pod_compute
from jobs.supervision.status.events import EventView
from jobs.supervision.status.model import (
    APP_ERROR,
    COMPLETION_INDEX,
    CONFIG_ERROR,
    CONFIG_TERMINATED_REASONS,
    CONFIG_WAITING_REASONS,
    DEFAULT_GRACE_SECONDS,
    EVICTED,
    IMAGE_PULL,
    IMAGE_PULL_REASONS,
    JOB_INDEX,
    KILL_EXIT_CODES,
    KILLED,
    NO_CAPACITY,
    NO_CAPACITY_POD_REASONS,
    NODE_LOST,
    NODE_LOST_TAINTS,
    OOM,
    PREEMPTED,
    REPLICATED_JOB,
    RESTART_ATTEMPT,
    TIMEOUT,
    UNKNOWN_FAILURE,
)
from jobs.supervision.status.readers import (
    as_int,
    as_list,
    as_map,
    attempt_of,
    condition,
    evidence_row,
    iso,
    labels_of,
    meta_of,
    pod_ref,
    true_condition,
)
from jobs.waits import parse_time


def _container_rows(statuses: object, sidecars: frozenset[str]) -> list[dict[str, Any]]:
    rows = []
    for raw in as_list(statuses):
        status = as_map(raw)
        state = as_map(status.get("state"))
        last = as_map(as_map(status.get("lastState")).get("terminated"))
        terminated = as_map(state.get("terminated"))
        waiting = as_map(state.get("waiting"))
        rows.append(
            {
                "name": status.get("name", ""),
                "restarts": as_int(status.get("restartCount")) or 0,
                "sidecar": status.get("name") in sidecars,
                "running": "running" in state,
                "waiting": waiting.get("reason") if waiting else None,
                "waiting_message": waiting.get("message") if waiting else None,
                "terminated": terminated.get("reason") if terminated else None,
                "exit_code": as_int(terminated.get("exitCode")) if terminated else None,
                "started_at": as_map(state.get("running")).get("startedAt") or terminated.get("startedAt"),
                "finished_at": terminated.get("finishedAt") if terminated else None,
                "last_terminated": last.get("reason") if last else None,
                "last_exit_code": as_int(last.get("exitCode")) if last else None,
                "last_finished_at": last.get("finishedAt") if last else None,
            }
        )
    return rows


def condense_pod(pod: Mapping[str, Any], label_domain: str) -> dict[str, Any]:
    """What supervision needs of a pod, small enough to remember across cycles (JSON)."""
    meta = meta_of(pod)
    spec = as_map(pod.get("spec"))
    status = as_map(pod.get("status"))
    labels = labels_of(pod)
    annotations = as_map(meta.get("annotations"))
    sidecars = frozenset(
        str(as_map(c).get("name"))
        for c in as_list(spec.get("initContainers"))
        if as_map(c).get("restartPolicy") == "Always"
    )
    disruption = true_condition(pod, "DisruptionTarget")
    scheduled = condition(pod, "PodScheduled")
    rank = as_int(labels.get(COMPLETION_INDEX))
    if rank is None:
        rank = as_int(annotations.get(COMPLETION_INDEX))
    return {
        "uid": meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}",
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "rank": rank,
        "attempt": attempt_of(pod, label_domain),
        "restart_attempt": as_int(labels.get(RESTART_ATTEMPT)) or 0,
        "replicated_job": labels.get(REPLICATED_JOB, ""),
        "job_index": as_int(labels.get(JOB_INDEX)) or 0,
        "created": meta.get("creationTimestamp"),
        "deleting": meta.get("deletionTimestamp"),
        **(
            {"deletion_grace": as_int(meta.get("deletionGracePeriodSeconds"))}
            if meta.get("deletionTimestamp")
            else {}
        ),
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
        **pod_compute(spec),  # gpus, cpus: what it holds while it runs (jobs.usage)
        "gone": None,
    }


@dataclass(frozen=True)
class PodFailure:
    cause: str
    pod: dict[str, Any]
    at: datetime | None
    evidence: list[dict[str, Any]]
    exit_code: int | None = None
    container: str = ""


def node_lost(
    node_name: str, nodes: Mapping[str, Mapping[str, Any]], unread: frozenset[str] = frozenset()
) -> tuple[bool, list[dict[str, Any]]]:
    """Is the node gone or unreachable, with the evidence that says so. A node that could not be read proves
    nothing either way."""
    if not node_name:
        return False, []
    node = nodes.get(node_name)
    if node is None and node_name in unread:
        return False, [evidence_row(f"Node {node_name}", "metadata", "could not be read")]
    if node is None:
        return True, [evidence_row(f"Node {node_name}", "metadata", "not found (deleted)")]
    evidence = []
    for taint in as_list(as_map(node.get("spec")).get("taints")):
        taint = as_map(taint)
        if taint.get("key") in NODE_LOST_TAINTS:
            evidence.append(
                evidence_row(f"Node {node_name}", "spec.taints", f"{taint.get('key')}:{taint.get('effect')}")
            )
    ready = condition(node, "Ready")
    if ready is not None and ready.get("status") != "True":
        evidence.append(
            evidence_row(
                f"Node {node_name}",
                "status.conditions[Ready]",
                f"{ready.get('status')} {ready.get('reason', '')}".strip(),
                ready.get("lastTransitionTime"),
            )
        )
    return bool(evidence), evidence


def failed_container(pod: Mapping[str, Any]) -> dict[str, Any] | None:
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
    ref = pod_ref(pod)
    d = pod
    disruption = d.get("disruption")
    container = failed_container(d)
    exit_code = container.get("exit_code") if container else None
    finished = parse_time(container.get("finished_at")) if container else None
    reason = d.get("reason") or ""

    def failure(cause: str, at: Any, evidence: list[dict[str, Any]]) -> PodFailure:
        extra = []
        if container:
            extra.append(
                evidence_row(
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
        ev = [evidence_row(ref, "status.conditions[DisruptionTarget].reason", dr, at)]
        if dr == "PreemptionByScheduler":
            return failure(PREEMPTED, at, ev)
        if dr == "DeletionByPodGC":
            return failure(NODE_LOST, at, ev + node_lost(d.get("node", ""), nodes, unread_nodes)[1])
        if dr == "DeletionByTaintManager":
            lost, node_ev = node_lost(d.get("node", ""), nodes, unread_nodes)
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
        ev = [evidence_row(ref, "status.reason", reason)]
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
                        evidence_row(
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
                    evidence_row(ref, f"status.containerStatuses[{row['name']}].{where}.reason", which),
                    *(
                        [evidence_row(ref, f"status.containerStatuses[{row['name']}].{where}.message", msg)]
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
            return failure(
                PREEMPTED, event.at, [evidence_row(ref, "event[Preempted]", event.message, event.at)]
            )
        if event.reason == "TaintManagerEviction" and event.message.startswith("Marking for deletion"):
            lost, node_ev = node_lost(d.get("node", ""), nodes, unread_nodes)
            return failure(
                NODE_LOST if lost else EVICTED,
                event.at,
                [evidence_row(ref, "event[TaintManagerEviction]", event.message, event.at), *node_ev],
            )
        if event.reason == "Evicted":
            return failure(EVICTED, event.at, [evidence_row(ref, "event[Evicted]", event.message, event.at)])

    # 6. Image pull: only a failure when it is what stopped the pod.
    for row in [*d.get("containers", []), *d.get("init_containers", [])]:
        if row.get("waiting") in IMAGE_PULL_REASONS and d.get("phase") == "Failed":
            return PodFailure(
                cause=IMAGE_PULL,
                pod=dict(d),
                at=None,
                evidence=[
                    evidence_row(
                        ref, f"status.containerStatuses[{row['name']}].state.waiting.reason", row["waiting"]
                    )
                ],
                container=row["name"],
            )

    # 7. The application exited non-zero, unless the pod's deletion stopped it: a container that ended 137 or
    # 143 once the deletion was asked for was killed by it (status-facts §10 precedence 3). Then a lost node
    # (8) may explain the deletion; otherwise the kill is evidence only, never the cause.
    deleted_at = deletion_requested(d)
    killed = container is not None and killed_by(container, deleted_at)
    if container is not None and not killed:
        return failure(APP_ERROR, container.get("finished_at"), [])

    # 8. Gone without a word: the node it ran on is gone or unreachable. A pod only being deleted (the Job or
    # JobSet controller sets no DisruptionTarget, status-facts §1.2) needs its node seen NotReady or tainted
    # unreachable (§10): a node merely absent from the input proves nothing for a pod still listed (PodGC
    # would have written DeletionByPodGC on it).
    if d.get("gone") or d.get("deleting"):
        lost, node_ev = node_lost(d.get("node", ""), nodes, unread_nodes)
        if lost and (d.get("gone") or d.get("node", "") in nodes):
            return failure(
                NODE_LOST,
                d.get("gone") or d.get("deleting"),
                [
                    evidence_row(ref, "metadata", "gone" if d.get("gone") else "deleting", d.get("gone")),
                    *node_ev,
                ],
            )
    if killed:
        return failure(
            KILLED,
            deleted_at,
            [evidence_row(ref, "metadata.deletionTimestamp", d.get("deleting"), iso(deleted_at))],
        )
    if d.get("phase") == "Failed":
        return failure(UNKNOWN_FAILURE, None, [evidence_row(ref, "status.phase", "Failed")])
    return None


def deletion_requested(pod: Mapping[str, Any]) -> datetime | None:
    """When the pod's deletion was asked for: its deletionTimestamp is that moment plus the grace period."""
    deleting = parse_time(pod.get("deleting"))
    if deleting is None:
        return None
    grace = pod.get("deletion_grace")
    return deleting - timedelta(seconds=grace if isinstance(grace, int) else DEFAULT_GRACE_SECONDS)


def killed_by(container: Mapping[str, Any], deleted_at: datetime | None) -> bool:
    """The container ended by a signal (137, 143) no earlier than the pod's deletion was asked for (a second
    of slack: the kubelet's times have whole seconds)."""
    if deleted_at is None or container.get("exit_code") not in KILL_EXIT_CODES:
        return False
    finished = parse_time(container.get("finished_at"))
    return finished is None or finished >= deleted_at - timedelta(seconds=1)


# ---------------------------------------------------------------- identity


def rank_row(pod: Mapping[str, Any], first_failed_uid: str | None) -> dict[str, Any]:
    containers = pod.get("containers", [])
    node_row = next((c for c in containers if c.get("name") == "node"), containers[0] if containers else {})
    failed = failed_container(pod)
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


def sentence(failure: PodFailure, attempt: int | None) -> str:
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
        KILLED: f"{who} was stopped by the deletion of its pod{at} (exit code {failure.exit_code}){inn}",
    }
    return texts.get(failure.cause, f"{who} failed{at}{inn}")


def ran(pods: Iterable[Mapping[str, Any]]) -> bool:
    """Did any pod run: seen Running or finished, or a container that started or ended."""
    for pod in pods:
        if pod.get("phase") in ("Running", "Succeeded", "Failed") and not pod.get("unschedulable"):
            return True
        for row in [*pod.get("containers", []), *pod.get("init_containers", [])]:
            started = row.get("running") or row.get("terminated") or row.get("last_terminated")
            if started and not row.get("sidecar"):
                return True
    return False


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


FINISHED_PHASES = ("Succeeded", "Failed")


def with_tombstone(remembered: Mapping[str, Any] | None, deleted: Mapping[str, Any]) -> dict[str, Any]:
    """A pod's memory once a watch delivered it deleted (`deleted`, condensed). The deletion carries the
    pod's last state, so it wins over what earlier cycles read; when it was found gone is kept. But one pod
    can be delivered deleted more than once, and a lagging watch (another supervisor's, or a re-list) can
    deliver an older state after a cycle used the newer one and its tombstone went: such a delivery never
    takes back a DisruptionTarget the memory holds, nor a finished phase (no pod runs again after Succeeded
    or Failed). Pure."""
    if remembered is None:
        return dict(deleted)
    if remembered.get("phase") in FINISHED_PHASES and deleted.get("phase") not in FINISHED_PHASES:
        return {**remembered, "disruption": remembered.get("disruption") or deleted.get("disruption")}
    merged = {**deleted, "gone": remembered.get("gone")}
    if remembered.get("disruption") and not deleted.get("disruption"):
        merged["disruption"] = remembered["disruption"]
    return merged


_DISRUPTED: dict[str, str] = {
    PREEMPTED: "was preempted",
    EVICTED: "was evicted",
    NODE_LOST: "lost its node",
}


def disrupted_but_succeeded(
    pods: Iterable[Mapping[str, Any]],
    pod_events: Mapping[str, Sequence[EventView]],
    nodes: Mapping[str, Mapping[str, Any]],
    unread_nodes: frozenset[str] = frozenset(),
) -> list[tuple[Any, str, list[dict[str, Any]]]]:
    """Pods that ended Succeeded although a disruption stopped them (status-facts §12: a rank whose
    application exits 0 on SIGTERM completes its index): (rank, what happened, evidence), by rank."""
    found = []
    for pod in pods:
        if pod.get("phase") != "Succeeded":
            continue
        failure = classify_pod(pod, pod_events.get(str(pod.get("name")), []), nodes, unread_nodes)
        ref = pod_ref(pod)
        node_row = next((c for c in pod.get("containers", []) if c.get("name") == "node"), None)
        exited = (
            [
                evidence_row(
                    ref,
                    f"status.containerStatuses[{node_row['name']}].state.terminated",
                    f"{node_row.get('terminated')} (exit code {node_row.get('exit_code')})",
                    node_row.get("finished_at"),
                )
            ]
            if node_row and node_row.get("terminated")
            else []
        )
        if failure is not None and failure.cause in _DISRUPTED:
            found.append((pod.get("rank"), _DISRUPTED[failure.cause], failure.evidence + exited))
            continue
        deleted_at = deletion_requested(pod)
        finished = parse_time((node_row or {}).get("finished_at"))
        if deleted_at is not None and (finished is None or finished >= deleted_at - timedelta(seconds=1)):
            what = "was stopped by the deletion of its pod"
            ev = [evidence_row(ref, "metadata.deletionTimestamp", pod.get("deleting"), iso(deleted_at))]
            found.append((pod.get("rank"), what, ev + exited))
    found.sort(key=lambda item: item[0] if isinstance(item[0], int) else -1)
    return found
