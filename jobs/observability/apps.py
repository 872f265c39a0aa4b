from __future__ import annotations

from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Metrics read from the database, the change feed (an outbox of job changes), and status webhooks."""

    name = "jobs.observability"
    label = "observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from dispatch_site import metrics
        from jobs.observability import collector, outbox, zeros

        outbox.connect()
        zeros.zero_known_series()
        metrics.register_scrape_collector(collector.DatabaseCollector())
