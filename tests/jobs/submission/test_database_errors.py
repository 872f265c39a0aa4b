"""A database error is transient in every task (issue 21): retried within seconds with backoff, never left to
the stale sweep.

The error is injected (SQLite's "database is locked" or a dropped PostgreSQL connection cannot be produced on
demand at a chosen call): the service a task calls raises django.db's OperationalError, as Django raises it
for both; the task must ask Celery for a retry a few seconds later instead of failing.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import Retry
from django.db.utils import InterfaceError, OperationalError

from dispatch_site.celery import DATABASE_RETRY_MAX_SECONDS, DispatchTask, app
from jobs import enqueue

# Every task dispatch registers, and the service function it calls (module, attribute), with its arguments.
TASKS: dict[str, tuple[str, str, tuple[Any, ...]]] = {
    enqueue.EXECUTION_SUBMIT: ("jobs.submission.start", "execution_submit", (1,)),
    enqueue.EXECUTION_DELETE: ("jobs.submission.cancel", "execution_delete", (1,)),
    enqueue.EXECUTIONS_RESUBMIT_STALE: ("jobs.submission.sweeps", "executions_resubmit_stale", ()),
    enqueue.WORKER_LEFTOVERS_SWEEP: ("jobs.submission.leftovers", "worker_leftovers_sweep", ()),
    # The beat's cycle first asks the database whether a `manage.py supervise` is alive.
    enqueue.SUPERVISE: ("jobs.supervision.tasks", "watcher_alive", ()),
    enqueue.SESSION_WATCH: ("jobs.sessions.services", "session_watch", ("s1",)),
    enqueue.SESSION_CLOSE_WATCH: ("jobs.sessions.services", "session_watch", ("s1",)),
    # The sessions sweep first looks for sessions whose MultiKueue worker is lost (jobs.sessions.lost).
    enqueue.SESSIONS_SWEEP: ("jobs.sessions.lost", "sessions_worker_lost_sweep", ()),
    enqueue.SESSION_LEFTOVERS_SWEEP: ("jobs.sessions.lost", "session_leftovers_sweep", ()),
    enqueue.WEBHOOKS_FANOUT: ("jobs.observability.webhooks", "fanout", ()),
    enqueue.WEBHOOK_DELIVER: ("jobs.observability.webhooks", "delivery_send", (1,)),
    enqueue.WEBHOOKS_SWEEP: ("jobs.observability.webhooks", "sweep", ()),
    enqueue.JOB_COUNTS_COMPACT: ("jobs.observability.collector", "compact_job_counts", ()),
    enqueue.USAGE_ROLLUP: ("jobs.usage.services", "usage_rollup", ()),
    enqueue.HISTORY_PRUNE: ("jobs.usage.services", "history_prune", ()),
    "runtimes.tasks.runtimes_recheck": ("runtimes.services", "runtimes_recheck", ()),
}


def test_every_task_of_dispatch_is_listed_here() -> None:
    ours = sorted(name for name in app.tasks if name.startswith(("jobs.", "runtimes.")))
    assert ours == sorted(TASKS)


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize(
    "error",
    [OperationalError("database is locked"), InterfaceError("connection already closed")],
    ids=["locked", "closed"],
)
def test_a_database_error_is_retried_within_seconds(
    name: str, error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    module_name, attribute, args = TASKS[name]
    module = __import__(module_name, fromlist=[attribute])

    def failing(*_args: Any, **_kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(module, attribute, failing)
    task = app.tasks[name]
    assert isinstance(task, DispatchTask)
    with pytest.raises(Retry) as retry:
        task.apply(args=args, task_id=f"test-{name}")
    assert retry.value.exc is error
    assert isinstance(retry.value.when, int | float) and retry.value.when <= 1  # first retry: 0 to 1 s
    # Later retries back off, never beyond the cap.
    with pytest.raises(Retry) as later:
        task.apply(args=args, task_id=f"test-{name}", retries=6)
    assert isinstance(later.value.when, int | float) and later.value.when <= DATABASE_RETRY_MAX_SECONDS
