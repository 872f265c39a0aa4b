from __future__ import annotations

from django.apps import AppConfig


class DispatchSiteConfig(AppConfig):
    name = "dispatch_site"
    verbose_name = "dispatch"

    def ready(self) -> None:
        from dispatch_site import signals  # noqa: F401 - connects the access audit's receivers
