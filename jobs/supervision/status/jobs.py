"""Jobs, JobSets and TrainJobs: their conditions, and the messages that name a failed or disrupted pod after
the pod is gone (a podFailurePolicy's message, status-facts §3). Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from jobs.supervision.status.events import EventView, scheduled_node
from jobs.supervision.status.model import (
    APP_ERROR,
    EVICTED,
    NODE_LOST,
    PREEMPTED,
    RESTART_ATTEMPT,
    TIMEOUT,
)
from jobs.supervision.status.pods import node_lost
from jobs.supervision.status.readers import (
    as_int,
    as_list,
    as_map,
    evidence_row,
    labels_of,
    name_of,
    object_ref,
    true_condition,
)

_EXIT_CODE_IN_MESSAGE: Final = re.compile(r"Container (\S+) for pod (\S+) failed with exit code (\d+)")
# A Job's failure when a runtime's podFailurePolicy FailJob rule on DisruptionTarget matched (platform teams
# may add one): it names the pod after the pod is gone [K: pod_failure_policy.go, status-facts §3].
DISRUPTION_IN_MESSAGE: Final = re.compile(
    r"Pod (\S+)/(\S+) has condition DisruptionTarget matching FailJob rule"
)


def raw_conditions(kind: str, obj: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if not obj:
        return []
    rows = []
    for cond in as_list(as_map(obj.get("status")).get("conditions")):
        cond = as_map(cond)
        if cond.get("status") == "True":
            rows.append(
                evidence_row(
                    object_ref(kind, obj),
                    f"status.conditions[{cond.get('type')}]",
                    f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": "),
                    cond.get("lastTransitionTime"),
                )
            )
    return rows


def failure_from_job_messages(
    jobs: Sequence[Mapping[str, Any]],
) -> tuple[str, str, list[dict[str, Any]], int | None, int | None] | None:
    """A Job's PodFailurePolicy message names the container and exit code even after the pod is gone."""
    for job in jobs:
        for kind in ("Failed", "FailureTarget"):
            cond = true_condition(job, kind)
            if not cond:
                continue
            match = _EXIT_CODE_IN_MESSAGE.search(str(cond.get("message", "")))
            if match:
                code = int(match.group(3))
                ev = [job_message_evidence(job, kind, cond)]
                # An Indexed Job's pod is named <job>-<index>-<suffix> [K: podGenerateNameWithIndex].
                pod_name = match.group(2).rpartition("/")[2]
                index = pod_name.removeprefix(f"{name_of(job)}-").split("-")[0]
                rank = as_int(index) if pod_name.startswith(f"{name_of(job)}-") else None
                return APP_ERROR, f"pod {match.group(2)} exited with code {code}", ev, rank, code
            if cond.get("reason") == "DeadlineExceeded":
                ev = [
                    evidence_row(
                        object_ref("Job", job), f"status.conditions[{kind}].reason", "DeadlineExceeded"
                    )
                ]
                return TIMEOUT, "a Job ran past its activeDeadlineSeconds", ev, None, None
    return None


def job_message_evidence(job: Mapping[str, Any], kind: str, cond: Mapping[str, Any]) -> dict[str, Any]:
    return evidence_row(
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
            cond = true_condition(job, kind)
            match = DISRUPTION_IN_MESSAGE.search(str(cond.get("message", ""))) if cond else None
            if match:
                out.append((job, kind, match.group(2)))
                break
    return out


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
        ev = [job_message_evidence(job, kind, true_condition(job, kind) or {})]
        index = pod_name.removeprefix(f"{name_of(job)}-").split("-")[0]
        rank = as_int(index) if pod_name.startswith(f"{name_of(job)}-") else None
        events = pod_events.get(pod_name, [])
        ref = f"Pod {pod_name}"
        cause, how = EVICTED, "evicted: no preemption, taint eviction or lost node is recorded for it"
        for event in events:
            if event.reason == "Preempted":
                cause, how = PREEMPTED, "preempted by the scheduler"
                ev.append(evidence_row(ref, "event[Preempted]", event.message, event.at))
                break
            if event.reason == "Evicted":
                cause, how = EVICTED, "evicted by the kubelet"
                ev.append(evidence_row(ref, "event[Evicted]", event.message, event.at))
                break
            if event.reason == "TaintManagerEviction" and event.message.startswith("Marking for deletion"):
                ev.append(evidence_row(ref, "event[TaintManagerEviction]", event.message, event.at))
                cause, how = EVICTED, "evicted for a NoExecute taint"
                break
        node = scheduled_node(events, pod_name)
        if cause == EVICTED and node and (node in nodes or node not in unread_nodes):
            # needs_nodes (jobs.supervision.nodes) asked for this node: absent means deleted.
            lost, node_ev = node_lost(node, nodes, unread_nodes)
            if lost:
                cause, how = NODE_LOST, f"its node {node} is gone or unreachable"
                ev += node_ev
        who = f"rank {rank}" if rank is not None else f"pod {pod_name}"
        text = (
            f"{who} was disrupted ({how}); the pod was gone before dispatch read it, "
            f"and Job {name_of(job)}'s failure names it"
        )
        return cause, text, ev, rank, None
    return None


def failed_job_conditions(jobs: Sequence[Mapping[str, Any]], restart_attempt: int) -> list[dict[str, Any]]:
    """The Failed (else FailureTarget) condition of each failed Job of the current JobSet restart-attempt."""
    out = []
    for job in jobs:
        if (as_int(labels_of(job).get(RESTART_ATTEMPT)) or 0) != restart_attempt:
            continue
        cond = true_condition(job, "Failed") or true_condition(job, "FailureTarget")
        if cond:
            out.append(
                evidence_row(
                    object_ref("Job", job),
                    f"status.conditions[{cond.get('type')}]",
                    f"{cond.get('reason')}: {cond.get('message')}",
                    cond.get("lastTransitionTime"),
                )
            )
    return out
