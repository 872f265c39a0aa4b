"""Celery tasks: thin. Each takes a primary key, reloads the row in the service, and returns if it is gone."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

logger = logging.getLogger(__name__)

MAX_SUBMIT_RETRIES = 8


def _backoff(retries: int) -> int:
    return int(min(2**retries, 60))


@shared_task(bind=True, name="jobs.tasks.execution_submit", acks_late=True, max_retries=MAX_SUBMIT_RETRIES)
def execution_submit(self: Any, execution_id: int) -> None:
    """One delivery chain: its task id (kept across its retries and a redelivery) is its claim on the
    execution, so a second chain (the sweep's) does nothing while this one works or backs off."""
    from jobs import services

    holder = str(self.request.id or "")
    countdown = _backoff(self.request.retries)
    try:
        services.execution_submit(execution_id=execution_id, holder=holder or None, retry_in=countdown)
    except services.TransientSubmitError as exc:
        if self.request.retries >= MAX_SUBMIT_RETRIES:
            services.execution_give_up(execution_id=execution_id, error=str(exc), holder=holder)
            return
        logger.warning("execution %s: transient error, retrying: %s", execution_id, exc)
        raise self.retry(exc=exc, countdown=countdown) from exc


@shared_task(bind=True, name="jobs.tasks.execution_delete", acks_late=True, max_retries=MAX_SUBMIT_RETRIES)
def execution_delete(self: Any, execution_id: int) -> None:
    from jobs import services

    try:
        services.execution_delete(execution_id=execution_id)
    except services.TransientSubmitError as exc:
        if self.request.retries >= MAX_SUBMIT_RETRIES:
            services.execution_delete_gave_up(execution_id=execution_id, error=str(exc))
            return
        raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from exc


@shared_task(name="jobs.tasks.executions_resubmit_stale", ignore_result=True)
def executions_resubmit_stale() -> None:
    """Beat: accepted work whose task was lost or ran out of retries (a start no chain holds, a delete not
    done) is enqueued again (the job row is the source of truth)."""
    from jobs import services

    stale = services.executions_resubmit_stale()
    if stale:
        logger.warning("re-enqueued %d stale starts and deletes: %s", len(stale), stale)


# ---------------------------------------------------------------- supervision


@shared_task(name="jobs.tasks.supervise", ignore_result=True)
def supervise() -> None:
    """Beat: one supervision cycle (jobs.supervision). A cycle that finds another one running skips."""
    from jobs import supervision

    report = supervision.supervise()
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


# ---------------------------------------------------------------- interactive sessions

# A watcher looks for this long, then hands over to a fresh delivery, so a slow start never holds a worker
# for the whole open timeout.
SESSION_WATCH_SLICE_SECONDS = 20


@shared_task(name="jobs.tasks.session_watch", acks_late=True, ignore_result=True)
def session_watch(session_id: str) -> None:
    """starting -> running or failed (jobs.sessions.session_observe, compare-and-set)."""
    from jobs import sessions

    if not sessions.session_watch(session_id=session_id, budget_seconds=SESSION_WATCH_SLICE_SECONDS):
        session_watch.apply_async((session_id,), countdown=1)


@shared_task(name="jobs.tasks.session_close_watch", acks_late=True, ignore_result=True)
def session_close_watch(session_id: str) -> None:
    """closing -> closed once the TrainJob's pods are gone (or with a warning after the close timeout)."""
    from jobs import sessions

    done = sessions.session_watch(
        session_id=session_id, budget_seconds=SESSION_WATCH_SLICE_SECONDS, closing=True
    )
    if not done:
        session_close_watch.apply_async((session_id,), countdown=1)
