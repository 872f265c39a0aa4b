"""Celery tasks of sessions: the watchers of a starting and of a closing session."""

from __future__ import annotations

from celery import shared_task

from jobs import enqueue
from jobs.sessions import lost, services

# A watcher looks for this long, then hands over to a fresh delivery, so a slow start never holds a worker
# for the whole open timeout.
SESSION_WATCH_SLICE_SECONDS = 20


@shared_task(name=enqueue.SESSION_WATCH, acks_late=True, ignore_result=True)
def session_watch(session_id: str) -> None:
    """starting -> running or failed (jobs.sessions.services.session_observe, compare-and-set)."""
    if not services.session_watch(session_id=session_id, budget_seconds=SESSION_WATCH_SLICE_SECONDS):
        enqueue.send(enqueue.SESSION_WATCH, session_id, countdown=1)


@shared_task(name=enqueue.SESSION_CLOSE_WATCH, acks_late=True, ignore_result=True)
def session_close_watch(session_id: str) -> None:
    """closing -> closed once the TrainJob's pods are gone (or with a warning after the close timeout)."""
    done = services.session_watch(
        session_id=session_id, budget_seconds=SESSION_WATCH_SLICE_SECONDS, closing=True
    )
    if not done:
        enqueue.send(enqueue.SESSION_CLOSE_WATCH, session_id, countdown=1)


@shared_task(name=enqueue.SESSIONS_SWEEP, ignore_result=True)
def sessions_sweep() -> None:
    """Beat: sessions whose MultiKueue worker is lost (first: they end, however their pods look), then those
    whose watcher message was lost, closing ones, expired ones, trainer pods."""
    lost.sessions_worker_lost_sweep()
    services.sessions_sweep()


@shared_task(name=enqueue.SESSION_LEFTOVERS_SWEEP, ignore_result=True)
def session_leftovers_sweep() -> None:
    """Beat: what a lost worker still holds of the sessions that ended while it was lost, once back."""
    lost.session_leftovers_sweep()
