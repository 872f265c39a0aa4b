"""Send work to Celery by task name, so that a service never imports a tasks module (the tasks import the
services). The names are the tasks' registered names (`@shared_task(name=...)`), defined here once.

A task that is registered in this process (a worker, or the test suite's in-process mode) is sent through its
own `apply_async`; otherwise the message goes to the broker by name (`send_task`), which is what the web
process does. Celery's Signature picks between the two."""

from __future__ import annotations

from typing import Any, Final

from celery import current_app

EXECUTION_SUBMIT: Final = "jobs.submission.tasks.execution_submit"
EXECUTION_DELETE: Final = "jobs.submission.tasks.execution_delete"
EXECUTIONS_RESUBMIT_STALE: Final = "jobs.submission.tasks.executions_resubmit_stale"
WORKER_LEFTOVERS_SWEEP: Final = "jobs.submission.tasks.worker_leftovers_sweep"
SUPERVISE: Final = "jobs.supervision.tasks.supervise"
SESSION_WATCH: Final = "jobs.sessions.tasks.session_watch"
SESSION_CLOSE_WATCH: Final = "jobs.sessions.tasks.session_close_watch"
SESSIONS_SWEEP: Final = "jobs.sessions.tasks.sessions_sweep"
SESSION_LEFTOVERS_SWEEP: Final = "jobs.sessions.tasks.session_leftovers_sweep"
WEBHOOKS_FANOUT: Final = "jobs.observability.tasks.webhooks_fanout"
WEBHOOK_DELIVER: Final = "jobs.observability.tasks.webhook_deliver"
WEBHOOKS_SWEEP: Final = "jobs.observability.tasks.webhooks_sweep"
JOB_COUNTS_COMPACT: Final = "jobs.observability.tasks.job_counts_compact"
USAGE_ROLLUP: Final = "jobs.usage.tasks.usage_rollup"
HISTORY_PRUNE: Final = "jobs.usage.tasks.history_prune"


def send(name: str, *args: Any, countdown: float | None = None) -> None:
    """Enqueue task `name` with positional `args` (primary keys: the task reloads the row).

    Sent without declaring its queue: Celery declares it before every message unless told not to (a tenth of
    a submission's enqueue), and a message for the default queue goes to it by name through the default
    exchange, declared or not (the worker declares its queues when it starts). A routed task (a webhook
    delivery: CELERY_TASK_ROUTES) goes the same way to its own queue by name."""
    signature = current_app.signature(name, args=args)
    if countdown is None:
        signature.apply_async(declare=[])
    else:
        signature.apply_async(countdown=countdown, declare=[])


def on_commit_send(name: str, *args: Any) -> Any:
    """A callback for `transaction.on_commit(..., robust=True)`: a named function (Django logs a failing
    robust callback by its __qualname__, which a functools.partial lacks)."""

    def send_after_commit() -> None:
        send(name, *args)

    return send_after_commit
