"""The Celery app: Redis broker, tasks autodiscovered from the installed apps, beat schedule in settings."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")

app = Celery("dispatch")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
