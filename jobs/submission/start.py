"""Start one execution: claim it, judge the runtime again, create the TrainingRuntime copy and the TrainJob on
it, and record the start; a refusal or an admission denial at start ends the job with its reason."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime
from functools import cache
from typing import Any

from django.db import transaction
from django.utils import timezone

from cluster import gateway
from cluster.errors import ClusterError, NotFound, Rejected
from cluster.fence import fence_best_effort
from dispatch_site import sql
from dispatch_site.audit import audit_record
from dispatch_site.causes import Cause
from jobs.models import Execution, Job, JobState
from jobs.objects import (
    TRAINING_RUNTIME,
    TRAINJOB,
    _copy_not_seen_yet,
    create_or_adopt,
    create_trainjob_on_copy,
    own_copy,
    runtime_copy_to_workers,
)
from jobs.plan import Plan
from jobs.spec import JobSpec
from jobs.submission.cancel import execution_objects_delete, made_trainjob_delete
from jobs.submission.claim import (
    STARTABLE,
    claim_fence,
    claim_hold,
    execution_claim,
    holds_claim,
    is_startable,
    job_event,
    job_transition,
    locked_job_and_execution,
)
from jobs.submission.errors import ClaimLost, TransientSubmitError
from jobs.submission.planning import job_plan
from runtimes.selectors import site_settings

logger = logging.getLogger(__name__)

START_SITE_SETTINGS_MAX_AGE = 1.0


def execution_submit(*, execution_id: int, holder: str | None = None, retry_in: float = 0.0) -> None:
    """Start one execution: claim it, re-check the runtime, create the TrainingRuntime copy, then the TrainJob
    on it, then make the TrainJob the copy's owner. Idempotent; raises TransientSubmitError to be retried
    (after `retry_in` seconds, through which this chain, `holder`, keeps its claim). Every create is fenced:
    it happens only while this delivery's claim (holder and token) is still the execution's."""
    holder = holder or f"call-{uuid.uuid4().hex}"
    claimed = execution_claim(execution_id, holder)
    if claimed is None:
        return  # a duplicate delivery, cancelled meanwhile, or another delivery is starting it
    job, execution, token = claimed
    spec = JobSpec.from_dict(job.spec)
    # The site's rules as read at most a second ago in this process (a start a second earlier would have used
    # them too); the runtime and its allow-list entry are always read afresh.
    site = site_settings(max_age=START_SITE_SETTINGS_MAX_AGE)
    # The domain stored with the job when it was submitted: a later change of the site's domain changes
    # nothing for it (its objects, a redelivery's adoption, a retry's labels).
    label_domain = job.label_domain

    def fence() -> None:
        claim_fence(execution.pk, holder, token)

    made: list[dict[str, Any]] = []  # what this delivery created (not adopted): a stale holder removes it
    try:
        # The runtime may have changed since the plan: judge it again and build from what is judged now.
        plan, runtime = job_plan(
            user=job.owner,
            spec=spec,
            job_id=job.id,
            attempt=execution.attempt,
            site=site,
            stored_runtime=job.runtime_snapshot if execution.attempt > 1 else None,
            label_domain=label_domain,
        )
        if plan.refused:
            _refuse_at_start(job, execution, plan, holder, token)
            return
        assert plan.training_runtime is not None and plan.train_job is not None
        copy = create_or_adopt(
            TRAINING_RUNTIME, plan.training_runtime, label_domain, job.id, before_create=fence, made=made
        )
        _copy_to_workers(plan, label_domain, job.id, fence)
        try:
            trainjob = create_trainjob_on_copy(
                plan.train_job, label_domain, job.id, before_create=fence, made=made
            )
        except Rejected as exc:
            if _copy_not_seen_yet(exc):  # still unseen after the waits: the task retries later
                raise TransientSubmitError(str(exc)) from exc
            raise
        own_copy(copy, trainjob)
    except ClaimLost:
        _claim_lost(execution.pk, holder, token, made)
        return
    except TransientSubmitError:
        claim_hold(execution.pk, holder, retry_in)
        raise
    except Rejected as exc:
        _fail_config(job, execution, exc, holder, token)
        return
    except NotFound as exc:
        # The namespace does not exist (or vanished): nothing to retry.
        _fail_config(job, execution, exc, holder, token)
        return
    except ClusterError as exc:
        if exc.transient:
            claim_hold(execution.pk, holder, retry_in)
            raise TransientSubmitError(str(exc)) from exc
        _fail_config(job, execution, exc, holder, token)
        return

    now = timezone.now()
    # The job shows the identity warnings of the runtime that actually ran: the one judged just now.
    warnings = list(plan.identity_warnings)
    # Record the start: two compare-and-set statements in one transaction, in the one lock order (the job's
    # row, then the execution's). The job moves only while it waits for this attempt; the execution only
    # while this delivery's claim (holder and token) is its claim. Either failing: nothing is recorded.
    with transaction.atomic():
        moved = _record_start(
            job=job,
            execution=execution,
            holder=holder,
            token=token,
            now=now,
            values={
                "plan": plan.to_dict(copy_objects=False),
                "runtime_snapshot": runtime.body if runtime else None,
                "identity_warnings": warnings,
                "message": f"TrainJob {job.namespace}/{execution.trainjob_name} created",
            },
            # The create (or adopt) answer is the object: its UID is what the supervision recognises the
            # execution's TrainJob by (jobs.supervision.grouping), never read again.
            trainjob_uid=str((trainjob.get("metadata") or {}).get("uid") or ""),
        )
        if not moved:
            transaction.set_rollback(True)  # never leave the job ahead of its execution
        if moved:
            if warnings != list(job.identity_warnings or []):
                job_event(
                    job,
                    "identity-warnings",
                    _warnings_changed(warnings),
                    execution.attempt,
                    before=list(job.identity_warnings or []),
                    after=warnings,
                )
            job_event(
                job,
                "created",
                f"created TrainJob {job.namespace}/{execution.trainjob_name}",
                execution.attempt,
                execution=execution,
            )
    if not moved:
        # Cancelled while we were creating (its delete may have run before our create), or our lease ran out
        # and the execution moved on: settle what we made.
        _claim_lost(execution.pk, holder, token, made)


def _copy_to_workers(plan: Plan, label_domain: str, job_id: str, fence: Callable[[], None]) -> None:
    """The job's runtime copy on every MultiKueue worker of its queue, fenced like every create
    (jobs.objects.runtime_copy_to_workers); removed with the attempt's objects (jobs.submission.cancel)."""
    runtime = plan.training_runtime
    assert runtime is not None
    workers = plan.queue.workers if plan.queue is not None else ()
    runtime_copy_to_workers(
        runtime=runtime, workers=workers, label_domain=label_domain, owner_id=job_id, before_create=fence
    )


@cache
def _record_sql() -> tuple[str, str]:
    job, execution = sql.table(Job), sql.table(Execution)
    return (
        f"UPDATE {job} SET state = %s, state_changed_at = %s, updated_at = %s, current_attempt = %s, "
        "plan = %s, runtime_snapshot = %s, identity_warnings = %s, message = %s, last_known_state = '', "
        "unknown_since = NULL "
        "WHERE id = %s AND state IN (%s, %s) AND current_attempt <= %s "
        "AND (state = %s OR last_known_state = %s)",
        f"UPDATE {execution} SET state = %s, submitted_at = %s, trainjob_uid = %s, claim_holder = '', "
        "claim_until = NULL WHERE id = %s AND state = %s AND claim_holder = %s AND claim_generation = %s",
    )


def _record_start(
    *,
    job: Job,
    execution: Execution,
    holder: str,
    token: int,
    now: datetime,
    values: dict[str, Any],
    trainjob_uid: str,
) -> bool:
    """Record the start: two compare-and-set statements (the caller's transaction), in the one lock order (the
    job's row, then the execution's). The job moves to queued only while it waits for this attempt (pending,
    or unknown having never reached the cluster); the execution only while this delivery's claim (holder and
    token) is its claim, and with the move it records the UID of its TrainJob. Written out
    (dispatch_site.sql): compiling the two as ORM updates cost a start about 1 ms of CPU. False when either
    found its row changed (the caller rolls back)."""
    job_sql, execution_sql = _record_sql()
    json = {name: sql.prep(Job, name, values[name]) for name in _JSON}
    at = sql.at(now)
    moved = sql.updated(
        job_sql,
        [
            JobState.QUEUED,
            at,
            at,
            execution.attempt,
            json["plan"],
            json["runtime_snapshot"],
            json["identity_warnings"],
            values["message"],
            job.pk,
            JobState.PENDING,
            JobState.UNKNOWN,
            execution.attempt,
            JobState.PENDING,
            JobState.PENDING,
        ],
    )
    if moved != 1:
        return False
    moved = sql.updated(
        execution_sql, [JobState.QUEUED, at, trainjob_uid, execution.pk, JobState.PENDING, holder, token]
    )
    if moved != 1:
        return False
    execution.trainjob_uid = trainjob_uid
    return True


_JSON = ("plan", "runtime_snapshot", "identity_warnings")


def _claim_lost(execution_id: int, holder: str, token: int, made: list[dict[str, Any]]) -> None:
    """This delivery may no longer act for the execution. It releases its claim (if it still holds it), then:
    an execution whose objects are to go (cancelled, refused, failed, a retry started) has them deleted again,
    and its removal is recorded afresh, so the sweep redoes it until a read shows them gone; an execution that
    moved on without that (another delivery started it, or is starting it) keeps its objects, except those
    this stale delivery created itself after it ended (deleted by UID)."""
    with transaction.atomic():
        locked = locked_job_and_execution(execution_id)
        if locked is None:
            return
        job, execution = locked
        if holds_claim(execution, holder, token):
            Execution.objects.filter(pk=execution.pk).update(claim_holder="", claim_until=None)
            execution.claim_holder, execution.claim_until = "", None
        to_delete = execution.delete_requested_at is not None
        if to_delete:
            Execution.objects.filter(pk=execution.pk).update(objects_removed_at=None)
            execution.objects_removed_at = None
    if to_delete:
        logger.warning(
            "execution %s: %s lost its claim while starting; the objects of %s are removed again",
            execution_id,
            holder,
            execution.trainjob_name,
        )
        execution_objects_delete(job, execution)
        return
    live = execution.state in (JobState.PENDING, JobState.QUEUED, JobState.RUNNING, JobState.UNKNOWN)
    if made and not live:
        with suppress(ClusterError):  # best effort, as the deletes below
            fence_best_effort(job.namespace, execution.trainjob_name)
        # The TrainJob first, stopped before its delete as every attempt's (jobs.stopping), then the copy:
        # the Trainer's webhook refuses to stop a TrainJob whose runtime went first.
        for obj in sorted(made, key=lambda o: o["kind"] != TRAINJOB):
            meta = obj["metadata"]
            try:
                if obj["kind"] == TRAINJOB:
                    if not made_trainjob_delete(job=job, trainjob=obj, attempt=execution.attempt):
                        logger.warning(
                            "TrainJob %s/%s this stale delivery made is asked to stop but not deleted yet; "
                            "its runtime copy stays with it",
                            meta["namespace"],
                            meta["name"],
                        )
                        return
                    continue
                gateway.delete_namespaced(obj["kind"], meta["namespace"], meta["name"], uid=meta["uid"])
            except ClusterError as exc:
                logger.warning(
                    "could not delete %s %s/%s: %s", obj["kind"], meta["namespace"], meta["name"], exc
                )


def _warnings_changed(warnings: list[str]) -> str:
    if not warnings:
        return "judged at start, the runtime no longer gives the identity warning shown at submission"
    return "judged at start, the runtime gives identity warnings: " + "; ".join(warnings)


def _refuse_at_start(job: Job, execution: Execution, plan: Plan, holder: str, token: int) -> None:
    reasons = [r.to_dict() for r in plan.reasons if not r.waived]
    now = timezone.now()
    with transaction.atomic():
        locked = locked_job_and_execution(execution.pk, job.pk)
        if locked is None or not is_startable(*locked) or not holds_claim(locked[1], holder, token):
            return
        job = locked[0]
        job_transition(
            job,
            STARTABLE,
            JobState.REFUSED,
            reasons=reasons,
            plan=plan.to_dict(),
            message="refused at start: " + ", ".join(r["code"] for r in reasons),
        )
        Execution.objects.filter(pk=execution.pk).update(
            state=JobState.REFUSED,
            finished_at=now,
            claim_holder="",
            claim_until=None,
            delete_requested_at=now,
        )
        job_event(
            job,
            "refused",
            "judged again at start, the job is refused (its runtime or its Kueue queue changed)",
            execution.attempt,
            reasons=reasons,
        )
        audit_record(
            actor=None,
            action="job.refuse",
            object_type="job",
            object_id=job.id,
            details={"codes": [r["code"] for r in reasons], "at": "start"},
        )
    # An earlier delivery of this execution may have created the copy and the TrainJob: take them down
    # (the sweep finishes it when the cluster cannot be reached now).
    execution_objects_delete(job, execution)


def _fail_config(job: Job, execution: Execution, exc: ClusterError, holder: str, token: int) -> None:
    message = f"{exc.target}: {exc.message}"
    now = timezone.now()
    with transaction.atomic():
        locked = locked_job_and_execution(execution.pk, job.pk)
        if locked is None or not is_startable(*locked) or not holds_claim(locked[1], holder, token):
            return
        job = locked[0]
        job_transition(
            job,
            STARTABLE,
            JobState.FAILED,
            cause=Cause.CONFIG_ERROR,
            message=message,
            evidence=[{"object": exc.target, "field": f"HTTP {exc.status}", "value": exc.message}],
        )
        Execution.objects.filter(pk=execution.pk).update(
            state=JobState.FAILED,
            cause=Cause.CONFIG_ERROR,
            message=message,
            finished_at=now,
            claim_holder="",
            claim_until=None,
            delete_requested_at=now,
        )
        job_event(job, "failed", message, execution.attempt, cause=Cause.CONFIG_ERROR)
    # A TrainJob rejected after its runtime copy was created leaves the copy without an owner.
    execution_objects_delete(job, execution)


def execution_give_up(*, execution_id: int, error: str, holder: str) -> None:
    """This chain's transient retries are exhausted: the job is `unknown` (last known state pending, since
    now) and the claim is released, so the sweep starts the execution again once the cluster answers."""
    now = timezone.now()
    with transaction.atomic():
        locked = locked_job_and_execution(execution_id)
        if locked is None:
            return
        job, execution = locked
        if not is_startable(job, execution) or execution.claim_holder != holder:
            return  # another chain holds it, or it moved on
        Execution.objects.filter(pk=execution.pk).update(claim_holder="", claim_until=None)
        if job.state == JobState.PENDING:
            job_transition(
                job,
                {JobState.PENDING},
                JobState.UNKNOWN,
                last_known_state=JobState.PENDING,
                unknown_since=now,
                message=f"could not reach the cluster: {error}",
            )
            job_event(job, "unknown", f"submission retries exhausted: {error}", execution.attempt)
