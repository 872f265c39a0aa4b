"""Write what a cycle derived, and act on it.

- every transition is compare-and-set under row locks taken in one order (job, then execution), and written
  as a JobEvent (from, to, cause, evidence): two supervisors at once never double-record or double-act;
- a failed execution is followed by attempt A+1 when the job's recovery policy says so
  (jobs.recovery): the job goes back to `pending` for the backoff, then a new execution is started
  from the runtime snapshot stored with the job, and attempt A's objects are removed;
- when the cluster cannot be read, active jobs go to `unknown` (with their last known state and since when)
  and come back by themselves on the next readable cycle."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs import enqueue, recovery
from jobs.models import Execution, Job, JobEvent, JobState
from jobs.naming import trainjob_name
from jobs.supervision.status import DerivedStatus

SUPERVISED = frozenset({JobState.QUEUED, JobState.RUNNING, JobState.UNKNOWN})


RETRY_BACKOFF = "retry-backoff"


def _digest(status: DerivedStatus) -> str:
    data = {
        "state": status.state,
        "cause": status.cause,
        "rank": status.rank,
        "exit_code": status.exit_code,
        "message": status.message,
        "evidence": status.evidence,
        "queued_reason": status.queued_reason,
        "identity_findings": status.identity_findings,
        "ranks": status.ranks,
        "restart_attempt": status.restart_attempt,
        "pods": status.pods,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _nothing_new(status: DerivedStatus, digest: str, execution: Execution, job_state: str) -> bool:
    """The same state, and the same observation as last written (a job read `unknown` always changes)."""
    return (
        status.state == execution.state
        and job_state != JobState.UNKNOWN
        and digest == execution.observed_digest
    )


def _event(job_id: str, attempt: int | None, kind: str, message: str, **fields: Any) -> None:
    details = fields.pop("details", {})
    JobEvent.objects.create(
        job_id=job_id, attempt=attempt, kind=kind, message=message, details=details, **fields
    )


def _new_findings(before: list[Any] | None, after: list[Any]) -> list[Any]:
    """Identity findings in `after` that `before` did not have (by attempt, rank and restart attempt)."""

    def key(finding: Any) -> tuple[Any, ...]:
        return (finding.get("attempt"), finding.get("rank"), finding.get("restart_attempt"))

    seen = {key(f) for f in before or [] if isinstance(f, dict)}
    return [f for f in after or [] if isinstance(f, dict) and key(f) not in seen]


def apply_status(*, execution_id: int, status: DerivedStatus, digest: str = "") -> bool:
    """Write one execution's derived status; True when its state changed. Compare-and-set under row locks
    (job, then execution: the order every writer uses), so a second supervisor with the same observation
    finds nothing left to do."""
    now = timezone.now()
    digest = digest or _digest(status)
    with transaction.atomic():
        execution = Execution.objects.filter(pk=execution_id).only("job_id").first()
        if execution is None:
            return False
        job = Job.objects.select_for_update().filter(pk=execution.job_id).first()
        execution = Execution.objects.select_for_update().filter(pk=execution_id).first()
        if job is None or execution is None:
            return False
        if job.state not in SUPERVISED or execution.state not in SUPERVISED:
            return False  # cancelled, or already finished by another supervisor
        if job.current_attempt != execution.attempt:
            return False
        if _nothing_new(status, digest, execution, job.state):
            return False
        changed = status.state != execution.state or job.state == JobState.UNKNOWN
        old_state = execution.state
        fields: dict[str, Any] = {
            "state": status.state,
            "cause": status.cause or "",
            "message": status.message,
            "rank": status.rank,
            "exit_code": status.exit_code,
            "evidence": status.evidence,
            "queued_reason": status.queued_reason,
            "identity_findings": status.identity_findings,
            "ranks": status.ranks,
            "pods_seen": status.pods,
            "restart_attempt": status.restart_attempt,
            "observed_at": now,
            "observed_digest": digest,
        }
        if status.state == JobState.RUNNING and execution.started_at is None:
            fields["started_at"] = now
        if status.terminal:
            fields["finished_at"] = now
        Execution.objects.filter(pk=execution.pk).update(**fields)
        new_findings = _new_findings(execution.identity_findings, status.identity_findings)
        # On the timeline; metrics, webhooks and the change feed see it there (jobs.observability).
        if new_findings:
            why = "; ".join(str(f.get("why", "")) for f in new_findings)
            _event(job.pk, execution.attempt, "identity-finding", why, details={"findings": new_findings})

        job_fields: dict[str, Any] = {
            "cause": status.cause or "",
            "message": status.message,
            "evidence": status.evidence,
            "failing_rank": status.rank,
            "exit_code": status.exit_code,
            "queued_reason": status.queued_reason,
            "identity_findings": status.identity_findings,
            "last_known_state": "",
            "unknown_since": None,
            "updated_at": now,
        }
        if not changed:
            Job.objects.filter(pk=job.pk).update(**job_fields)
            return False

        from_state = job.state if job.state == JobState.UNKNOWN else old_state
        decision = None
        if status.state == JobState.FAILED:
            earlier = list(
                Execution.objects.filter(job_id=job.pk, attempt__lt=execution.attempt).values_list(
                    "cause", flat=True
                )
            )
            policy = job.recovery_policy or recovery.resolve(None, (job.spec or {}).get("recovery_policy"))
            decision = recovery.decide(policy, earlier, status.cause or "")
        _event(
            job.pk,
            execution.attempt,
            "transition",
            status.message or f"{from_state} → {status.state}",
            from_state=from_state,
            to_state=status.state,
            cause=status.cause or "",
            details={"evidence": status.evidence, "queued_reason": status.queued_reason},
        )
        if decision is not None and decision.retry:
            until = now + timedelta(seconds=decision.backoff_seconds)
            message = (
                f"attempt {execution.attempt} failed ({status.cause}: {status.message}); attempt "
                f"{execution.attempt + 1} starts after {decision.backoff_seconds} s ({decision.why})"
            )
            job_fields.update(
                state=JobState.PENDING,
                state_changed_at=now,
                message=message,
                queued_reason={
                    "reason": RETRY_BACKOFF,
                    "message": message,
                    "since": now.isoformat(),
                    "until": until.isoformat(),
                    "cause": status.cause,
                },
            )
            Job.objects.filter(pk=job.pk).update(**job_fields)
            _event(
                job.pk,
                execution.attempt,
                "retry",
                message,
                from_state=status.state,
                to_state=JobState.PENDING,
                cause=status.cause or "",
                details={"backoff_seconds": decision.backoff_seconds, "why": decision.why},
            )
            _request_delete(execution_id, now)
            return True
        job_fields.update(state=status.state, state_changed_at=now)
        if decision is not None:
            job_fields["message"] = (
                f"{status.message} (not retried: {decision.why})" if status.message else ""
            )
        Job.objects.filter(pk=job.pk).update(**job_fields)
        if status.stop:
            # dispatch ended it (a waiting cause ran out, the promise broke, the runtime is gone): stop it.
            _request_delete(execution_id, now)
    return True


def _mark_unknown(execution: Execution, error: str) -> int:
    """The cluster could not be read: the job is `unknown`, keeping its last known state and since when."""
    now = timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=execution.job_id).first()
        if job is None or job.state not in (JobState.QUEUED, JobState.RUNNING):
            return 0
        Job.objects.filter(pk=job.pk).update(
            state=JobState.UNKNOWN,
            last_known_state=job.state,
            unknown_since=now,
            state_changed_at=now,
            updated_at=now,
            message=f"the cluster could not be read: {error}",
        )
        _event(
            job.pk,
            execution.attempt,
            "transition",
            f"the cluster could not be read: {error}",
            from_state=job.state,
            to_state=JobState.UNKNOWN,
        )
    return 1


def _start_due_retries() -> int:
    """Jobs whose retry backoff ran out get their next execution (A+1), started by the submit task."""
    now = timezone.now()
    started = 0
    waiting = Job.objects.filter(state=JobState.PENDING, queued_reason__reason=RETRY_BACKOFF)
    for job in waiting:
        until = datetime.fromisoformat(str(job.queued_reason.get("until")))
        if until > now:
            continue
        attempt = job.current_attempt + 1
        with transaction.atomic():
            moved = Job.objects.filter(
                pk=job.pk,
                state=JobState.PENDING,
                current_attempt=job.current_attempt,
                queued_reason__reason=RETRY_BACKOFF,
            ).update(current_attempt=attempt, queued_reason={}, updated_at=now)
            if not moved:
                continue  # another supervisor started it
            execution = Execution.objects.create(
                job=job, attempt=attempt, trainjob_name=trainjob_name(job.pk, attempt)
            )
            _event(job.pk, attempt, "attempt", f"starting attempt {attempt}")
            transaction.on_commit(enqueue.on_commit_send(enqueue.EXECUTION_SUBMIT, execution.pk), robust=True)
        started += 1
    return started


def _request_delete(execution_id: int, now: datetime) -> None:
    """Remove the attempt's objects: recorded first, so the stale sweep redoes it if the message is lost."""
    Execution.objects.filter(pk=execution_id).update(delete_requested_at=now, objects_removed_at=None)
    transaction.on_commit(enqueue.on_commit_send(enqueue.EXECUTION_DELETE, execution_id), robust=True)
