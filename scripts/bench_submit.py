#!/usr/bin/env python
"""Accepted submissions/s against a trivial authenticated request, on durable PostgreSQL (issue 21: >= 0.6).

Run by scripts/bench.py as a subprocess (its Django is set up on the durable instance, the rest of the bench
on the shared test one); prints one JSON object on stdout.

- PostgreSQL: the bench's own instance with PostgreSQL's durable defaults (scripts/bench_pg.py), so every
  accepted job's commit waits for its WAL flush.
- One gunicorn server as `make up` and the Deployment run it (dispatch_site/gunicorn.conf.py: threaded
  workers, keep-alive), wrk, CONNECTIONS connections;
  ROUNDS short rounds interleaved: GET /api/v1/me, then POST /api/v1/jobs (answered 202), ... Each round's
  pair gives a ratio (submissions/s over the trivial requests/s measured just before); the median over the
  rounds is the figure, so a busy moment of the machine moves one pair, not the result. A round counts only
  when every answer was a 202 and every job recorded was enqueued.
- Every accepted job must be enqueued: after each round of submissions the jobs recorded in PostgreSQL and the
  start messages waiting in Redis (no worker runs) are counted, and must be equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench_common import (
    BENCH_NAMESPACE,
    CONNECTIONS,
    REPO,
    Target,
    cleanup_django,
    cluster_kubeconfig,
    free_port,
    gunicorn_command,
    log,
    redis_url,
    server_env,
    setup_django,
    wait_http,
    web_log,
    web_shape,
    wrk,
)
from scripts.bench_pg import durable_postgres

QUEUE = "celery"  # the Redis list Celery's default queue is
ROUNDS = int(os.environ.get("BENCH_SUBMIT_ROUNDS", "5"))
DURATION = os.environ.get("BENCH_SUBMIT_DURATION", "5s")


def _tree(pid: int) -> list[int]:
    """pid and its descendants (gunicorn's workers, PostgreSQL's backends), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _cpu(pids: list[int]) -> float:
    from scripts.bench_starts import _cpu_seconds

    return _cpu_seconds(pids)


def _measured(url: str, token: str, body: dict[str, Any] | None, web: int, postgres: int) -> dict[str, Any]:
    """One wrk run, with the CPU the web server and PostgreSQL spent per request."""
    web_pids, pg_pids = _tree(web), _tree(postgres)
    before = (_cpu(web_pids), _cpu(pg_pids))
    result = wrk(url, token, body, duration=DURATION)
    web_pids, pg_pids = _tree(web), _tree(postgres)  # backends that came and went are lost: a floor
    spent = (_cpu(web_pids) - before[0], _cpu(pg_pids) - before[1])
    requests = max(1, int(result["requests"]))
    return {**result, "web_cpu_ms": 1000 * spent[0] / requests, "pg_cpu_ms": 1000 * spent[1] / requests}


def _settled(read: Callable[[], tuple[int, int]]) -> tuple[int, int]:
    """The counts once they stop changing (two reads 0.5 s apart agree)."""
    import time

    last = read()
    for _ in range(20):
        time.sleep(0.5)
        now = read()
        if now == last:
            return now
        last = now
    return last


def run() -> dict[str, Any]:
    kubeconfig = cluster_kubeconfig()
    import redis

    broker = redis.Redis.from_url(redis_url())
    with durable_postgres() as (database_url, durability):
        env = server_env(database_url, kubeconfig)
        token = setup_django(env)
        from django.utils import timezone

        from jobs.models import Job

        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            gunicorn_command(port),
            cwd=REPO,
            env=os.environ | env,
            stdout=web_log("submit"),
            stderr=subprocess.STDOUT,
        )
        body = {
            "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
            "namespace": BENCH_NAMESPACE,
            "image": "localhost/trainer:v1",
            "num_nodes": 2,
            "env": {"LEARNING_RATE": "0.1"},
        }
        rows: list[dict[str, Any]] = []
        try:
            wait_http(f"{base}/healthz")
            broker.flushdb()
            log(f"submissions, durable PostgreSQL: gunicorn {web_shape()}, {CONNECTIONS} connections")
            wrk(f"{base}/api/v1/me", token)  # warm-up: imports, connections
            wrk(f"{base}/api/v1/jobs", token, body)  # warm-up: the runtime read, the producer's connection
            postmaster = int((Path(durability["data"]) / "postmaster.pid").read_text().split()[0])
            for round_number in range(1, ROUNDS + 1):
                me = _measured(f"{base}/api/v1/me", token, None, server.pid, postmaster)
                rows.append({"name": "me", "round": round_number, **me})
                # This round's jobs are told by their time, not by emptying the table first: deleting the
                # earlier rounds' left their vacuum to the measured run, whose PostgreSQL CPU it counted.
                broker.delete(QUEUE)
                since = timezone.now()
                result = _measured(f"{base}/api/v1/jobs", token, body, server.pid, postmaster)

                # A request wrk gave up on at its deadline may still commit: wait until both counts settle.
                def counts(since: datetime = since) -> tuple[int, int]:
                    jobs = Job.objects.filter(owner__username="bench", state="pending", created_at__gte=since)
                    return jobs.count(), int(broker.llen(QUEUE))

                recorded, enqueued = _settled(counts)
                rows.append(
                    {
                        "name": "jobs",
                        "round": round_number,
                        **result,
                        "recorded": recorded,
                        "enqueued": enqueued,
                    }
                )
        finally:
            server.terminate()
            server.wait(timeout=30)
            cleanup_django()
            broker.flushdb()
    import statistics

    ratios = []
    for me, jobs in zip(rows[0::2], rows[1::2], strict=True):
        counted = jobs["non_2xx"] == 0 and jobs["recorded"] == jobs["enqueued"]
        jobs["ratio"] = jobs["rps"] / me["rps"] if counted and me["rps"] else 0.0
        ratios.append(jobs["ratio"])
    return {
        "rows": rows,
        "durability": durability,
        "web": web_shape(),
        "me": max(r["rps"] for r in rows if r["name"] == "me"),
        "accepted": max((r["rps"] for r in rows if r["name"] == "jobs" and r["ratio"]), default=0.0),
        "ratio": statistics.median(ratios),
    }


TARGET = 0.6


def targets(result: dict[str, Any]) -> list[Target]:
    ratios = [r["ratio"] for r in result["rows"] if r["name"] == "jobs"]
    return [
        Target(
            "accepted submissions/s / GET /api/v1/me requests/s",
            f"{result['ratio']:.2f}",
            f">= {TARGET}",
            result["ratio"] >= TARGET,
            f"median of {len(ratios)} paired rounds ({', '.join(f'{r:.2f}' for r in ratios)}; a round with a "
            "non-202 answer or a job not enqueued counts 0)",
        )
    ]


def report_lines(result: dict[str, Any]) -> list[str]:
    settings = ", ".join(f"{k}={v}" for k, v in result["durability"].items() if k != "data")
    lines = [
        "",
        "## Submissions / a trivial authenticated request, durable PostgreSQL (target >= 0.6)",
        "",
        f"The bench's own PostgreSQL ({settings}); gunicorn as `make up` runs it ({result['web']}); wrk "
        f"{CONNECTIONS} connections, {DURATION} per measurement; no worker runs: every accepted job's start "
        "message waits in Redis, and those are counted against the jobs recorded.",
        "",
        "CPU ms per request: gunicorn's processes / PostgreSQL's (read from /proc around each run).",
        "",
        "| request | round | requests/s | requests | non-2xx | p99 ms | CPU ms web / PostgreSQL "
        "| jobs recorded | messages in Redis | jobs/s / me/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        name = "GET /api/v1/me" if r["name"] == "me" else "POST /api/v1/jobs (202)"
        lines.append(
            f"| {name} | {r['round']} | {r['rps']:.0f} | {r['requests']} | {r['non_2xx']} "
            f"| {r['p99_ms']:.1f} | {r['web_cpu_ms']:.2f} / {r['pg_cpu_ms']:.2f} "
            f"| {r.get('recorded', '')} | {r.get('enqueued', '')} | "
            f"{format(r['ratio'], '.2f') if 'ratio' in r else ''} |"
        )
    met = targets(result)[0].met
    lines += [
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| accepted submissions/s / GET /api/v1/me requests/s, median of the rounds' pairs (best rounds: "
        f"{result['accepted']:.0f} / {result['me']:.0f}) | {result['ratio']:.2f} | >= 0.6 | "
        f"{'yes' if met else 'NO'} |",
    ]
    return lines


if __name__ == "__main__":
    print(json.dumps(run(), default=str))
