"""Celery tasks of submission: thin. Each takes a primary key; the service reloads the row and returns if
there is nothing to do."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from jobs import enqueue
from jobs.submission import cancel, leftovers, start, sweeps
from jobs.submission.errors import TransientSubmitError

logger = logging.getLogger(__name__)

MAX_SUBMIT_RETRIES = 8


def _backoff(retries: int) -> int:
    return int(min(2**retries, 60))


@shared_task(bind=True, name=enqueue.EXECUTION_SUBMIT, acks_late=True, max_retries=MAX_SUBMIT_RETRIES)
def execution_submit(self: Any, execution_id: int) -> None:
    """One delivery chain: its task id (kept across its retries and a redelivery) is its claim on the
    execution, so a second chain (the sweep's) does nothing while this one works or backs off."""
    holder = str(self.request.id or "")
    countdown = _backoff(self.request.retries)
    try:
        start.execution_submit(execution_id=execution_id, holder=holder or None, retry_in=countdown)
    except TransientSubmitError as exc:
        if self.request.retries >= MAX_SUBMIT_RETRIES:
            start.execution_give_up(execution_id=execution_id, error=str(exc), holder=holder)
            return
        logger.warning("execution %s: transient error, retrying: %s", execution_id, exc)
        raise self.retry(exc=exc, countdown=countdown) from exc


@shared_task(bind=True, name=enqueue.EXECUTION_DELETE, acks_late=True, max_retries=MAX_SUBMIT_RETRIES)
def execution_delete(self: Any, execution_id: int) -> None:
    try:
        cancel.execution_delete(execution_id=execution_id)
    except TransientSubmitError as exc:
        if self.request.retries >= MAX_SUBMIT_RETRIES:
            cancel.execution_delete_gave_up(execution_id=execution_id, error=str(exc))
            return
        raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from exc


@shared_task(name=enqueue.EXECUTIONS_RESUBMIT_STALE, ignore_result=True)
def executions_resubmit_stale() -> None:
    """Beat: accepted work whose task was lost or ran out of retries (a start no chain holds, a delete not
    done) is enqueued again (the job row is the source of truth)."""
    stale = sweeps.executions_resubmit_stale()
    if stale:
        logger.warning("re-enqueued %d stale starts and deletes: %s", len(stale), stale)


@shared_task(name=enqueue.WORKER_LEFTOVERS_SWEEP, ignore_result=True)
def worker_leftovers_sweep() -> None:
    """Beat: the TrainJob copies a lost MultiKueue worker still holds for ended attempts, once it answers."""
    leftovers.worker_leftovers_sweep()
