"""make bench, dashboard part (issue 13), in PostgreSQL and one run:

- the job list's first page (GET /jobs/ as on-call, the whole page) with 100,000 jobs / with 100 jobs,
  target <= 1.5;
- the same for a filtered page (state=failed&cause=app-error);
- the job page's render time with 20 attempts of 64 ranks / 1 attempt of 2 ranks, target <= 5.

The jobs are bulk-inserted rows standing in for volume (their plans, reasons and ranks shaped as supervision
stores them) under their own owner, deleted afterwards. Each figure is the median of several requests
through Django's test client (the whole view: middleware, queries, templates), after a warm-up.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.bench_common import Target, migrated_django  # noqa: E402 - needs the repository on sys.path first

SMALL, LARGE = 100, 100_000
REPEAT = int(os.environ.get("BENCH_DASHBOARD_REPEAT", "15"))
OWNER = "bench-dashboard"
ONCALL = "bench-dashboard-oncall"
# Every other job failed with app-error: the filtered first page is then full (50 rows) with 100 jobs as with
# 100,000, so the ratio compares the same page and not a 12-row page with a 50-row one.
STATES = [
    ("failed", "app-error"),
    ("running", ""),
    ("failed", "app-error"),
    ("succeeded", ""),
    ("failed", "app-error"),
    ("failed", "oom"),
    ("failed", "app-error"),
    ("queued", ""),
    ("failed", "app-error"),
    ("cancelled", "cancelled"),
    ("failed", "app-error"),
    ("refused", ""),
    ("failed", "app-error"),
    ("failed", "preempted"),
]


def log(message: str) -> None:
    print(f"[bench dashboard] {message}", file=sys.stderr, flush=True)


def _users() -> tuple[Any, Any]:
    from django.contrib.auth.models import User

    from dispatch_site import roles
    from dispatch_site.services import user_create

    User.objects.filter(username__in=[OWNER, ONCALL]).delete()
    owner, _ = user_create(username=OWNER, role=roles.USER, namespaces=["bench"])
    oncall, _ = user_create(username=ONCALL, role=roles.ONCALL)
    return owner, oncall


def _plan() -> dict[str, Any]:
    return {"refused": False, "reasons": [], "capabilities": [], "identity_warnings": [], "warnings": []}


def _insert_jobs(owner: Any, count: int, start: int) -> None:
    from django.db import connection
    from django.utils import timezone

    from jobs.models import Job
    from jobs.naming import new_job_id

    batch = []
    for i in range(start, start + count):
        state, cause = STATES[i % len(STATES)]
        batch.append(
            Job(
                id=new_job_id(),
                owner=owner,
                namespace="bench",
                display_name=f"bench {i}",
                runtime_kind="ClusterTrainingRuntime",
                runtime_name="dispatch-kind",
                spec={"image": "localhost/trainer:v1", "num_nodes": 2},
                plan=_plan(),
                reasons=[{"code": "restart-policy", "message": "m", "path": "p", "waived": False}]
                if state == "refused"
                else [],
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
    # Spread the submissions over time (auto_now_add gave them all "now"): job i is i seconds old.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs_job SET created_at = %s - split_part(display_name, ' ', 2)::int * interval '1s'"
            " WHERE owner_id = %s AND display_name LIKE 'bench %%'",
            [timezone.now() - timedelta(hours=1), owner.pk],
        )


def _timed_get(client: Any, url: str) -> float:
    samples = []
    client.get(url)  # warm-up
    for _ in range(REPEAT):
        started = time.perf_counter()
        response = client.get(url)
        samples.append(time.perf_counter() - started)
        assert response.status_code == 200, (url, response.status_code)
    return statistics.median(samples)


def _rank_rows(attempt: int, ranks: int) -> list[dict[str, Any]]:
    return [
        {
            "rank": rank,
            "attempt": attempt,
            "restart_attempt": 0,
            "pod": f"jbench-{attempt}-node-0-{rank}-abcde",
            "phase": "Failed" if rank == 1 else "Succeeded",
            "exit_code": 3 if rank == 1 else 0,
            "restarts": 0,
            "node": f"kwok-node-{rank % 8}",
            "reason": "Error" if rank == 1 else "",
            "first_failure": rank == 1,
        }
        for rank in range(ranks)
    ]


def _job_with(owner: Any, attempts: int, ranks: int) -> str:
    from jobs.models import Execution, Job, JobEvent

    job = Job.objects.create(
        owner=owner,
        namespace="bench",
        runtime_kind="ClusterTrainingRuntime",
        runtime_name="dispatch-kind",
        spec={"image": "localhost/trainer:v1", "num_nodes": ranks},
        plan=_plan(),
        state="failed",
        cause="app-error",
        message="rank 1 exited with code 3 at 12:04:31 in attempt 1",
        evidence=[{"object": "Pod bench/p", "field": "exitCode", "value": 3, "at": "2026-01-01T00:00:00Z"}],
        current_attempt=attempts,
        failing_rank=1,
        exit_code=3,
    )
    for attempt in range(1, attempts + 1):
        Execution.objects.create(
            job=job,
            attempt=attempt,
            trainjob_name=f"{job.id}-{attempt}",
            state="failed",
            cause="app-error",
            ranks=_rank_rows(attempt, ranks),
        )
        JobEvent.objects.create(
            job=job, attempt=attempt, kind="transition", from_state="running", to_state="failed", message="m"
        )
    return job.id


def run() -> dict[str, Any]:
    """The figures; the caller (scripts/bench.py) has set DATABASE_URL and friends, or we read them here."""
    migrated_django()
    from django.test import Client

    from jobs.models import Job

    owner, oncall = _users()
    client = Client()
    client.force_login(oncall)
    results: dict[str, Any] = {}
    try:
        lists = {
            "first page": "/jobs/",
            "filtered page (state + cause)": "/jobs/?state=failed&cause=app-error",
        }
        log(f"{SMALL} jobs ...")
        _insert_jobs(owner, SMALL, 0)
        small = {name: _timed_get(client, url) for name, url in lists.items()}
        log(f"{LARGE} jobs (bulk insert) ...")
        _insert_jobs(owner, LARGE - SMALL, SMALL)
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("ANALYZE jobs_job")
        large = {name: _timed_get(client, url) for name, url in lists.items()}
        results["list"] = [
            {"name": name, "small_s": small[name], "large_s": large[name], "ratio": large[name] / small[name]}
            for name in lists
        ]
        log("job pages: 1 attempt x 2 ranks, 20 attempts x 64 ranks ...")
        tiny = _job_with(owner, 1, 2)
        big = _job_with(owner, 20, 64)
        tiny_s = _timed_get(client, f"/jobs/{tiny}/")
        big_s = _timed_get(client, f"/jobs/{big}/")
        results["job_page"] = {"small_s": tiny_s, "large_s": big_s, "ratio": big_s / tiny_s}
    finally:
        deleted, _ = Job.objects.filter(owner=owner).delete()
        owner.delete()
        oncall.delete()
        log(f"removed {deleted} rows")
    return results


LIST_TARGET = 1.5
PAGE_TARGET = 5


def targets(results: dict[str, Any]) -> list[Target]:
    found = [
        Target(
            f"dashboard job list, {row['name']}, 100,000 / 100 jobs ({row['large_s'] * 1000:.1f} / "
            f"{row['small_s'] * 1000:.1f} ms)",
            f"{row['ratio']:.2f}",
            f"<= {LIST_TARGET}",
            row["ratio"] <= LIST_TARGET,
            "median of each side's requests",
        )
        for row in results["list"]
    ]
    page = results["job_page"]
    found.append(
        Target(
            f"dashboard job page, 20 attempts x 64 ranks / 1 x 2 ({page['large_s'] * 1000:.1f} / "
            f"{page['small_s'] * 1000:.1f} ms)",
            f"{page['ratio']:.2f}",
            f"<= {PAGE_TARGET}",
            page["ratio"] <= PAGE_TARGET,
            "median of each side's requests",
        )
    )
    return found


def report_lines(results: dict[str, Any]) -> list[str]:
    lines = ["", "## Dashboard (PostgreSQL, Django test client, median of each)", ""]
    lines += [
        "| measure | 100 jobs ms | 100,000 jobs ms | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["list"]:
        met = "yes" if row["ratio"] <= LIST_TARGET else "NO"
        lines.append(
            f"| job list, {row['name']} | {row['small_s'] * 1000:.1f} | {row['large_s'] * 1000:.1f} | "
            f"{row['ratio']:.2f} | <= 1.5 | {met} |"
        )
    page = results["job_page"]
    met = "yes" if page["ratio"] <= PAGE_TARGET else "NO"
    lines += [
        "",
        "| measure | 1 attempt x 2 ranks ms | 20 attempts x 64 ranks ms | ratio | target | met |",
        "|---|---|---|---|---|---|",
        f"| job page render | {page['small_s'] * 1000:.1f} | {page['large_s'] * 1000:.1f} | "
        f"{page['ratio']:.2f} | <= 5 | {met} |",
    ]
    return lines


if __name__ == "__main__":
    print("\n".join(report_lines(run())))
