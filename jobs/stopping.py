"""Stopping a TrainJob before it is deleted, for a job's attempt (jobs.submission.cancel) and a session
(jobs.sessions.services) alike: the Trainer rebuilds the JobSet of a TrainJob it still holds when the JobSet
goes (status-facts §12), so a TrainJob is deleted only once it is stopped (jobs.objects.trainjob_stopped), or
when a stop the cluster accepted has had STOP_WAIT_SECONDS to show and did not."""

from __future__ import annotations

import json
from typing import Any, Final

from django.utils import timezone

from cluster import gateway, kueue
from jobs.naming import KUEUE_QUEUE_LABEL, kueue_mark_key
from jobs.objects import TRAINJOB, kueue_lets_suspend

# How long a delete waits for the Trainer to show a TrainJob stopped before it deletes it anyway (the Trainer
# is down, say: then nothing can rebuild the JobSet either), counted from the first stop the cluster accepted,
# never from the request: a delete delivered late stops first.
STOP_WAIT_SECONDS: Final = 30.0


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
