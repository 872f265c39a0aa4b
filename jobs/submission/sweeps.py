"""The stale sweep: accepted work whose task was lost or ran out of retries is enqueued again."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import F, Q
from django.utils import timezone

from jobs import enqueue
from jobs.models import Execution, JobState

STALE_PENDING_SECONDS = 60


# A delete not done two sweep periods after it was asked for is enqueued again (deletes are idempotent;
# a second chain beside a live one only costs a few requests).
STALE_DELETE_FACTOR = 2


def executions_resubmit_stale(*, older_than_seconds: int = STALE_PENDING_SECONDS) -> list[int]:
    """Enqueue again what was accepted but whose task was lost (the broker was down, a message expired, a
    worker died) or ran out of retries during an outage: a pending execution no chain holds, and a delete
    (cancel, refusal) whose objects are not yet removed. Both tasks are idempotent."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=older_than_seconds)
    unclaimed = Q(claim_until__isnull=True) | Q(claim_until__lt=now)
    startable = Q(job__state=JobState.PENDING) | Q(
        job__state=JobState.UNKNOWN, job__last_known_state=JobState.PENDING
    )
    stale = list(
        Execution.objects.filter(startable, unclaimed, state=JobState.PENDING, created_at__lt=cutoff)
        .filter(attempt__gte=F("job__current_attempt"))
        .values_list("pk", flat=True)
    )
    for execution_id in stale:
        enqueue.send(enqueue.EXECUTION_SUBMIT, execution_id)
    delete_cutoff = now - timedelta(seconds=older_than_seconds * STALE_DELETE_FACTOR)
    deletes = list(
        Execution.objects.filter(
            delete_requested_at__lte=delete_cutoff, objects_removed_at__isnull=True
        ).values_list("pk", flat=True)
    )
    for execution_id in deletes:
        enqueue.send(enqueue.EXECUTION_DELETE, execution_id)
    return stale + deletes
