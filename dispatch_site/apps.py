from __future__ import annotations

from django.apps import AppConfig


class DispatchSiteConfig(AppConfig):
    name = "dispatch_site"
    verbose_name = "dispatch"
