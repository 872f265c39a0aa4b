"""The Celery app: Redis broker, beat schedule in settings. Tasks live in a `tasks` module of each concern
(the installed apps, and the jobs app's subpackages); services send work by name (jobs.enqueue)."""

from __future__ import annotations

import os

from celery import Celery, Task
from celery.signals import task_postrun, task_prerun, worker_init, worker_process_shutdown, worker_ready
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


# Database connections: kept across tasks (CONN_MAX_AGE), checked as Django checks them across requests.
# Celery's Django fixup closed every connection before and after every task unless CELERY_DB_REUSE_MAX is set
# (dispatch_site.settings sets it): each task then opened a new PostgreSQL session (its authentication, a new
# backend process), 232 sessions for 232 starts, a sixth of a start's worker CPU (py-spy, --gil). Now, around
# each task, close_old_connections drops a connection that is past its age or broke (an error and then a
# failed check), and, in a worker, the first query of each task is preceded by Django's health check, so a
# connection that died while idle (a PostgreSQL restart) is replaced before the task uses it.


@worker_init.connect
def _check_connections_per_task(**kwargs: object) -> None:
    from django.conf import settings

    for database in settings.DATABASES.values():
        if database.get("CONN_MAX_AGE"):
            database["CONN_HEALTH_CHECKS"] = True


@task_prerun.connect
@task_postrun.connect
def _close_old_connections(task: Task | None = None, **kwargs: object) -> None:
    if task is not None and getattr(task.request, "is_eager", False):
        return  # run in the caller's thread (a test's transaction, a request's): the caller's connection
    from django.db import close_old_connections

    close_old_connections()
