"""Write what a cycle derived, and act on it.

- every transition is compare-and-set under row locks taken in one order (job, then execution), and written
  as a JobEvent (from, to, cause, evidence): two supervisors at once never double-record or double-act;
- an observation older than the one written last is refused (Execution.observed_at: when the cluster was
  read, on the database's clock: jobs.supervision.clock), and the pods' memory is only ever added to, so
  state and memory never go back; so is a final status derived without a tombstone written after the cycle
  read them (it may hold the DisruptionTarget that explains the failure): the cycle derives it again;
- every terminal failure deletes the attempt's TrainJob (never its JobSet: status-facts §12), so healthy
  ranks do not keep their GPUs;
- a failed execution is followed by attempt A+1 when the job's recovery policy says so
  (jobs.recovery): the job goes back to `pending` for the backoff, attempt A's TrainJob is deleted, and
  A+1 starts (from the runtime snapshot stored with the job) once the backoff ran out, A's TrainJob is gone or
  the Trainer shows it suspended, and a list shows none of A's pods still running;
- identity findings are written on the job's timeline when they appear, whatever the state (a completed job
  keeps them);
- when the cluster cannot be read, active jobs go to `unknown` (with their last known state and since when)
  and come back by themselves on the next readable cycle."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models.signals import post_save
from django.utils import timezone

from jobs import enqueue, recovery
from jobs.models import Execution, Job, JobEvent, JobState, PodTombstone
from jobs.supervision.clock import observation_time
from jobs.supervision.status import DerivedStatus, merge_memory

SUPERVISED = frozenset({JobState.QUEUED, JobState.RUNNING, JobState.UNKNOWN})


class Applied(NamedTuple):
    changed: bool  # the state changed
    supervised: bool  # the execution is still supervised
    # Not written: the observation began before the one written last, or a final status missed a tombstone
    # written since the cycle read them. The execution is to be derived again on the next cycle.
    refused: bool = False


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
        "warnings": status.warnings,
        "cluster": status.cluster,
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


def consume_tombstones(ids: list[int]) -> None:
    """The tombstones a committed status used (its memory holds what they said)."""
    if ids:
        PodTombstone.objects.filter(pk__in=ids).delete()


def finding_key(finding: dict[str, Any]) -> tuple[Any, ...]:
    return (finding.get("attempt"), finding.get("restart_attempt"), finding.get("rank"), finding.get("why"))


def apply_status(
    *,
    execution_id: int,
    status: DerivedStatus,
    digest: str = "",
    observed_at: datetime | None = None,
    tombstone_ids: list[int] | None = None,
    job_id: str | None = None,
) -> Applied:
    """Write one execution's derived status (see Applied). Compare-and-set under row locks (job, then
    execution: the order every writer uses), so a second supervisor with the same observation finds nothing
    left to do, and one with an older observation (`observed_at`, when the cluster read began, on the
    database's clock) is refused. The tombstones the status used (`tombstone_ids`) are deleted in the same
    transaction, and only those: one written after the cycle read them stays for the next cycle, and a
    status that would end the execution without it is refused. A few round trips: a failure is written
    within a second of being seen even when many fail at once."""
    now = timezone.now()
    observed_at = observed_at or observation_time()
    digest = digest or _digest(status)
    used = list(tombstone_ids or [])
    with transaction.atomic():
        if job_id is None:
            job_id = Execution.objects.filter(pk=execution_id).values_list("job_id", flat=True).first()
            if job_id is None:
                return Applied(False, False)
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        execution = Execution.objects.select_for_update().filter(pk=execution_id, job_id=job_id).first()
        if job is None or execution is None:
            return Applied(False, False)
        if (
            job.state not in SUPERVISED
            or execution.state not in SUPERVISED
            or job.current_attempt != execution.attempt
        ):
            PodTombstone.objects.filter(execution_id=execution.pk).delete()  # no cycle will use them
            return Applied(False, False)  # cancelled, or already finished by another supervisor
        if execution.observed_at is not None and observed_at < execution.observed_at:
            return Applied(False, True, refused=True)  # a newer observation was written meanwhile
        if _nothing_new(status, digest, execution, job.state):
            consume_tombstones(used)
            return Applied(False, True)
        unseen = PodTombstone.objects.filter(execution_id=execution.pk).exclude(pk__in=used)
        if status.terminal and unseen.exists():
            # A pod's tombstone came after the cycle read them (another supervisor's watch, or a delivery
            # with the DisruptionTarget replacing the one read): the cause may be in it. The execution's row
            # lock keeps more from coming (keep_tombstones locks it too) while this is decided.
            return Applied(False, True, refused=True)
        changed = status.state != execution.state or job.state == JobState.UNKNOWN
        old_state = execution.state
        pods = merge_memory(execution.pods_seen or {}, status.pods)
        if pods != status.pods:
            digest = ""  # another writer remembered a pod this derivation did not see: derive again
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
            "pods_seen": pods,
            "supervision_warnings": status.warnings,
            "restart_attempt": status.restart_attempt,
            "observed_at": observed_at,
            "observed_digest": digest,
        }
        if status.state == JobState.RUNNING and execution.started_at is None:
            fields["started_at"] = now
        if status.cluster:  # kept once known: an eviction clears the Workload's clusterName
            fields["cluster"] = status.cluster
        if status.terminal:
            fields["finished_at"] = now
        job_fields: dict[str, Any] = {
            "cause": status.cause or "",
            "message": status.message,
            "evidence": status.evidence,
            "failing_rank": status.rank,
            "exit_code": status.exit_code,
            "queued_reason": status.queued_reason,
            "identity_findings": status.identity_findings,
            "supervision_warnings": status.warnings,
            "last_known_state": "",
            "unknown_since": None,
            "updated_at": now,
        }
        events = _finding_events(job.pk, execution, status)
        decision = None
        delete = False
        if changed:
            from_state = job.state if job.state == JobState.UNKNOWN else old_state
            if status.state == JobState.FAILED:
                earlier = list(
                    Execution.objects.filter(job_id=job.pk, attempt__lt=execution.attempt).values_list(
                        "cause", flat=True
                    )
                )
                policy = job.recovery_policy or recovery.resolve(
                    None, (job.spec or {}).get("recovery_policy")
                )
                decision = recovery.decide(policy, earlier, status.cause or "")
            events.append(
                _new_event(
                    job.pk,
                    execution.attempt,
                    "transition",
                    status.message or f"{from_state} → {status.state}",
                    from_state=from_state,
                    to_state=status.state,
                    cause=status.cause or "",
                    details={"evidence": status.evidence, "queued_reason": status.queued_reason},
                )
            )
            job_fields.update(state=status.state, state_changed_at=now)
            if decision is not None and decision.retry:
                until = now + timedelta(seconds=decision.backoff_seconds)
                message = (
                    f"attempt {execution.attempt} failed ({status.cause}: {status.message}); attempt "
                    f"{execution.attempt + 1} starts after {decision.backoff_seconds} s ({decision.why}) "
                    f"once attempt {execution.attempt}'s pods have stopped"
                )
                job_fields.update(
                    state=JobState.PENDING,
                    message=message,
                    queued_reason={
                        "reason": RETRY_BACKOFF,
                        "message": message,
                        "since": now.isoformat(),
                        "until": until.isoformat(),
                        "cause": status.cause,
                    },
                )
                events.append(
                    _new_event(
                        job.pk,
                        execution.attempt,
                        "retry",
                        message,
                        from_state=status.state,
                        to_state=JobState.PENDING,
                        cause=status.cause or "",
                        details={"backoff_seconds": decision.backoff_seconds, "why": decision.why},
                    )
                )
            elif decision is not None:
                job_fields["message"] = (
                    f"{status.message} (not retried: {decision.why})" if status.message else ""
                )
            # Every terminal failure deletes the TrainJob (a Job's FailureTarget leaves healthy ranks running
            # until their JobSet fails), and so does a stop dispatch decided (a waiting cause ran out, the
            # promise broke, the runtime is gone), and so does a retry (A+1 is a new TrainJob).
            delete = status.stop or status.state == JobState.FAILED
        if delete:
            # Recorded first, so the stale sweep redoes it if the message is lost.
            fields.update(delete_requested_at=now, objects_removed_at=None)
        Execution.objects.filter(pk=execution.pk).update(**fields)
        Job.objects.filter(pk=job.pk).update(**job_fields)
        if events:
            JobEvent.objects.bulk_create(events)
            # bulk_create sends no post_save; the outbox (jobs.observability) records each event from it, in
            # this transaction.
            for event in events:
                post_save.send(JobEvent, instance=event, created=True, raw=False, using=event._state.db)
        supervised = not status.terminal and not (decision is not None and decision.retry)
        if supervised:
            consume_tombstones(used)
        else:
            # Leaving supervision (a final status: it used every tombstone there is, checked above under the
            # row lock), so these are exactly the ones used.
            PodTombstone.objects.filter(execution_id=execution.pk).delete()
        if delete:
            transaction.on_commit(enqueue.on_commit_send(enqueue.EXECUTION_DELETE, execution_id), robust=True)
    if not changed:
        return Applied(False, True)
    return Applied(True, supervised)


def _new_event(job_id: str, attempt: int | None, kind: str, message: str, **fields: Any) -> JobEvent:
    details = fields.pop("details", {})
    return JobEvent(job_id=job_id, attempt=attempt, kind=kind, message=message, details=details, **fields)


def _finding_events(job_id: str, execution: Execution, status: DerivedStatus) -> list[JobEvent]:
    """New identity findings go on the timeline when they appear, whatever the state: a job that completed
    (Complete wins the state) still shows the rank that ran twice."""
    known = {finding_key(f) for f in execution.identity_findings or []}
    new = [f for f in status.identity_findings if finding_key(f) not in known]
    if not new:
        return []
    unexpected = [f for f in new if not f.get("expected")]
    what = "identity finding" if len(new) == 1 else f"{len(new)} identity findings"
    return [
        _new_event(
            job_id,
            execution.attempt,
            "identity-finding",
            f"{what}: " + "; ".join(f["why"] for f in new),
            cause="identity-violation" if unexpected else "",
            details={"findings": new},
        )
    ]


def _mark_unknown(execution: Execution, error: str, read_at: datetime | None = None) -> int:
    """The cluster could not be read: the job is `unknown`, keeping its last known state and since when.
    Not over a status observed after `read_at` (another supervisor could read it). A job already unknown
    gets the new reason when it changed (the manager answers again but its worker does not, say: the message
    must name what cannot be read now), without another transition."""
    now = timezone.now()
    message = f"the cluster could not be read: {error}"
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=execution.job_id).first()
        if job is None or job.state not in (JobState.QUEUED, JobState.RUNNING, JobState.UNKNOWN):
            return 0
        observed = Execution.objects.filter(pk=execution.pk).values_list("observed_at", flat=True).first()
        if read_at is not None and observed is not None and observed > read_at:
            return 0
        if job.state == JobState.UNKNOWN:
            if job.message != message:
                Job.objects.filter(pk=job.pk, state=JobState.UNKNOWN).update(message=message, updated_at=now)
            return 0
        Job.objects.filter(pk=job.pk).update(
            state=JobState.UNKNOWN,
            last_known_state=job.state,
            unknown_since=now,
            state_changed_at=now,
            updated_at=now,
            message=message,
        )
        _event(
            job.pk,
            execution.attempt,
            "transition",
            message,
            from_state=job.state,
            to_state=JobState.UNKNOWN,
        )
    return 1
