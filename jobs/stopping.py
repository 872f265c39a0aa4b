"""Stopping a TrainJob before it is deleted, for a job's attempt (jobs.submission.cancel) and a session
(jobs.sessions.services) alike: the Trainer rebuilds the JobSet of a TrainJob it still holds when the JobSet
goes (status-facts §12), so a TrainJob is deleted only once it is stopped (jobs.objects.trainjob_stopped), or
when a stop the cluster accepted has had STOP_WAIT_SECONDS to show and did not."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Final

from django.db.models import QuerySet
from django.utils import timezone

from cluster import gateway, kueue
from jobs.naming import KUEUE_QUEUE_LABEL, kueue_mark_key
from jobs.objects import TRAINJOB, kueue_lets_suspend

# How long a delete waits for the Trainer to show a TrainJob stopped before it deletes it anyway (the Trainer
# is down, say: then nothing can rebuild the JobSet either), counted from the first stop the cluster accepted,
# never from the request: a delete delivered late stops first.
STOP_WAIT_SECONDS: Final = 30.0

# How long one delete pass waits, between reads, for what it deleted to be gone before it leaves the rest to
# the next pass (a job's delete task's retry, a session's next close look).
GONE_WAITS: Final = (0.1, 0.2, 0.4, 0.8)


class StopClock:
    """When the cluster first accepted a TrainJob's stop: kept on its row (`rows`: the Execution or Session,
    by primary key; its `stop_accepted_at`), compare-and-set so that two deliveries at once keep the first,
    and read back by every later one. Without rows, kept in memory only."""

    def __init__(self, *, rows: QuerySet[Any] | None, accepted_at: datetime | None) -> None:
        self.rows = rows
        self.accepted_at = accepted_at

    def accepted(self) -> None:
        if self.accepted_at is not None:
            return
        now = timezone.now()
        if self.rows is not None:
            self.rows.filter(stop_accepted_at__isnull=True).update(stop_accepted_at=now)
            now = self.rows.values_list("stop_accepted_at", flat=True).first() or now
        self.accepted_at = now

    def ran_out(self) -> bool:
        """The fallback: a stop was accepted STOP_WAIT_SECONDS ago and the Trainer still shows none."""
        if self.accepted_at is None:
            return False
        return (timezone.now() - self.accepted_at).total_seconds() >= STOP_WAIT_SECONDS


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def trainjob_stop(*, namespace: str, trainjob: dict[str, Any], label_domain: str, cause: str) -> None:
    """Ask for the TrainJob to stop (idempotent; returns once the cluster accepted it). Without Kueue:
    spec.suspend. Under Kueue, which owns spec.suspend (it resumes a suspended TrainJob whose Workload is
    admitted), first by deactivating its Workload with dispatch's mark (`cause` in it); then, once Kueue can
    no longer resume it (jobs.objects.kueue_lets_suspend: the Workload Finished, or deactivated and evicted
    or holding no quota; or gone), by spec.suspend too. Kueue suspends an admitted TrainJob itself when it
    evicts the deactivated Workload, but never one whose Workload is Finished (a failed attempt's): without
    dispatch's own suspend that TrainJob would be deleted unsuspended. Rejected when the API server refuses
    the change (the Trainer's webhook, once the TrainJob's runtime is gone)."""
    meta = trainjob.get("metadata") or {}
    name = str(meta.get("name"))
    if (meta.get("labels") or {}).get(KUEUE_QUEUE_LABEL):
        workload = _workload_of(namespace, _uid(trainjob))
        if workload is not None:
            outcome = kueue.ALREADY
            if (workload.get("spec") or {}).get("active") is not False:
                mark = {"cause": cause, "at": timezone.now().isoformat(), "by": "dispatch"}
                outcome = kueue.deactivate_workload(
                    namespace=namespace,
                    name=str(workload["metadata"]["name"]),
                    uid=_uid(workload),
                    annotations={kueue_mark_key(label_domain): json.dumps(mark, sort_keys=True)},
                )
            if outcome != kueue.GONE and not kueue_lets_suspend(workload):
                # Not yet evicted: Kueue would resume a TrainJob suspended now. It evicts the deactivated
                # Workload and suspends the TrainJob itself; the next pass reads it again.
                return
    if (trainjob.get("spec") or {}).get("suspend") is not True:
        gateway.patch_namespaced(TRAINJOB, namespace, name, {"spec": {"suspend": True}})


def _workload_of(namespace: str, trainjob_uid: str) -> dict[str, Any] | None:
    for workload in kueue.list_workloads(namespace) or []:
        owners = (workload.get("metadata") or {}).get("ownerReferences") or []
        if any(ref.get("uid") == trainjob_uid for ref in owners):
            return workload
    return None
