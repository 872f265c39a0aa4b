"""Pure decisions about a session whose MultiKueue worker is lost (issue 35): the same signal a job's attempt
ends `cluster-lost` on (jobs.supervision.status.kueue), the manager's Workload evicted by Kueue because the
admitting worker could not be reached past workerLostTimeout. The session's pods and its commands were on
that worker only; MultiKueue would place the same TrainJob on another worker, a new trainer pod the session
never ran a command in. So the session ends, naming the worker, and its Workload is deactivated with
dispatch's mark (kept on the Workload: a second look finds the decision already made)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from jobs.naming import WORKER_LOST, kueue_mark_key

# The cause code a job's attempt ends with for the same loss (jobs.supervision.status.CLUSTER_LOST).
CLUSTER_LOST: Final = "cluster-lost"


@dataclass(frozen=True)
class WorkerLoss:
    """The session's worker is lost: the session's `message`, what Kueue said (`evidence`), and the
    Workload to deactivate (`workload`: namespace, name, uid; None when it is inactive already)."""

    message: str
    evidence: str
    workload: dict[str, str] | None


def _controlled_by(wl: Mapping[str, Any], trainjob_uid: str) -> bool:
    refs = (wl.get("metadata") or {}).get("ownerReferences") or ()
    return bool(trainjob_uid) and any(r.get("controller") and r.get("uid") == trainjob_uid for r in refs)


def _evicted(wl: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (wl.get("status") or {}).get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == "Evicted":
            return cond
    return None


def _mark(wl: Mapping[str, Any], label_domain: str) -> dict[str, Any] | None:
    raw = ((wl.get("metadata") or {}).get("annotations") or {}).get(kueue_mark_key(label_domain))
    try:
        value = json.loads(str(raw)) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def lost_message(worker: str, evidence: str) -> str:
    return (
        f"its MultiKueue worker {worker or '(not named)'} was lost: Kueue evicted the session's Workload "
        f"({evidence}). Its trainer pod and every command ran there only, so dispatch ended the session "
        "rather than let MultiKueue start its TrainJob again on another worker; open a new session"
    )


def worker_loss(
    workloads: Sequence[Mapping[str, Any]], *, trainjob_uid: str, label_domain: str, worker: str
) -> WorkerLoss | None:
    """Whether the manager's Workloads of the session's TrainJob (those it controls, by `trainjob_uid`) say
    its worker (`worker`, the one the session recorded) is lost: dispatch's own mark for that (it decided so
    before), or an Evicted condition, current or previous (Kueue may have admitted it again elsewhere
    meanwhile: the condition then reads False with the earlier message), whose message is MultiKueue's
    "Admitting remote lost". A mark dispatch left for another reason (a close) is not a loss. Pure."""
    for wl in workloads:
        if not _controlled_by(wl, trainjob_uid):
            continue
        meta = wl.get("metadata") or {}
        active = (wl.get("spec") or {}).get("active") is not False
        act = {k: str(meta.get(k) or "") for k in ("namespace", "name", "uid")}
        mark = _mark(wl, label_domain)
        if mark is not None:
            if mark.get("cause") != CLUSTER_LOST:
                continue
            evidence = str(mark.get("evidence") or WORKER_LOST)
            return WorkerLoss(
                str(mark.get("message") or lost_message(worker, evidence)), evidence, act if active else None
            )
        evicted = _evicted(wl)
        text = str((evicted or {}).get("message") or "")
        if evicted is None or WORKER_LOST not in text:
            continue
        evidence = f"Workload {act['namespace']}/{act['name']} Evicted {evicted.get('reason', '')}: {text}"
        return WorkerLoss(lost_message(worker, evidence), evidence, act if active else None)
    return None


def loss_mark(loss: WorkerLoss, *, worker: str, now: datetime) -> dict[str, Any]:
    """dispatch's mark on the Workload it deactivates for the loss (jobs.naming.kueue_mark_key). Pure."""
    return {
        "cause": CLUSTER_LOST,
        "by": "dispatch",
        "worker": worker,
        "message": loss.message,
        "evidence": loss.evidence,
        "at": now.isoformat(),
    }
