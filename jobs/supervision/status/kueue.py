"""Kueue Workloads: an eviction ends the attempt, and why a Workload waits (status-facts §7, §12). Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from jobs.naming import WORKER_LOST, kueue_mark_key
from jobs.supervision.status.model import (
    CANCELLED,
    CLUSTER_LOST,
    CONFIG_ERROR,
    EVICTED,
    NODE_LOST,
    PREEMPTED,
    TIMEOUT,
)
from jobs.supervision.status.readers import (
    as_int,
    as_list,
    as_map,
    condition,
    evidence_row,
    meta_of,
    object_ref,
    true_condition,
)
from jobs.waits import parse_time

_PREEMPTOR: Final = re.compile(r"\(UID: ([^,]+), JobUID: ([^)]+)\) due to ([^;]+)")


@dataclass(frozen=True)
class KueueEviction:
    cause: str
    message: str
    evidence: list[dict[str, Any]]
    act: dict[str, Any] | None = None  # the deactivation the cycle must do (None: nothing left to do)


def _eviction_cause(reason: str, message: str = "") -> str:
    if reason == "AdmissionCheck" and WORKER_LOST in message:
        return CLUSTER_LOST
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
        evidence_row(
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
    raw = as_map(meta_of(wl).get("annotations")).get(kueue_mark_key(label_domain))
    if not raw:
        return None
    try:
        value = json.loads(str(raw))
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get("cause") else None


def admitted_cluster(workloads: Sequence[Mapping[str, Any]]) -> str:
    """The MultiKueue worker cluster the attempt's Workload was admitted to (status.clusterName); "" when it
    runs where it was submitted. An eviction clears it: the caller keeps the name it recorded."""
    for wl in workloads:
        name = as_map(wl.get("status")).get("clusterName")
        if isinstance(name, str) and name:
            return name
    return ""


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
        meta = meta_of(wl)
        active = as_map(wl.get("spec")).get("active") is not False
        act = {
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "key": kueue_mark_key(label_domain),
        }
        mark = _mark(wl, label_domain)
        evicted = true_condition(wl, "Evicted")
        if mark is not None:
            kept = [c for c in (mark.get("evicted"), mark.get("preempted")) if isinstance(c, Mapping)]
            ev = [e for c in kept for e in _cond_ev(wl, c, str(c.get("type") or "Evicted"))]
            ev += [
                evidence_row(
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
                as_map(e)
                for e in as_list(as_map(as_map(wl.get("status")).get("schedulingStats")).get("evictions"))
                if not str(as_map(e).get("reason", "")).startswith("Deactivated")
                and (as_int(as_map(e).get("count")) or 0)
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
        cause = _eviction_cause(str(why.get("reason", "")), str(why.get("message", "")))
        preempted_true = preempted if (preempted or {}).get("status") == "True" or not evicted else None
        message = _eviction_message(cause, why, preempted_true)
        ev = _cond_ev(wl, why, "Evicted") + _cond_ev(wl, preempted_true, "Preempted")
        if not evicted:
            ev.append(
                evidence_row(object_ref("Workload", wl), "status.schedulingStats.evictions", str(history[0]))
            )
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
        spec, st = as_map(wl.get("spec")), as_map(wl.get("status"))
        where: dict[str, Any] = {
            "namespace": meta_of(wl).get("namespace"),
            "workload": meta_of(wl).get("name"),
            "local_queue": spec.get("queueName"),
        }
        cluster_queue = as_map(st.get("admission")).get("clusterQueue")
        if cluster_queue:
            where["cluster_queue"] = cluster_queue
        reserved = condition(wl, "QuotaReserved")
        admitted = true_condition(wl, "Admitted")
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
            "since": (reserved or {}).get("lastTransitionTime") or meta_of(wl).get("creationTimestamp"),
        }
    return {}


def pods_ready_note(workloads: Sequence[Mapping[str, Any]]) -> str:
    """Kueue waits for the pods to be ready (waitForPodsReady), and evicts the Workload past its timeout."""
    for wl in workloads:
        ready = condition(wl, "PodsReady")
        if true_condition(wl, "Admitted") and ready is not None and ready.get("status") == "False":
            return (
                f"Kueue waits for the pods to be ready ({ready.get('reason', '')}) "
                "and evicts the Workload past its timeout"
            )
    return ""


INADMISSIBLE_REASONS: Final = frozenset({"Inadmissible", "Misconfigured"})


@dataclass(frozen=True)
class DeadEnd:
    """A Workload that will never run the TrainJob: the failure to record (dispatch then stops it)."""

    cause: str
    message: str
    evidence: list[dict[str, Any]]


def kueue_dead_end(
    workloads: Sequence[Mapping[str, Any]], now: datetime, inadmissible_after: float
) -> tuple[DeadEnd | None, datetime | None]:
    """A Workload Kueue will never run (status-facts §10, config-error): Finished=True FailedToStart (Kueue
    admitted it but could not start the TrainJob, and gave up [Q: jobframework/reconciler.go]), or
    QuotaReserved=False Inadmissible (a missing LocalQueue or ClusterQueue, an unsupported resource claim:
    [Q: core/workload_controller.go]; a stopped queue is not one) for
    `inadmissible_after` seconds. Before, both read `queued` for ever. Returns (the dead end or None, when
    to look again or None)."""
    for wl in workloads:
        finished = true_condition(wl, "Finished")
        if finished is not None and finished.get("reason") == "FailedToStart":
            return (
                DeadEnd(
                    CONFIG_ERROR,
                    f"Kueue could not start the TrainJob and gave up: {finished.get('message', '')}",
                    _cond_ev(wl, finished, "Finished"),
                ),
                None,
            )
        reserved = condition(wl, "QuotaReserved")
        if reserved is None or reserved.get("status") != "False":
            continue
        # "Misconfigured" with the UnadmittedWorkloadsObservability gate. A stopped queue is the platform
        # team's deliberate hold (stopPolicy), reversible: the job waits it out.
        if reserved.get("reason") not in INADMISSIBLE_REASONS or str(reserved.get("message", "")).endswith(
            " is stopped"
        ):
            continue
        since = parse_time(reserved.get("lastTransitionTime"))
        if since is None:
            continue
        waited = (now - since).total_seconds()
        if waited < inadmissible_after:
            return None, since + timedelta(seconds=inadmissible_after)
        return (
            DeadEnd(
                CONFIG_ERROR,
                f"Kueue could not admit the Workload for {int(waited)} s: {reserved.get('message', '')}",
                _cond_ev(wl, reserved, "QuotaReserved"),
            ),
            None,
        )
    return None, None
