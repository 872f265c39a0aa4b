"""make bench, usage part (issue 36), in PostgreSQL and one run:

- GET /api/v1/usage for 30 days (group_by=namespace, and group_by=cause by day) as on-call, over the daily
  rollup of 1,000,000 ended attempts spread over 90 days, beside the same over 1,000 attempts: the p95 of each
  side's requests, target < 300 ms at 1,000,000 (the issue's figure), and the ratio.

The rollup's rows stand in for the attempts: each simulated attempt (seeded: 40 namespaces of 5 owners, 3
queues, 4 runtimes, 6 outcomes, a queue wait) is added to its (day, namespace, owner, queue, runtime,
outcome) row and wait bucket exactly as jobs.usage.services adds a real one (with jobs.usage.measure's
outcome and wait_bucket), then the rows are bulk-inserted. Requests go through Django's test client (the
whole view: authentication, the scope, the query, rendering), after a warm-up; the rows are deleted after.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.bench_common import Target, migrated_django  # noqa: E402 - needs the repository on sys.path first

SMALL, LARGE = 1_000, 1_000_000
HISTORY_DAYS, QUERY_DAYS = 90, 30
REPEAT = int(os.environ.get("BENCH_USAGE_REPEAT", "20"))
PREFIX = "bench-usage-"
ONCALL = "bench-usage-oncall"
P95_TARGET_MS = 300.0
OUTCOMES = [("succeeded", ""), ("failed", "app-error"), ("failed", "preempted"), ("failed", "oom"),
            ("failed", "node-lost"), ("cancelled", "")]  # fmt: skip
WEIGHTS = [70, 12, 8, 4, 2, 4]


def log(message: str) -> None:
    print(f"[bench usage] {message}", file=sys.stderr, flush=True)


def _rows(attempts: int, today: date, seed: int) -> list[Any]:
    """The rollup's rows for `attempts` simulated ended attempts (see the module docstring)."""
    from jobs.usage import measure
    from jobs.usage.models import UsageDay, wait_column

    rng = random.Random(seed)
    days: dict[tuple[Any, ...], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for _ in range(attempts):
        team = rng.randrange(40)
        state, cause = rng.choices(OUTCOMES, WEIGHTS)[0]
        key = (
            today - timedelta(days=rng.randrange(HISTORY_DAYS)),
            f"{PREFIX}team-{team}",
            f"{PREFIX}user-{team}-{rng.randrange(5)}",
            ("gpu-large", "gpu-small", "cpu")[rng.randrange(3)],
            f"ClusterTrainingRuntime/torch-{rng.randrange(4)}",
            measure.outcome(state, cause),
        )
        gpu = rng.choice((1, 2, 4, 8)) * rng.uniform(60, 36_000)
        row = days[key]
        row["gpu_seconds"] += gpu
        row["gpu_seconds_lost"] += gpu if state in ("failed", "cancelled") else 0.0
        row["cpu_seconds"] += gpu * 4
        row["attempts"] += 1
        row["jobs"] += rng.random() < 0.8  # a job's first attempt
        row[wait_column(measure.wait_bucket(rng.expovariate(1 / 120)))] += 1
    names = ("day", "namespace", "owner", "queue", "runtime", "outcome")
    return [UsageDay(**dict(zip(names, k, strict=True)), **v) for k, v in days.items()]


def _clear() -> None:
    from jobs.usage.models import UsageDay

    UsageDay.objects.filter(namespace__startswith=PREFIX).delete()


def _load(attempts: int, today: date) -> int:
    from django.db import connection

    from jobs.usage.models import UsageDay

    _clear()
    rows = _rows(attempts, today, seed=attempts)
    UsageDay.objects.bulk_create(rows, batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {UsageDay._meta.db_table}")  # as autovacuum keeps a live table
    return len(rows)


def _p95(client: Any, url: str) -> float:
    client.get(url)  # warm-up
    samples = []
    for _ in range(REPEAT):
        started = time.perf_counter()
        response = client.get(url)
        samples.append(time.perf_counter() - started)
        assert response.status_code == 200, (url, response.status_code, response.content[:300])
    return statistics.quantiles(samples, n=20)[-1]  # the 95th percentile


def run() -> dict[str, Any]:
    migrated_django()
    from django.contrib.auth.models import User
    from django.test import Client

    from dispatch_site import roles
    from dispatch_site.services import user_create

    today = datetime.now(UTC).date()
    since = today - timedelta(days=QUERY_DAYS - 1)
    queries = {
        "30 days by namespace": f"/api/v1/usage?group_by=namespace&since={since}&until={today}",
        "30 days by cause, per day": f"/api/v1/usage?group_by=cause&step=day&since={since}&until={today}",
    }
    User.objects.filter(username=ONCALL).delete()
    oncall, token = user_create(username=ONCALL, role=roles.ONCALL)
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    results: dict[str, Any] = {"queries": []}
    try:
        sides: dict[int, dict[str, float]] = {}
        for attempts in (SMALL, LARGE):
            log(f"the rollup of {attempts:,} attempts over {HISTORY_DAYS} days ...")
            started = time.perf_counter()
            rows = _load(attempts, today)
            log(f"{rows:,} rows in {time.perf_counter() - started:.1f} s; {REPEAT} requests per query ...")
            results[f"rows_{attempts}"] = rows
            sides[attempts] = {name: _p95(client, url) for name, url in queries.items()}
        results["queries"] = [
            {"name": name, "small_s": sides[SMALL][name], "large_s": sides[LARGE][name]} for name in queries
        ]
    finally:
        _clear()
        oncall.delete()
    return results


def targets(results: dict[str, Any]) -> list[Target]:
    return [
        Target(
            f"usage API, {q['name']}, 1,000,000 attempts (p95 {q['large_s'] * 1000:.1f} ms; 1,000: "
            f"{q['small_s'] * 1000:.1f} ms)",
            f"{q['large_s'] * 1000:.1f} ms",
            f"< {P95_TARGET_MS:.0f} ms",
            q["large_s"] * 1000 < P95_TARGET_MS,
            f"p95 of {REPEAT} requests",
        )
        for q in results["queries"]
    ]


def report_lines(results: dict[str, Any]) -> list[str]:
    lines = ["", "## Usage (PostgreSQL, Django test client, p95 of each side's requests)", ""]
    lines += [
        f"The daily rollup holds {results.get(f'rows_{SMALL}', 0):,} rows for 1,000 attempts and "
        f"{results.get(f'rows_{LARGE}', 0):,} for 1,000,000 (over {HISTORY_DAYS} days).",
        "",
        "| query | 1,000 attempts ms | 1,000,000 attempts ms | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for q in results["queries"]:
        met = "yes" if q["large_s"] * 1000 < P95_TARGET_MS else "NO"
        lines.append(
            f"| {q['name']} | {q['small_s'] * 1000:.1f} | {q['large_s'] * 1000:.1f} | "
            f"{q['large_s'] / q['small_s']:.2f} | p95 < {P95_TARGET_MS:.0f} ms | {met} |"
        )
    return lines


if __name__ == "__main__":
    found = run()
    print("\n".join(report_lines(found)))
    for t in targets(found):
        print(t)
