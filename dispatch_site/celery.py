"""The Celery app: Redis broker, beat schedule in settings. Tasks live in a `tasks` module of each concern
(the installed apps, and the jobs app's subpackages); services send work by name (jobs.enqueue)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")

app = Celery("dispatch")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["jobs.submission", "jobs.supervision", "jobs.sessions"])
