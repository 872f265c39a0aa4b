"""Celery task of supervision: the beat's cycle (plain list reads), unless a `manage.py supervise` with
watches is alive: it does the same work from its watches (jobs.supervision.watch)."""

from __future__ import annotations

import logging

from celery import shared_task

from jobs import enqueue
from jobs.supervision import cycle
from jobs.supervision.watch import watcher_alive

logger = logging.getLogger(__name__)


@shared_task(name=enqueue.SUPERVISE, ignore_result=True)
def supervise() -> None:
    """Beat: one supervision cycle (jobs.supervision.cycle). A cycle that finds another one running skips."""
    if watcher_alive():
        return
    report = cycle.supervise()
    if report.ran and (report.transitions or report.retries_started or report.error):
        logger.info(
            "supervision: %d executions, %d transitions, %d retries started, %d API requests, %d ms%s",
            report.executions,
            report.transitions,
            report.retries_started,
            report.api_requests,
            report.duration_ms,
            f", error: {report.error}" if report.error else "",
        )
