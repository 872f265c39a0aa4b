from __future__ import annotations

import logging

from celery import shared_task

from cluster.errors import ClusterError

logger = logging.getLogger(__name__)


@shared_task(name="runtimes.tasks.runtimes_recheck", ignore_result=True)
def runtimes_recheck() -> None:
    """Beat: re-check every allow-listed runtime. An unreadable cluster waits for the next beat."""
    from runtimes import services

    try:
        services.runtimes_recheck()
    except ClusterError as exc:
        logger.warning("runtime re-check skipped: %s", exc)
