"""Figures the database holds, read at scrape time (dispatch_site.metrics.register_scrape_collector):

- dispatch_jobs{state,cause,namespace}: jobs by state, cause and namespace, one grouped query on the index
  (state, cause, namespace) of jobs/observability/migrations (an index-only scan; nothing is read row by row
  in Python);
- dispatch_supervisor_lag_seconds: since the supervisor's last cycle finished (its row), so a supervisor that
  stopped shows a growing lag, which a figure kept in its own process could not;
- dispatch_webhook_endpoints_disabled: endpoints disabled after repeated failures.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from jobs.models import Job, SupervisorCycle
from jobs.observability.models import WebhookEndpoint


def job_counts() -> list[tuple[str, str, str, int]]:
    """(state, cause, namespace, count) for every combination that has jobs: one query."""
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT state, cause, namespace, count(*) FROM {table} GROUP BY state, cause, namespace"
        )
        return [(str(s), str(c), str(n), int(k)) for s, c, n, k in cursor.fetchall()]


class DatabaseCollector(Collector):
    source = "database"

    def collect(self) -> Iterable[Any]:
        jobs = GaugeMetricFamily(
            "dispatch_jobs",
            "Jobs by state, typed cause and namespace.",
            labels=["state", "cause", "namespace"],
        )
        for state, cause, namespace, count in job_counts():
            jobs.add_metric([state, cause or "none", namespace], count)
        yield jobs
        lag = GaugeMetricFamily(
            "dispatch_supervisor_lag_seconds",
            "Seconds since the supervisor's last cycle finished (absent before its first cycle).",
            labels=["supervisor"],
        )
        now = timezone.now()
        for name, finished in SupervisorCycle.objects.values_list("name", "finished_at"):
            if finished is not None:
                lag.add_metric([name], max(0.0, (now - finished).total_seconds()))
        yield lag
        disabled = GaugeMetricFamily(
            "dispatch_webhook_endpoints_disabled",
            "Webhook endpoints disabled after repeated failed deliveries.",
        )
        disabled.add_metric(
            [], WebhookEndpoint.objects.filter(active=False).exclude(disabled_reason="").count()
        )
        yield disabled
