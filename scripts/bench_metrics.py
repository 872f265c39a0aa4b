"""make bench, metrics part (issue 23): the time of one scrape of GET /metrics with 100 jobs and with
100,000 jobs in PostgreSQL (target: under 50 ms at 100,000), and of its database query alone.

The jobs are bulk-inserted rows standing in for volume, spread over 20 namespaces and the states and causes
of a busy site, under their own owner, deleted afterwards. Each figure is the median of several scrapes
through Django's test client (the whole view: this process's metrics plus the database collector).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.bench_common import Target, migrated_django  # noqa: E402 - needs the repository on sys.path first

SMALL, LARGE = 100, 100_000
NAMESPACES = 20
REPEAT = int(os.environ.get("BENCH_METRICS_REPEAT", "21"))
OWNER = "bench-metrics"
TARGET_MS = 50.0
STATES = [
    ("succeeded", ""),
    ("failed", "app-error"),
    ("succeeded", ""),
    ("failed", "oom"),
    ("running", ""),
    ("succeeded", ""),
    ("cancelled", "cancelled"),
    ("refused", ""),
    ("failed", "preempted"),
    ("queued", ""),
    ("succeeded", ""),
    ("failed", "node-lost"),
    ("pending", ""),
    ("unknown", ""),
]


def log(message: str) -> None:
    print(f"[bench metrics] {message}", file=sys.stderr, flush=True)


def _insert(owner: Any, count: int, start: int) -> None:
    from jobs.models import Job
    from jobs.naming import new_job_id

    batch = []
    for i in range(start, start + count):
        state, cause = STATES[i % len(STATES)]
        batch.append(
            Job(
                id=new_job_id(),
                owner=owner,
                namespace=f"bench-{i % NAMESPACES}",
                display_name=f"bench {i}",
                runtime_kind="ClusterTrainingRuntime",
                runtime_name="dispatch-kind",
                spec={"image": "localhost/trainer:v1", "num_nodes": 2},
                plan={"refused": state == "refused", "reasons": [], "capabilities": []},
                state=state,
                cause=cause,
                message=f"rank 1 exited with code 3 in attempt 1 ({i})" if cause else "",
                current_attempt=0 if state == "refused" else 1,
            )
        )
        if len(batch) == 5000:
            Job.objects.bulk_create(batch)
            batch = []
    if batch:
        Job.objects.bulk_create(batch)


def _median_ms(action: Any) -> float:
    action()  # warm-up
    samples = []
    for _ in range(REPEAT):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def run() -> dict[str, Any]:
    migrated_django()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    from jobs.models import Job
    from jobs.observability.collector import compact_job_counts, job_counts

    User.objects.filter(username=OWNER).delete()
    owner = User.objects.create(username=OWNER)
    client = Client(REMOTE_ADDR="127.0.0.1")

    def scrape() -> None:
        response = client.get("/metrics")
        assert response.status_code == 200, response.status_code

    results: dict[str, Any] = {}
    try:
        _insert(owner, SMALL, 0)
        compact_job_counts()
        results["small_ms"] = _median_ms(scrape)
        results["small_query_ms"] = _median_ms(job_counts)
        log(f"{LARGE} jobs (bulk insert) ...")
        _insert(owner, LARGE - SMALL, SMALL)
        # Right after the bulk insert the triggers' 100,000 deltas are not folded yet: the worst case.
        results["uncompacted_ms"] = _median_ms(scrape)
        started = time.perf_counter()
        results["folded"] = compact_job_counts()  # as beat does every 30 s
        results["compaction_ms"] = (time.perf_counter() - started) * 1000
        results["large_ms"] = _median_ms(scrape)
        results["large_query_ms"] = _median_ms(job_counts)
        results["series"] = len(job_counts())
        results["jobs"] = Job.objects.count()

        def group_by_jobs() -> None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT state, cause, namespace, count(*) FROM jobs_job GROUP BY 1, 2, 3")
                cursor.fetchall()

        results["group_by_ms"] = _median_ms(group_by_jobs)
    finally:
        deleted, _ = Job.objects.filter(owner=owner).delete()
        owner.delete()
        log(f"removed {deleted} rows")
    return results


def targets(results: dict[str, Any]) -> list[Target]:
    return [
        Target(
            f"one scrape of GET /metrics at {results['jobs']:,} jobs",
            f"{results['large_ms']:.1f} ms",
            f"< {TARGET_MS:.0f} ms",
            results["large_ms"] < TARGET_MS,
            "median of several scrapes",
        )
    ]


def report_lines(results: dict[str, Any]) -> list[str]:
    met = "yes" if results["large_ms"] < TARGET_MS else "NO"
    return [
        "",
        "## Metrics: one scrape of GET /metrics (PostgreSQL, Django test client, median)",
        "",
        f"{results['jobs']} jobs in the database at the large measure, "
        f"{results['series']} dispatch_jobs series.",
        "",
        "| measure | 100 jobs ms | 100,000 jobs ms | target | met |",
        "|---|---|---|---|---|",
        f"| scrape (whole view) | {results['small_ms']:.1f} | {results['large_ms']:.1f} "
        f"| < {TARGET_MS:.0f} | {met} |",
        f"| its database query (count rows + deltas) | {results['small_query_ms']:.1f} | "
        f"{results['large_query_ms']:.1f} | | |",
        f"| scrape before the compaction folded the {results['folded']} deltas of the bulk insert | | "
        f"{results['uncompacted_ms']:.1f} | | |",
        f"| for comparison: a grouped count over the jobs table | | {results['group_by_ms']:.1f} | | |",
        "",
        f"The compaction (beat, every 30 s) folded {results['folded']} deltas "
        f"in {results['compaction_ms']:.0f} ms.",
    ]


def bench_lines() -> list[str]:
    log("metrics: one scrape with 100 / 100,000 jobs ...")
    return report_lines(run())


if __name__ == "__main__":
    print("\n".join(bench_lines()))
