from __future__ import annotations

from celery import shared_task
from django.conf import settings

from jobs import enqueue
from jobs.usage import services


@shared_task(name=enqueue.USAGE_ROLLUP)
def usage_rollup() -> int:
    """The beat's rollup of ended attempts (jobs.usage.services): safe to run twice at once."""
    return services.usage_rollup()


@shared_task(name=enqueue.HISTORY_PRUNE)
def history_prune() -> int:
    """The beat's prune of old attempts' details (HISTORY_RETENTION_DAYS; 0: never)."""
    return services.history_prune(retention_days=settings.HISTORY_RETENTION_DAYS)
