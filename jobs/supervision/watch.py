"""The supervisor process (`manage.py supervise`): watches, and a cycle as soon as something changed.

The watches (informers per namespace with active executions: jobs.supervision.cache) keep a copy of what
supervision reads, so a cycle reads no list and derives only the executions whose objects changed; a deleted
pod's last state (a tombstone: often the only evidence of a preemption, eviction or lost node) is written
before the next cycle. A cycle runs within about a tenth of a second of a change, and at least every
SUPERVISOR_INTERVAL_SECONDS (a waiting cause's threshold, the retry backoff, new executions).

The process says it is alive (SupervisorCycle "supervisor-watch"), and the beat's cycle then leaves the work
to it; without a live supervisor the beat's cycle (plain list reads) keeps every job correct on its own.
Several supervisors may run at once (a rolling update): they share the cycle lease, so one runs cycles at a
time, and every write is compare-and-set under row locks; each keeps its own watches, and the tombstones are
in the database, so none is lost when the one that saw a deletion is not the one that runs the next cycle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from jobs.models import SupervisorCycle
from jobs.supervision import cycle
from jobs.supervision.cache import CacheSource

logger = logging.getLogger(__name__)

ALIVE = "supervisor-watch"
DATABASE_RETRY_SECONDS = 2.0  # between tries while the database does not answer
DEBOUNCE_SECONDS = 0.05  # a burst of changes (a JobSet failing: its pods, Jobs, events) in one cycle


def watcher_alive() -> bool:
    """A `manage.py supervise` with watches said it is alive within the last three intervals."""
    return SupervisorCycle.objects.filter(name=ALIVE, lease_until__gt=timezone.now()).exists()


def _say_alive(who: str, period: float) -> None:
    """(Several supervisors may say so at once: the row names the last.)"""
    SupervisorCycle.objects.get_or_create(name=ALIVE)
    SupervisorCycle.objects.filter(name=ALIVE).update(
        lease_holder=who, lease_until=timezone.now() + timedelta(seconds=3 * period)
    )


def run_forever(
    stopped: Callable[[], bool],
    *,
    interval: float | None = None,
    watch: bool = True,
    on_cycle: Callable[[cycle.CycleReport], Any] | None = None,
    source: CacheSource | None = None,
) -> None:
    """Cycles until `stopped()`: at once after a change the watches saw, else every `interval` seconds.
    watch=False: plain list reads every interval (the beat's cycle, in this process)."""
    period = float(interval or settings.SUPERVISOR_INTERVAL_SECONDS)
    cache = source or (CacheSource() if watch else None)
    who = cycle.holder()
    try:
        while not stopped():
            # A connection PostgreSQL dropped (a restart, a failover, pg_terminate_backend) is replaced
            # here, as Django does between requests: the loop outlives the database's outages.
            close_old_connections()
            prepared = 0.0
            if cache is not None:
                started = time.thread_time()
                try:
                    _say_alive(who, period)
                except DatabaseError:
                    logger.exception("supervision: the database did not answer; trying again shortly")
                    _sleep(stopped, min(period, DATABASE_RETRY_SECONDS))
                    continue
                try:
                    cache.prepare()
                except Exception:
                    logger.exception("supervision: could not read the active executions")
                prepared = (time.thread_time() - started) * 1000
            ran = True
            try:
                report = cycle.supervise(source=cache)
                report.prepare_cpu_ms = prepared
                report.resynced = bool(cache is not None and cache.resynced)
                ran = report.ran
                if on_cycle is not None:
                    on_cycle(report)
            except Exception:
                logger.exception("supervision cycle failed")
            if cache is None:
                _sleep(stopped, period)
                continue
            # Another holder runs a cycle now (the beat's, a second supervisor's): try again soon, since
            # what this process saw change is still due here.
            deadline = time.monotonic() + (period if ran else min(period, 1.0))
            while not stopped() and time.monotonic() < deadline:
                if cache.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
                    time.sleep(DEBOUNCE_SECONDS)
                    break
                try:
                    if cache.due_from_database():  # a job just started: follow it now
                        break
                except DatabaseError:
                    logger.warning("supervision: could not ask the database for new executions")
    finally:
        if cache is not None and source is None:
            cache.close()


def _sleep(stopped: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not stopped() and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
