"""The claim on a pending execution: one delivery chain at a time works on it, under row locks taken in the
one order every writer uses (job, then execution), with a lease that a dead holder's chain loses."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db.models import Exists, Model, OuterRef, Q
from django.utils import timezone

from dispatch_site import sql
from jobs.models import Execution, Job, JobEvent, JobState
from jobs.submission.errors import ClaimLost


def job_event(
    job: Job,
    kind: str,
    message: str,
    attempt: int | None = None,
    *,
    execution: Execution | None = None,
    **details: Any,
) -> None:
    """One timeline entry; `execution`, when the caller has the event's execution at hand, saves the outbox
    its read of it."""
    event = JobEvent(job=job, kind=kind, message=message, attempt=attempt, details=details)
    if execution is not None:
        event.execution_facts = (execution.rank, execution.exit_code, execution.created_at)
    event.save(force_insert=True)


def job_transition(
    job: Job, old: set[str] | frozenset[str], new: str, *, where: Q | None = None, **fields: Any
) -> bool:
    """Compare-and-set the job's state (and `where`, when given); False when another worker or request changed
    it first."""
    now = timezone.now()
    jobs = Job.objects.filter(pk=job.pk, state__in=old)
    if where is not None:
        jobs = jobs.filter(where)
    updated = jobs.update(state=new, state_changed_at=now, updated_at=now, **fields)
    return updated == 1


# How long one delivery may work on a pending execution before another may take over (its worker died):
# longer than one delivery's cluster calls (a few requests of KUBE_TIMEOUT_SECONDS each).
SUBMIT_LEASE_SECONDS = 120


# A job that could not be started because the cluster was unreachable is `unknown` with this last known state;
# the sweep starts it again once its chain has run out.
STARTABLE = frozenset({JobState.PENDING, JobState.UNKNOWN})


# The large JSON fields submission never reads under its locks (supervision's and the page's): left unread, as
# decoding them (the plan holds both object bodies) cost more than the rest of a start's queries together.
# runtime_snapshot is read on access, by a retry's start only.
_JOB_UNREAD = ("plan", "runtime_snapshot", "reasons", "evidence", "identity_findings", "queued_reason")
_EXECUTION_UNREAD = ("evidence", "ranks", "pods_seen", "identity_findings", "queued_reason")


def locked_job_and_execution(execution_id: int, job_id: str | None = None) -> tuple[Job, Execution] | None:
    """The execution and its job, row-locked in the one order every writer uses: job, then execution.
    A caller that knows the job's id passes it (one query fewer)."""
    if job_id is None:
        job_id = Execution.objects.filter(pk=execution_id).values_list("job_id", flat=True).first()
        if job_id is None:
            return None
    job = (
        Job.objects.select_for_update(of=("self",))
        .select_related("owner")
        .defer(*_JOB_UNREAD)
        .filter(pk=job_id)
        .first()
    )
    execution = (
        Execution.objects.select_for_update()
        .defer(*_EXECUTION_UNREAD)
        .filter(pk=execution_id, job_id=job_id)
        .first()
    )
    if job is None or execution is None:
        return None
    return job, execution


def is_startable(job: Job, execution: Execution) -> bool:
    """Is this pending execution the one its job waits for? (`unknown`: it never reached the cluster)"""
    if execution.state != JobState.PENDING or execution.attempt < job.current_attempt:
        return False
    if job.state == JobState.UNKNOWN:
        return job.last_known_state == JobState.PENDING
    return job.state == JobState.PENDING


def _job_waits_for(execution_column: str = "attempt") -> Exists:
    """The execution's job waits for it to be started: pending (or unknown, never having reached the
    cluster), and the execution is its current attempt. A subquery on the job, not a join, so a
    compare-and-set UPDATE on the execution keeps every condition on its own row in the statement's own WHERE
    (PostgreSQL re-checks those on the row it locks; a join's would be read from the statement's snapshot)."""
    return Exists(
        Job.objects.filter(pk=OuterRef("job_id"), current_attempt__lte=OuterRef(execution_column)).filter(
            Q(state=JobState.PENDING) | Q(state=JobState.UNKNOWN, last_known_state=JobState.PENDING)
        )
    )


# The statements every start runs (the claim, the fence before each create, the load of what it claimed) are
# written out (dispatch_site.sql): Django compiled the claim and the fence, on every call, in about 0.9 and
# 0.25 ms of CPU against 0.07 ms to send them as they are, and the load in about 1.2 ms against 0.2 (measured:
# a start's worker CPU is what a burst of starts is short of).
@cache
def _claim_sql() -> str:
    e, j = sql.table(Execution), sql.table(Job)
    return (
        f"UPDATE {e} SET claim_holder = %s, claim_until = %s, claim_generation = claim_generation + 1, "
        "submit_tries = submit_tries + 1 "
        "WHERE id = %s AND state = %s AND (claim_until IS NULL OR claim_until < %s OR claim_holder = %s) "
        f"AND EXISTS (SELECT 1 FROM {j} AS w WHERE w.id = {e}.job_id AND w.current_attempt <= {e}.attempt "
        "AND (w.state = %s OR (w.state = %s AND w.last_known_state = %s)))"
    )


@cache
def _fence_sql() -> str:
    return (
        f"UPDATE {sql.table(Execution)} SET claim_until = %s "
        "WHERE id = %s AND claim_holder = %s AND claim_generation = %s AND state = %s"
    )


def _claimed_columns() -> tuple[sql.Columns, sql.Columns, sql.Columns]:
    return (
        sql.columns(Execution, "e", _EXECUTION_UNREAD),
        sql.columns(Job, "j", _JOB_UNREAD),
        sql.columns(_owner_model(), "u"),
    )


def _owner_model() -> type[Model]:
    return Job._meta.get_field("owner").related_model  # type: ignore[return-value]


@cache
def _claimed_sql() -> str:
    execution, job, owner = _claimed_columns()
    return (
        f"SELECT {execution.select}, {job.select}, {owner.select} FROM {sql.table(Execution)} e "
        f"INNER JOIN {sql.table(Job)} j ON j.id = e.job_id "
        f"INNER JOIN {sql.table(_owner_model())} u ON u.id = j.owner_id "
        "WHERE e.id = %s AND e.claim_holder = %s"
    )


def _claimed(execution_id: int, holder: str) -> Execution | None:
    """The claimed execution with its job and the job's owner (what select_related("job", "job__owner") with
    the unread fields deferred gives), in one written-out statement."""
    row = sql.fetch_one(_claimed_sql(), [execution_id, holder])
    if row is None:
        return None
    execution_columns, job_columns, owner_columns = _claimed_columns()
    execution = execution_columns.instance(row)
    job = job_columns.instance(row, len(execution_columns))
    owner = owner_columns.instance(row, len(execution_columns) + len(job_columns))
    Job._meta.get_field("owner").set_cached_value(job, owner)
    Execution._meta.get_field("job").set_cached_value(execution, job)
    assert isinstance(execution, Execution)
    return execution


def execution_claim(execution_id: int, holder: str) -> tuple[Job, Execution, int] | None:
    """Take the execution for this delivery chain before any cluster work: (job, execution, fencing token),
    or None: it is no longer pending (a duplicate delivery, a cancel) or another chain holds it. A chain's
    next delivery (same holder) takes it again; a dead holder's lease runs out. Every claim increments the
    execution's claim generation: the token this delivery shows at every create (claim_fence), so a delivery
    that lost its claim (its lease ran out and another took over, or a cancel) creates nothing.

    One compare-and-set statement takes it (no row lock is held across statements), then one read loads the
    execution with its job and owner."""
    now = timezone.now()
    # Every condition on the execution's own row sits in the statement's own WHERE (PostgreSQL re-checks
    # those on the row it locks); the job's are a correlated EXISTS, not a join (a join's would be read from
    # the statement's snapshot). The same conditions as is_startable and _job_waits_for.
    taken = sql.updated(
        _claim_sql(),
        [
            holder,
            sql.at(now + timedelta(seconds=SUBMIT_LEASE_SECONDS)),
            execution_id,
            JobState.PENDING,
            sql.at(now),
            holder,
            JobState.PENDING,
            JobState.UNKNOWN,
            JobState.PENDING,
        ],
    )
    if not taken:
        # This chain's claim on an execution that moved on (cancelled, refused): release it, so the delete
        # knows no start of this chain can still create anything. (Held by another chain: left alone.)
        Execution.objects.filter(pk=execution_id, claim_holder=holder).exclude(
            Q(state=JobState.PENDING) & _job_waits_for()
        ).update(claim_holder="", claim_until=None)
        return None
    execution = _claimed(execution_id, holder)
    if execution is None:
        return None
    return execution.job, execution, execution.claim_generation


def holds_claim(execution: Execution, holder: str, token: int) -> bool:
    return execution.claim_holder == holder and execution.claim_generation == token


def claim_fence(execution_id: int, holder: str, token: int) -> None:
    """Right before a create: is this delivery's claim still the execution's? One compare-and-set statement
    checks the holder, the fencing token and that the execution still waits to be started, and renews the
    lease; ClaimLost when any of them changed (another delivery took over, a cancel, a newer attempt)."""
    until = timezone.now() + timedelta(seconds=SUBMIT_LEASE_SECONDS)
    renewed = sql.updated(_fence_sql(), [sql.at(until), execution_id, holder, token, JobState.PENDING])
    if renewed != 1:
        raise ClaimLost(f"execution {execution_id}: the claim of {holder} (generation {token}) was lost")


def claim_hold(execution_id: int, holder: str, seconds: float) -> None:
    """The chain backs off for `seconds`: it keeps its claim meanwhile, so the sweep adds no second chain."""
    Execution.objects.filter(pk=execution_id, claim_holder=holder, state=JobState.PENDING).update(
        claim_until=timezone.now() + timedelta(seconds=seconds + SUBMIT_LEASE_SECONDS)
    )


def start_may_still_create(execution: Execution, now: datetime | None = None) -> bool:
    """Could a start delivery still create this execution's objects? While a delivery holds the claim and
    its lease runs: every create is preceded by claim_fence, which renews the lease, so a create that passed
    its fence lands (or fails) long before the lease it renewed runs out, and the holder releases the claim
    when it is done. A delete records the objects removed only once this is False."""
    now = now or timezone.now()
    return bool(execution.claim_holder) and execution.claim_until is not None and execution.claim_until > now
