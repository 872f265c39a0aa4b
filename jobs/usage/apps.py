from __future__ import annotations

from django.apps import AppConfig


class UsageConfig(AppConfig):
    """What ran, for how long, on what and for whom: per-attempt figures and their daily rollup."""

    name = "jobs.usage"
    label = "usage"
    default_auto_field = "django.db.models.BigAutoField"
