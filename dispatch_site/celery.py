"""The Celery app: Redis broker, beat schedule in settings. Tasks live in a `tasks` module of each concern
(the installed apps, and the jobs app's subpackages); services send work by name (jobs.enqueue)."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_shutdown, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")

app = Celery("dispatch")
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
