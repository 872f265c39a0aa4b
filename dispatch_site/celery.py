"""The Celery app: Redis broker, beat schedule in settings. Tasks live in a `tasks` module of each concern
(the installed apps, and the jobs app's subpackages); services send work by name (jobs.enqueue)."""

from __future__ import annotations

import os

from celery import Celery, Task
from celery.signals import worker_process_shutdown, worker_ready
from django.db.utils import InterfaceError, OperationalError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")

# How often, and how soon, a task whose database call failed is tried again (with jitter: 0 to 2**n seconds,
# at most DATABASE_RETRY_MAX_SECONDS apart).
DATABASE_RETRIES = 10
DATABASE_RETRY_MAX_SECONDS = 30


class DispatchTask(Task):
    """Every task of dispatch: a database error (SQLite busy past its timeout, a PostgreSQL restart or
    failover, a dropped connection) is transient. The task is retried within seconds, with backoff, and never
    left to the stale sweep. Each task reloads its rows and acts by compare-and-set, so a retry after a
    partial run is harmless; a start's claim holder (the task id) is kept across its retries."""

    autoretry_for = (OperationalError, InterfaceError)
    retry_backoff = 1
    retry_backoff_max = DATABASE_RETRY_MAX_SECONDS
    retry_jitter = True
    max_retries = DATABASE_RETRIES


app = Celery("dispatch", task_cls=DispatchTask)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["jobs.submission", "jobs.supervision", "jobs.sessions"])


@worker_process_shutdown.connect
def _metrics_process_exited(pid: int | None = None, **kwargs: object) -> None:
    """Multiprocess metrics (dispatch_site.metrics): this worker process's live gauges stop counting."""
    from dispatch_site.metrics import process_exited

    process_exited(pid or os.getpid())


@worker_ready.connect
def _serve_metrics(**kwargs: object) -> None:
    """The worker's main process serves its pod's metrics when METRICS_PORT is set (dispatch_site.metrics)."""
    from dispatch_site.metrics import serve_process_metrics

    serve_process_metrics()
