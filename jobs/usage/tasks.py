from __future__ import annotations

from celery import shared_task

from jobs.usage import services


@shared_task(name="jobs.usage.tasks.usage_rollup")
def usage_rollup() -> int:
    """The beat's rollup of ended attempts (jobs.usage.services): safe to run twice at once."""
    return services.usage_rollup()
