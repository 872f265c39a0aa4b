"""Cancel a job and remove an execution's objects: the state changes at once, a task deletes the TrainJob (and
its runtime copy), and the sweep enqueues that task again until the objects are gone."""

from __future__ import annotations

import logging
import time
from contextlib import suppress
from typing import Any

from django.db import transaction
from django.utils import timezone

from cluster import gateway
from cluster.errors import ClusterError, Conflict
from cluster.fence import fence_add, fence_best_effort
from cluster.where import on_cluster
from dispatch_site.audit import audit_record
from dispatch_site.causes import Cause
from jobs import enqueue
from jobs.logtail import execution_log_keep
from jobs.models import ACTIVE_STATES, Execution, Job, JobEvent, JobState, PodTombstone
from jobs.objects import TRAINING_RUNTIME, TRAINJOB, is_ours, worker_runtime_copies_delete
from jobs.stopping import (
    DELETE,
    GONE_WAITS,
    STOP_WAIT_SECONDS,
    WAIT_TRAINER,
    StopClock,
    trainjob_stop_step,
)
from jobs.submission.claim import job_event, job_transition, start_may_still_create
from jobs.submission.errors import JobNotCancellable, TransientSubmitError

logger = logging.getLogger(__name__)


def execution_objects_delete(job: Job, execution: Execution, *, retry_transient: bool = False) -> bool:
    """Fence the attempt (cluster/fence.py: the admission guard refuses any pod of it from now on), then
    delete the TrainJob; the garbage collector then deletes its JobSet and the runtime copy it owns.
    A copy without that owner (the TrainJob was never created, or we stopped before the ownerReference), or
    one left after its TrainJob is gone, is deleted here. Only what dispatch made for this job is touched
    (jobs.objects.is_ours, in the domain stored with the job): a name that collided with somebody else's
    object is never deleted, nor one under the name whose UID is not the one the start recorded (somebody
    made it again after ours went, labels, annotations and all).

    Done, objects_removed_at set, only when a read shows both gone and no start delivery can still create
    them (jobs.submission.claim.start_may_still_create: the claim is released or its lease ran out); until
    then the delete task retries (retry_transient) and the sweep enqueues it again. Returns whether it is
    done. Best effort (never raises) unless retry_transient (the delete task)."""
    name = execution.trainjob_name
    # Read the claim before the cluster: a start that could still create must not be outrun by our reads.
    fresh = Execution.objects.filter(pk=execution.pk).first()
    if fresh is None:
        return True
    in_flight = start_may_still_create(fresh)
    # An execution whose start completed before stamping existed carries unstamped objects.
    unannotated_ok = fresh.submitted_at is not None
    if fresh.state == JobState.FAILED and fresh.objects_removed_at is None:
        execution_log_keep(job=job, execution=fresh)  # the failing rank's log goes with its pod
    made = fresh.trainjob_uid  # "" when no start recorded one (yet)
    stop = StopClock(rows=Execution.objects.filter(pk=fresh.pk), accepted_at=fresh.stop_accepted_at)
    try:
        # Fenced first: once the cascade starts, a controller acting on a stale cache could make the
        # attempt's pods again (cluster/fence.py); the guard refuses them from here on.
        fence_best_effort(job.namespace, name)
        _fence_workers(job, name)
        left = _delete_pass(job, name, unannotated_ok, stop, made, fresh.attempt)
        for wait in GONE_WAITS:  # a deleted TrainJob goes at once; the garbage collector takes its copy
            if not left:
                break
            time.sleep(wait)
            left = _delete_pass(job, name, unannotated_ok, stop, made, fresh.attempt)
    except ClusterError as exc:
        logger.warning("could not delete the objects of %s/%s: %s", job.namespace, name, exc)
        if exc.transient and retry_transient:
            raise TransientSubmitError(str(exc)) from exc
        return False
    if left or in_flight:
        why = _why_left(left) if left else "a start delivery may still create them"
        if retry_transient:
            raise TransientSubmitError(f"the objects of {job.namespace}/{name} are not gone yet: {why}")
        return False
    Execution.objects.filter(pk=execution.pk, objects_removed_at__isnull=True).update(
        objects_removed_at=timezone.now()
    )
    return True


def _why_left(left: list[str]) -> str:
    """What keeps the objects, for the delete's retry and the timeline: a TrainJob whose stop has not shown is
    waiting for the Trainer, not being deleted."""
    deleting = [kind for kind in left if "(" not in kind]
    waiting = [kind for kind in left if "(" in kind]
    return "; ".join([*waiting, *([f"{', '.join(deleting)} still being deleted"] if deleting else [])])


def _delete_pass(
    job: Job, name: str, unannotated_ok: bool, stop: StopClock, made: str = "", attempt: int | None = None
) -> list[str]:
    """Delete what is left of ours under `name`; the kinds still there (being deleted, or just deleted).
    A TrainJob is stopped first and deleted once the Trainer shows it stopped, or, STOP_WAIT_SECONDS after
    the cluster first accepted the stop (`stop`), once the Trainer is shown not running (trainjob_pass).
    `made`: the UID of the TrainJob the start created, when it recorded one; another TrainJob, and a copy
    another TrainJob owns, are not ours. A copy is deleted only once no TrainJob of ours is left: the
    Trainer's webhook refuses to stop a TrainJob whose runtime is gone."""
    trainjob = gateway.get_namespaced(TRAINJOB, job.namespace, name)
    if trainjob is not None and not is_ours(
        trainjob, job.label_domain, job.id, unannotated_ok=unannotated_ok, trainjob_uid=made
    ):
        trainjob = None  # somebody else's object under our name: not ours to delete, nor to wait for
    waiting = False  # the TrainJob is there, not being deleted: its stop has not shown yet
    if trainjob is not None:
        waiting = not trainjob_pass(job, trainjob, stop, attempt)
    copy = gateway.get_namespaced(TRAINING_RUNTIME, job.namespace, name)
    if copy is not None and not is_ours(
        copy, job.label_domain, job.id, unannotated_ok=unannotated_ok, trainjob_uid=made
    ):
        copy = None
    if copy is not None and not _deleting(copy) and trainjob is None:
        gateway.delete_namespaced(TRAINING_RUNTIME, job.namespace, name)
    left = []
    if trainjob is not None:
        left.append(f"{TRAINJOB} (waiting for the Trainer to stop it)" if waiting else TRAINJOB)
    if copy is not None:
        left.append(
            TRAINING_RUNTIME if trainjob is None or _deleting(copy) else f"{TRAINING_RUNTIME} (goes after it)"
        )
    if trainjob is None:  # MultiKueue removes the workers' TrainJob once the manager's is gone
        left += _worker_copies_pass(job, name, unannotated_ok, made)
    return left


def _worker_copies_pass(job: Job, name: str, unannotated_ok: bool, made: str) -> list[str]:
    """The runtime copies the start put on the MultiKueue workers (jobs.submission.start._copy_to_workers),
    deleted once each worker's TrainJob is gone (jobs.objects.worker_runtime_copies_delete); what is still
    there, named with its worker."""
    return worker_runtime_copies_delete(
        namespace=job.namespace,
        name=name,
        workers=_workers(job),
        label_domain=job.label_domain,
        owner_id=job.id,
        unannotated_ok=unannotated_ok,
        trainjob_uid=made,
    )


def _fence_workers(job: Job, name: str) -> None:
    """Under MultiKueue the attempt's pods are admitted by a worker's API server, not the manager's: each
    worker the job's plan named (MultiKueue may have placed the attempt on any of them) gets the fence in the
    job's namespace too, so a stale controller there cannot run a rank of the ended attempt again. A worker
    that cannot be reached or refuses (lost, or credentials without deploy/multikueue's namespace rule) is
    skipped with a log line: the end of an attempt does not wait for a cluster that may never come back."""
    for worker in _workers(job):
        try:
            with on_cluster(worker):
                fence_add(job.namespace, name)
        except ClusterError as exc:
            logger.warning("could not fence %s/%s on worker %s: %s", job.namespace, name, worker, exc)


def _workers(job: Job) -> list[str]:
    """The MultiKueue workers the job's plan (as its last start judged it) named."""
    queue = (job.plan or {}).get("queue") or {}
    return [str(w) for w in queue.get("workers") or [] if w]


def _deleting(obj: dict[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def trainjob_pass(job: Job, trainjob: dict[str, Any], stop: StopClock, attempt: int | None) -> bool:
    """One step of stop-before-delete for the job's TrainJob (jobs.stopping.trainjob_stop_step); True when
    this pass deleted it (or found it being deleted). While the Trainer is running and has not stopped it
    after the stop's wait, the job's timeline says so, once per attempt."""
    if _deleting(trainjob):
        return True
    step = trainjob_stop_step(
        namespace=job.namespace,
        trainjob=trainjob,
        stop=stop,
        label_domain=job.label_domain,
        cause="cancelled",
    )
    name = str((trainjob.get("metadata") or {}).get("name") or "")
    if step.action == WAIT_TRAINER:
        seen = step.look.seen if step.look else ""
        _timeline_once(
            job,
            STOP_WAITING,
            f"not deleting TrainJob {job.namespace}/{name} yet: the Trainer is running ({seen}) and has "
            "not stopped it; deleting it now would let the Trainer rebuild its JobSet",
            attempt,
        )
        waited = stop.waited_seconds()
        if waited >= STOP_STUCK_SECONDS:
            message = (
                f"TrainJob {job.namespace}/{name} is still not stopped {int(waited)} s after the cluster "
                f"accepted its stop, and the Trainer is running ({seen}): it renews its Lease but does not "
                "act on the stop. Look at the Trainer controller (its logs, its rights on trainjobs/status); "
                "the delete waits for it"
            )
            if _timeline_once(job, STOP_STUCK, message, attempt):
                logger.error("job %s attempt %s: %s", job.pk, attempt, message)
        return False
    if step.action != DELETE:
        return False
    with suppress(Conflict):  # another object took the name since the read: not ours
        gateway.delete_namespaced(TRAINJOB, job.namespace, name, uid=_uid(trainjob))
    return True


# The timeline entry of a delete that waits for a running Trainer to stop the TrainJob.
STOP_WAITING = "stop-waiting"
# ... and of one that has waited STOP_STUCK_SECONDS since the stop was accepted: the Trainer renews its Lease
# yet does not act (it cannot write the TrainJob's status, say), which no wait will mend. The delete still
# waits (deleting would let that Trainer rebuild the JobSet); someone has to look at the Trainer, so it is
# logged as an error, and dispatch_delete_oldest_pending_seconds in /metrics keeps growing until it is done.
STOP_STUCK = "stop-stuck"
STOP_STUCK_SECONDS = 600.0


def _timeline_once(job: Job, kind: str, message: str, attempt: int | None) -> bool:
    """Write the timeline entry once per attempt, however many deliveries look at once: under the job's row
    lock (the first lock every writer of a job takes). Whether this call wrote it."""
    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=job.pk).values_list("pk", flat=True).first()
        if JobEvent.objects.filter(job=job, kind=kind, attempt=attempt).exists():
            return False
        job_event(job, kind, message, attempt)
    return True


# How long a stale start delivery waits for the Trainer to stop a TrainJob it made before it deletes it: the
# stop's wait, then a little for the Lease read, between looks of MADE_LOOK_SECONDS.
MADE_WAIT_SECONDS = STOP_WAIT_SECONDS + 10.0
MADE_LOOK_SECONDS = 0.5


def made_trainjob_delete(*, job: Job, trainjob: dict[str, Any], attempt: int) -> bool:
    """Delete a TrainJob a stale start delivery made (jobs.submission.start: the execution moved on without
    it), by its UID, through the same stop-before-delete as an attempt's (trainjob_pass), its stop clock in
    memory (the execution's own belongs to the attempt that moved on). Waits here up to MADE_WAIT_SECONDS;
    False when it is still there then (stopped, or asked to: nothing retries this, so it is logged)."""
    meta = trainjob.get("metadata") or {}
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    stop = StopClock(rows=None, accepted_at=None)
    deadline = time.monotonic() + MADE_WAIT_SECONDS
    current: dict[str, Any] | None = trainjob
    while current is not None and _uid(current) == uid:
        if trainjob_pass(job, current, stop, attempt):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(MADE_LOOK_SECONDS)
        current = gateway.get_namespaced(TRAINJOB, job.namespace, name)
    return True


def job_cancel(*, actor: Any, job: Job) -> Job:
    """Cancel a job: the state changes at once; a task deletes the TrainJob (and its runtime copy), and the
    sweep enqueues that task again until the objects are gone."""
    now = timezone.now()
    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=job.pk).first()  # job first, then execution
        if not job_transition(
            job,
            ACTIVE_STATES,
            JobState.CANCELLED,
            cause=Cause.CANCELLED,
            message=f"cancelled by {actor.get_username()}",
        ):
            job.refresh_from_db()
            raise JobNotCancellable(
                f"job {job.id} is {job.state}; only a job that has not finished can be cancelled"
            )
        execution = Execution.objects.select_for_update().filter(job=job).order_by("-attempt").first()
        if execution is not None:
            Execution.objects.filter(pk=execution.pk, state__in=ACTIVE_STATES).update(
                state=JobState.CANCELLED, cause=Cause.CANCELLED, finished_at=now
            )
            PodTombstone.objects.filter(execution_id=execution.pk).delete()  # no cycle will use them now
            # The claim stays: a start delivery holding it may have a create in flight, and the delete
            # records the objects removed only once that delivery released it or its lease ran out.
            Execution.objects.filter(pk=execution.pk).update(delete_requested_at=now, objects_removed_at=None)
            execution_id = execution.pk
            transaction.on_commit(enqueue.on_commit_send(enqueue.EXECUTION_DELETE, execution_id), robust=True)
        job_event(job, "cancelled", f"cancelled by {actor.get_username()}")
        audit_record(actor=actor, action="job.cancel", object_type="job", object_id=job.id)
    job.refresh_from_db()
    return job


def delete_intended(execution: Execution) -> bool:
    """Did dispatch decide to remove this execution's objects? Every path that does (a cancel, a refusal or a
    failure at start, a terminal failure, a stop supervision decided, a retry) records delete_requested_at
    in the transaction that decides it, before the message is sent. A delete message alone is a request,
    never an order: anyone who can write to the broker can send one, for any execution id (they are
    sequential), so the delete acts only on what the database says was intended. A succeeded job's TrainJob
    is kept (its pods hold the logs), and a message cannot take it either."""
    return execution.delete_requested_at is not None


def execution_delete(*, execution_id: int) -> None:
    execution = Execution.objects.select_related("job").filter(pk=execution_id).first()
    if execution is None:
        return
    if not delete_intended(execution):
        logger.warning(
            "execution %s (job %s): a delete message arrived that nothing in the database asked for (no "
            "delete requested); ignored",
            execution.pk,
            execution.job_id,
        )
        return
    execution_objects_delete(execution.job, execution, retry_transient=True)


def execution_delete_gave_up(*, execution_id: int, error: str) -> None:
    """The delete task's retries are exhausted: say so on the job's timeline; the sweep tries again. Only for
    a delete that was asked for: a message's retry count is the sender's to write, and never turns into a
    recorded request the sweep would then carry out."""
    execution = Execution.objects.select_related("job").filter(pk=execution_id).first()
    if execution is None or not delete_intended(execution):
        return
    job_event(
        execution.job,
        "delete-pending",
        f"could not delete TrainJob {execution.job.namespace}/{execution.trainjob_name} yet ({error}); "
        "the sweep tries again",
        execution.attempt,
    )
