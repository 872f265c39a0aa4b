"""The usage rollup: each ended attempt is measured once (jobs.usage.measure) and added to its day's rows.

Every run may overlap another (two beats, a redelivered task): an attempt is claimed by compare-and-set on
Execution.usage_rolled_at inside the transaction that adds it, so it is counted exactly once; each
transaction locks the job, its execution, then one UsageDay row, always in that order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from dispatch_site import metrics, roles
from jobs.models import Execution, Job, JobEvent
from jobs.usage import measure
from jobs.usage.models import UsageDay, usage_key, wait_column

BATCH: Final = 500


def _add(key: dict[str, Any], **amounts: Any) -> None:
    """Add amounts to the row under key, made first when new (when a concurrent rollup made it: to its)."""
    try:
        with transaction.atomic():
            UsageDay.objects.get_or_create(**key)
    except IntegrityError:
        pass  # made meanwhile by another rollup: it exists now
    UsageDay.objects.filter(**key).update(**{name: F(name) + value for name, value in amounts.items()})


def execution_usage_roll(*, execution_id: int, managed: frozenset[str] | None = None) -> bool:
    """Measure one ended attempt and add it to the rollup; False when it is not due (not ended, counted).
    Locks in supervision's order (the job, then its execution), then the rollup's rows."""
    now = timezone.now()
    if managed is None:
        managed = frozenset(roles.namespaces_granted_to_anyone())
    job_id = Execution.objects.filter(pk=execution_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return False
    with transaction.atomic():
        job = Job.objects.select_for_update(of=("self",)).select_related("owner").filter(pk=job_id).first()
        claimed = Execution.objects.filter(
            pk=execution_id, usage_rolled_at__isnull=True, finished_at__isnull=False
        ).update(usage_rolled_at=now)
        if job is None or not claimed:
            return False
        execution = Execution.objects.get(pk=execution_id)
        usage = measure.attempt_usage(
            execution.pods_seen or {},
            state=execution.state,
            started_at=execution.started_at,
            submitted_at=execution.submitted_at,
            ended_at=execution.finished_at,
        )
        Execution.objects.filter(pk=execution_id).update(
            gpu_seconds=usage.gpu_seconds,
            cpu_seconds=usage.cpu_seconds,
            queue_wait_seconds=usage.queue_wait_seconds,
        )
        Job.objects.filter(pk=job_id).update(updated_at=now)  # the job's ETag changes: its page shows them
        assert execution.finished_at is not None  # claimed only when ended
        key = {
            "day": execution.finished_at.astimezone(UTC).date(),
            **usage_key(job, measure.outcome(execution.state, execution.cause)),
        }
        waited = (
            {}
            if usage.queue_wait_seconds is None
            else {wait_column(measure.wait_bucket(usage.queue_wait_seconds)): 1}
        )
        _add(
            key,
            gpu_seconds=usage.gpu_seconds,
            gpu_seconds_lost=usage.gpu_seconds if usage.lost else 0.0,
            cpu_seconds=usage.cpu_seconds,
            attempts=1,
            jobs=1 if execution.attempt == 1 else 0,
            **waited,
        )
        transaction.on_commit(lambda: _observe(key, usage, managed))
    return True


def _observe(key: dict[str, Any], usage: measure.AttemptUsage, managed: frozenset[str]) -> None:
    """The Prometheus view of one counted attempt (after it committed: a rolled-back count is not shown)."""
    namespace = key["namespace"] if key["namespace"] in managed else "other"  # bounded by the grants
    metrics.GPU_SECONDS.labels(namespace, key["queue"], key["outcome"]).inc(usage.gpu_seconds)
    if usage.queue_wait_seconds is not None:
        metrics.ATTEMPT_QUEUE_WAIT.labels(key["queue"]).observe(usage.queue_wait_seconds)


def usage_rollup(*, limit: int = BATCH) -> int:
    """Count the ended attempts not counted yet, oldest first, at most `limit`; how many this run counted."""
    due = list(
        Execution.objects.filter(usage_rolled_at__isnull=True, finished_at__isnull=False)
        .order_by("finished_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    managed = frozenset(roles.namespaces_granted_to_anyone())
    return sum(execution_usage_roll(execution_id=pk, managed=managed) for pk in due)


PRUNED: Final[dict[str, Any]] = {
    "evidence": [],
    "pods_seen": {},
    "ranks": [],
    "log_tail": {},
    "identity_findings": [],
    "supervision_warnings": [],
    "queued_reason": {},
}


def history_prune(*, retention_days: int, now: datetime | None = None, limit: int = BATCH) -> int:
    """Clear the details of attempts that ended more than `retention_days` ago and that the rollup counted
    (their usage is in the day rows and on the attempt), and their jobs' timeline entries from before then:
    evidence, remembered pods, ranks, the log tail. The job, each attempt's state, cause, message, times and
    usage stay. 0 days: nothing. Safe twice at once: each attempt is claimed by compare-and-set."""
    if retention_days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=retention_days)
    due = list(
        Execution.objects.filter(
            finished_at__lt=cutoff, usage_rolled_at__isnull=False, details_pruned_at__isnull=True
        )
        .order_by("finished_at", "pk")
        .values_list("pk", "job_id")[:limit]
    )
    pruned = 0
    for pk, job_id in due:
        with transaction.atomic():
            claimed = Execution.objects.filter(pk=pk, details_pruned_at__isnull=True).update(
                details_pruned_at=timezone.now(), **PRUNED
            )
            if claimed:
                JobEvent.objects.filter(job_id=job_id, at__lt=cutoff).delete()
                pruned += 1
    return pruned
