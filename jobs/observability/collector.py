"""Figures the database holds, read at scrape time (dispatch_site.metrics.register_scrape_collector):

- dispatch_jobs{state,cause,namespace}: jobs by state, cause and namespace. On PostgreSQL from the count table
  that triggers keep (jobs.observability.models.JobCount): a few hundred rows plus the deltas since the last
  compaction, however many jobs there are; elsewhere (SQLite under `make up`) one grouped query on the jobs;
- dispatch_supervisor_lag_seconds: since the supervisor's last cycle finished (its row), so a supervisor that
  stopped shows a growing lag, which a figure kept in its own process could not;
- dispatch_worker_read_ok, dispatch_worker_last_read_age_seconds, dispatch_worker_jobs_running{cluster}:
  each MultiKueue worker as supervision last read it (jobs.models.WorkerRead): whether that read answered,
  since when it last did, and how many jobs run there;
- dispatch_webhook_endpoints_disabled: endpoints disabled after repeated failures;
- dispatch_deletes_pending, dispatch_delete_oldest_pending_seconds: attempts whose objects dispatch decided
  to remove and has not yet, and how long ago the oldest was asked for. A delete waits for the Trainer to stop
  a TrainJob before it goes (jobs.stopping); a Trainer that renews its Lease but never acts keeps it waiting,
  and this is the figure to alert on (the job's timeline also says `stop-stuck` after STOP_STUCK_SECONDS).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from jobs.models import Job, SupervisorCycle, WorkerRead
from jobs.observability.models import JobCount, JobCountDelta, WebhookEndpoint
from jobs.selectors import deletes_pending, running_per_worker

COMPACT_LOCK = 0x64_69_73_70_63_6E_74  # pg_advisory_xact_lock key of the compaction ("dispcnt")


def job_counts() -> list[tuple[str, str, str, int]]:
    """(state, cause, namespace, count) for every combination that has jobs: one query."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"""
                SELECT state, cause, namespace, sum(n) FROM (
                    SELECT state, cause, namespace, n FROM {JobCount._meta.db_table}
                    UNION ALL
                    SELECT state, cause, namespace, n FROM {JobCountDelta._meta.db_table}
                ) AS counted
                GROUP BY state, cause, namespace HAVING sum(n) <> 0
                """
            )
        else:
            cursor.execute(
                f"SELECT state, cause, namespace, count(*) FROM {Job._meta.db_table} "
                "GROUP BY state, cause, namespace"
            )
        return [(str(s), str(c), str(n), int(k)) for s, c, n, k in cursor.fetchall()]


def compact_job_counts() -> int:
    """Fold the deltas the triggers appended into the count rows (one compaction at a time); returns how many
    deltas it folded. A delta of a transaction not yet committed is not seen, and folded next time."""
    if connection.vendor != "postgresql":
        return 0
    counts, deltas = JobCount._meta.db_table, JobCountDelta._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [COMPACT_LOCK])
        cursor.execute(
            f"""
            WITH moved AS (DELETE FROM {deltas} RETURNING state, cause, namespace, n),
                 summed AS (SELECT state, cause, namespace, sum(n) AS n, count(*) AS rows
                            FROM moved GROUP BY state, cause, namespace),
                 folded AS (
                    INSERT INTO {counts} (state, cause, namespace, n)
                    SELECT state, cause, namespace, n FROM summed
                    ON CONFLICT (state, cause, namespace) DO UPDATE SET n = {counts}.n + EXCLUDED.n
                 )
            SELECT coalesce(sum(rows), 0) FROM summed
            """
        )
        row = cursor.fetchone()
        cursor.execute(f"DELETE FROM {counts} WHERE n = 0")
    return int(row[0]) if row else 0


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
        yield from worker_families(now)
        disabled = GaugeMetricFamily(
            "dispatch_webhook_endpoints_disabled",
            "Webhook endpoints disabled after repeated failed deliveries.",
        )
        disabled.add_metric(
            [], WebhookEndpoint.objects.filter(active=False).exclude(disabled_reason="").count()
        )
        yield disabled
        yield from delete_families(now)


def delete_families(now: datetime) -> Iterable[GaugeMetricFamily]:
    pending, oldest = deletes_pending()
    count = GaugeMetricFamily(
        "dispatch_deletes_pending",
        "Attempts whose objects dispatch decided to remove and has not removed yet.",
    )
    count.add_metric([], float(pending))
    age = GaugeMetricFamily(
        "dispatch_delete_oldest_pending_seconds",
        "Seconds since the oldest pending delete was asked for (0 when none is pending).",
    )
    age.add_metric([], max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0)
    return [count, age]


def worker_families(now: datetime) -> Iterable[GaugeMetricFamily]:
    """The MultiKueue workers' health: three families, one series per worker supervision has read."""
    ok = GaugeMetricFamily(
        "dispatch_worker_read_ok",
        "1 when supervision's last read of the MultiKueue worker answered, 0 when it failed.",
        labels=["cluster"],
    )
    age = GaugeMetricFamily(
        "dispatch_worker_last_read_age_seconds",
        "Seconds since supervision last read the MultiKueue worker successfully (absent if it never did).",
        labels=["cluster"],
    )
    running = GaugeMetricFamily(
        "dispatch_worker_jobs_running",
        "Jobs whose current attempt runs on the MultiKueue worker.",
        labels=["cluster"],
    )
    counted = running_per_worker()
    for read in WorkerRead.objects.order_by("name"):
        ok.add_metric([read.name], 1.0 if read.reading else 0.0)
        if read.ok_at is not None:
            age.add_metric([read.name], max(0.0, (now - read.ok_at).total_seconds()))
        running.add_metric([read.name], float(counted.pop(read.name, 0)))
    for name, n in sorted(counted.items()):  # running there, not read yet by this database's supervisor
        running.add_metric([name], float(n))
    return [ok, age, running]
