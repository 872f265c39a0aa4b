"""The claim on a pending execution: one delivery chain at a time works on it, under row locks taken in the
one order every writer uses (job, then execution), with a lease that a dead holder's chain loses."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.models import Execution, Job, JobEvent, JobState


def job_event(job: Job, kind: str, message: str, attempt: int | None = None, **details: Any) -> None:
    JobEvent.objects.create(job=job, kind=kind, message=message, attempt=attempt, details=details)


def job_transition(job: Job, old: set[str] | frozenset[str], new: str, **fields: Any) -> bool:
    """Compare-and-set the job's state; False when another worker or request changed it first."""
    now = timezone.now()
    updated = Job.objects.filter(pk=job.pk, state__in=old).update(
        state=new, state_changed_at=now, updated_at=now, **fields
    )
    return updated == 1


# How long one delivery may work on a pending execution before another may take over (its worker died):
# longer than one delivery's cluster calls (a few requests of KUBE_TIMEOUT_SECONDS each).
SUBMIT_LEASE_SECONDS = 120


# A job that could not be started because the cluster was unreachable is `unknown` with this last known state;
# the sweep starts it again once its chain has run out.
STARTABLE = frozenset({JobState.PENDING, JobState.UNKNOWN})


def locked_job_and_execution(execution_id: int) -> tuple[Job, Execution] | None:
    """The execution and its job, row-locked in the one order every writer uses: job, then execution."""
    job_id = Execution.objects.filter(pk=execution_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return None
    job = Job.objects.select_for_update().select_related("owner").filter(pk=job_id).first()
    execution = Execution.objects.select_for_update().filter(pk=execution_id).first()
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


def execution_claim(execution_id: int, holder: str) -> tuple[Job, Execution] | None:
    """Take the execution for this delivery chain before any cluster work, or None: it is no longer pending
    (a duplicate delivery, a cancel) or another chain holds it. A chain's next delivery (same holder)
    takes it again; a dead holder's lease runs out."""
    now = timezone.now()
    with transaction.atomic():
        locked = locked_job_and_execution(execution_id)
        if locked is None:
            return None
        job, execution = locked
        if not is_startable(job, execution):
            return None
        lease_free = (
            execution.claim_until is None or execution.claim_until < now or execution.claim_holder == holder
        )
        if not lease_free:
            return None
        Execution.objects.filter(pk=execution.pk).update(
            claim_holder=holder,
            claim_until=now + timedelta(seconds=SUBMIT_LEASE_SECONDS),
            submit_tries=F("submit_tries") + 1,
        )
    return job, execution


def claim_hold(execution_id: int, holder: str, seconds: float) -> None:
    """The chain backs off for `seconds`: it keeps its claim meanwhile, so the sweep adds no second chain."""
    Execution.objects.filter(pk=execution_id, claim_holder=holder, state=JobState.PENDING).update(
        claim_until=timezone.now() + timedelta(seconds=seconds + SUBMIT_LEASE_SECONDS)
    )
