"""Stopping a TrainJob before it is deleted, for a job's attempt (jobs.submission.cancel) and a session
(jobs.sessions.services) alike: the Trainer rebuilds the JobSet of a TrainJob it still holds when the JobSet
goes (status-facts §12), so a TrainJob is deleted only once it is stopped (jobs.objects.trainjob_stopped), or
when a stop the cluster accepted has had STOP_WAIT_SECONDS to show and did not **and** the Trainer is shown
not running: its leader Lease (settings.TRAINER_LEADER_LEASE) absent, unreadable, or not renewed within its
leaseDurationSeconds plus LEASE_MARGIN_SECONDS (trainer_look). A Trainer that renews its Lease and has not
stopped the TrainJob would rebuild its JobSet: the delete keeps waiting and the caller says so.

A stop the API server refuses because the TrainJob's runtime copy is gone (the Trainer's webhook denies any
update then) is no reason to delete either: the Trainer rebuilds from its `<trainjob>-runtime-snapshot`
ConfigMap (kubeflow/trainer v2.3.0 pkg/runtime/core/trainingruntime.go NewObjects, snapshot.go), and its
reconciler acts on a TrainJob with a deletionTimestamp as on any other (pkg/controller/trainjob_controller.go
Reconcile), so a foreground delete would not stop the rebuild either (and its finalizer's removal is an update
the same webhook denies). So the copy is restored from that snapshot (runtime_copy_restore), owned by the
TrainJob, and the stop asked again; without a snapshot the Trainer never built anything and cannot rebuild."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import yaml
from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from cluster import gateway, kueue
from cluster.errors import AlreadyExists, ClusterError, Rejected
from jobs.naming import KUEUE_QUEUE_LABEL, kueue_mark_key
from jobs.objects import TRAINING_RUNTIME, TRAINJOB, kueue_lets_suspend, trainjob_stopped

logger = logging.getLogger(__name__)

# How long a delete waits for the Trainer to show a TrainJob stopped before it deletes it anyway (the Trainer
# is down, say: then nothing can rebuild the JobSet either), counted from the first stop the cluster accepted,
# never from the request: a delete delivered late stops first.
STOP_WAIT_SECONDS: Final = 30.0

# How long one delete pass waits, between reads, for what it deleted to be gone before it leaves the rest to
# the next pass (a job's delete task's retry, a session's next close look).
GONE_WAITS: Final = (0.1, 0.2, 0.4, 0.8)

# How much later than its leaseDurationSeconds a Lease still counts as renewed: the holder writes renewTime
# with its own host's clock, and that clock and ours may differ by a few seconds.
LEASE_MARGIN_SECONDS: Final = 10.0

# The Trainer's copy of a TrainJob's runtime: ConfigMap `<trainjob><suffix>`, key `runtime` (kubeflow/trainer
# v2.3.0 pkg/runtime/core/snapshot.go).
SNAPSHOT_SUFFIX: Final = "-runtime-snapshot"
SNAPSHOT_KEY: Final = "runtime"


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

    def waited_seconds(self) -> float:
        """Seconds since the cluster first accepted the stop; 0 before it did."""
        if self.accepted_at is None:
            return 0.0
        return max(0.0, (timezone.now() - self.accepted_at).total_seconds())

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


# ---------------------------------------------------------------- is the Trainer running?


@dataclass(frozen=True)
class TrainerLook:
    """Whether the Trainer is shown running (its leader Lease renewed recently), and what was seen, in words
    for the job's timeline."""

    running: bool
    seen: str


def lease_renewed(
    *, renew_time: datetime | None, duration_seconds: int | None, holder: str | None, now: datetime
) -> bool:
    """Is a Lease held and renewed within its leaseDurationSeconds plus LEASE_MARGIN_SECONDS of `now`? A
    Lease without holder (released), without renewTime or without duration is not."""
    if not holder or renew_time is None or not duration_seconds:
        return False
    return (now - renew_time).total_seconds() <= duration_seconds + LEASE_MARGIN_SECONDS


def trainer_look() -> TrainerLook:
    """Read the Trainer controller manager's leader Lease (settings.TRAINER_LEADER_LEASE). Running only when
    it is held and renewed recently; absent, unreadable (any error: the caller's delete then goes ahead, as
    it did before the Lease was read) or stale, not running."""
    namespace, name = settings.TRAINER_LEADER_LEASE
    where = f"Lease {namespace}/{name}"
    try:
        lease = gateway.get_lease(namespace, name)
    except ClusterError as exc:
        logger.warning("could not read the Trainer's leader %s: %s", where, exc)
        return TrainerLook(False, f"the Trainer's leader {where} could not be read: {exc.message}")
    if lease is None:
        return TrainerLook(False, f"the Trainer's leader {where} does not exist")
    now = timezone.now()
    renewed = lease_renewed(
        renew_time=lease.renew_time, duration_seconds=lease.duration_seconds, holder=lease.holder, now=now
    )
    age = f"{(now - lease.renew_time).total_seconds():.0f}s ago" if lease.renew_time else "never"
    seen = (
        f"the Trainer's leader {where} (held by {lease.holder or 'nobody'}) was last renewed {age}, "
        f"lease {lease.duration_seconds}s"
    )
    return TrainerLook(renewed, seen)


# ---------------------------------------------------------------- a runtime copy that went first


def runtime_from_snapshot(snapshot: dict[str, Any], trainjob: dict[str, Any]) -> dict[str, Any] | None:
    """The TrainingRuntime to restore under the name the TrainJob's runtimeRef names, from the Trainer's
    snapshot ConfigMap, owned by the TrainJob (so that the garbage collector takes it
    with the TrainJob); None when the snapshot is not this TrainJob's (its controller owner has another UID),
    not of a namespaced TrainingRuntime of that name, or unreadable."""
    meta = trainjob.get("metadata") or {}
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    owners = (snapshot.get("metadata") or {}).get("ownerReferences") or []
    if not any(o.get("uid") == meta.get("uid") and o.get("controller") for o in owners):
        return None
    try:
        runtime = yaml.safe_load(((snapshot.get("data") or {}).get(SNAPSHOT_KEY)) or "")
    except yaml.YAMLError:
        return None
    if not isinstance(runtime, dict) or runtime.get("kind") not in (None, TRAINING_RUNTIME):
        return None
    if ref.get("kind", TRAINING_RUNTIME) != TRAINING_RUNTIME:
        return None
    kept = runtime.get("metadata") or {}
    if kept.get("name", ref.get("name")) != ref.get("name"):
        return None
    return {
        "apiVersion": f"{gateway.TRAINER_GROUP}/{gateway.TRAINER_VERSION}",
        "kind": TRAINING_RUNTIME,
        "metadata": {
            "name": ref.get("name"),
            "namespace": meta.get("namespace"),
            "labels": kept.get("labels") or {},
            "annotations": kept.get("annotations") or {},
            "ownerReferences": [
                {
                    "apiVersion": trainjob.get(
                        "apiVersion", f"{gateway.TRAINER_GROUP}/{gateway.TRAINER_VERSION}"
                    ),
                    "kind": TRAINJOB,
                    "name": meta.get("name"),
                    "uid": meta.get("uid"),
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": runtime.get("spec") or {},
    }


RESTORED: Final = "restored"  # the copy was created from the snapshot now: ask the stop again
PRESENT: Final = "present"  # a runtime of that name is there: the refusal is not for want of it
NO_SNAPSHOT: Final = "no-snapshot"  # no snapshot of this TrainJob: the Trainer has nothing to rebuild from


def runtime_copy_restore(*, namespace: str, trainjob: dict[str, Any]) -> str:
    """Restore the TrainJob's runtime copy from the Trainer's snapshot, so that the Trainer's webhook lets the
    stop through (the caller asks it again on its next pass: the webhook reads runtimes from its informer
    cache). RESTORED, PRESENT (somebody's runtime is under that name already), or NO_SNAPSHOT (none of this
    TrainJob's, or one the Trainer cannot read either: it never built the TrainJob, or cannot build it
    again)."""
    meta = trainjob.get("metadata") or {}
    snapshot = gateway.get_config_map(namespace, f"{meta.get('name')}{SNAPSHOT_SUFFIX}")
    body = None if snapshot is None else runtime_from_snapshot(snapshot, trainjob)
    if body is None:
        return NO_SNAPSHOT
    try:
        gateway.create_namespaced(TRAINING_RUNTIME, body)
    except AlreadyExists:
        return PRESENT
    logger.warning(
        "restored the runtime copy %s/%s of TrainJob %s from the Trainer's snapshot, so that it can be "
        "stopped before its delete",
        namespace,
        body["metadata"]["name"],
        meta.get("name"),
    )
    return RESTORED


# ---------------------------------------------------------------- one step towards the delete

DELETE = "delete"  # delete the TrainJob now
WAIT = "wait"  # not yet: the stop was asked (or the copy restored); look again on the next pass
WAIT_TRAINER = "wait-trainer"  # the Trainer is running and has not stopped it: keep waiting, and say so


@dataclass(frozen=True)
class StopStep:
    """What a delete pass does with a TrainJob not yet deleting: DELETE, WAIT or WAIT_TRAINER; `look` is
    what was seen of the Trainer when its Lease was read."""

    action: str
    look: TrainerLook | None = None


def trainjob_stop_step(
    *, namespace: str, trainjob: dict[str, Any], stop: StopClock, label_domain: str, cause: str
) -> StopStep:
    """One step of stop-before-delete for a TrainJob that is not being deleted: DELETE once the Trainer
    shows it stopped; otherwise the stop is asked (idempotent) and its first acceptance recorded; once
    STOP_WAIT_SECONDS passed since then without the Trainer's answer, DELETE only when the Trainer is shown
    not running (trainer_look), else WAIT_TRAINER. A stop refused because the runtime copy is gone restores
    the copy from the Trainer's snapshot (WAIT: the next pass asks again); without a snapshot, DELETE (the
    Trainer cannot build it); refused with a runtime there, the Lease decides as for a stop never shown."""
    if trainjob_stopped(trainjob):
        return StopStep(DELETE)
    try:
        trainjob_stop(namespace=namespace, trainjob=trainjob, label_domain=label_domain, cause=cause)
        stop.accepted()
    except Rejected as exc:
        restored = runtime_copy_restore(namespace=namespace, trainjob=trainjob)
        logger.info(
            "could not stop TrainJob %s/%s (%s); its runtime copy: %s",
            namespace,
            (trainjob.get("metadata") or {}).get("name"),
            exc,
            restored,
        )
        if restored == NO_SNAPSHOT:
            return StopStep(DELETE)
        if restored == RESTORED:
            return StopStep(WAIT)
        look = trainer_look()
        return StopStep(WAIT_TRAINER if look.running else DELETE, look)
    if not stop.ran_out():
        return StopStep(WAIT)
    look = trainer_look()
    return StopStep(WAIT_TRAINER if look.running else DELETE, look)
