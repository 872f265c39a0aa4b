#!/usr/bin/env python
"""make bench: one report, every ratio measured side by side in one run on this machine.

1. Rule checker: cost of checking a runtime / cost of parsing its YAML (target <= 0.5).
2. On one gunicorn server (PostgreSQL, Redis, the local control plane), driven by wrk:
   - plan requests/s / requests/s of a trivial authenticated endpoint (GET /api/v1/me), target >= 0.5;
   - accepted submissions/s (POST /api/v1/jobs answered 202, each recorded and enqueued to Redis) / GET
     /api/v1/me requests/s, on a durable PostgreSQL of the bench's own, target >= 0.6
     (scripts/bench_submit.py). No worker runs then: every accepted job's message is counted in Redis;
   - TrainJobs/s started by a threads worker / the same objects through the kubernetes client at the same
     concurrency, target >= 50/s and dispatch / direct time <= 1.5 (scripts/bench_starts.py).
   - a session execute through dispatch / the same exec with kubernetes.stream directly, p50 and p95,
     target <= 1.5 (scripts/bench_sessions.py).
3. Supervision (scripts/bench_supervision.py): API requests per cycle with 10/100/1,000 jobs (<= 6, the same
   for all), one cycle's derivation for 5,000 / 50 executions (<= 120), pod failure -> state change latency.
4. Dashboard (scripts/bench_dashboard.py): the job list's first page, unfiltered and state + cause, with
   100,000 / 100 jobs (<= 1.5), and the job page with 20 attempts of 64 ranks / 1 attempt of 2 (<= 5).
5. Metrics (scripts/bench_metrics.py): one scrape of GET /metrics with 100,000 jobs (< 50 ms).
6. Kueue (scripts/bench_kueue.py): quota frees -> the job running, a dispatch job (REST API, worker,
   `manage.py supervise`) / a bare TrainJob Kueue admits alone, median of paired rounds (<= 1.2). Kueue is
   started on the local plane for this section (`scripts/cluster up --kueue`) and stopped after it, so the
   sections above run on the plane they always ran on; skipped, with the reason, where Kueue is not there.
The report is printed and written to var/bench/report.md.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench_common import (
    BENCH_NAMESPACE,
    BENCH_REDIS_DB,
    CONNECTIONS,
    DURATION,
    PY,
    REPO,
    ROUNDS,
    cleanup_django,
    cluster_kubeconfig,
    free_port,
    fresh_database,
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


def server_bench() -> list[dict[str, Any]]:
    if not shutil.which("wrk"):
        log("installing wrk (Debian package) ...")
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    kubeconfig = cluster_kubeconfig()
    database_url = fresh_database(
        os.environ.get("DATABASE_URL", "postgres://dispatch:dispatch@127.0.0.1:25432/dispatch")
    )
    log(f"on a database of its own, created afresh: {urlparse(database_url).path.lstrip('/')}")
    env = server_env(database_url, kubeconfig)
    token = setup_django(env)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        gunicorn_command(port),
        cwd=REPO,
        env=os.environ | env,
        stdout=web_log("plan"),
        stderr=subprocess.STDOUT,
    )
    rows = []
    try:
        wait_http(f"{base}/healthz")
        body = {
            "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
            "namespace": BENCH_NAMESPACE,
            "image": "localhost/trainer:v1",
            "num_nodes": 2,
            "env": {"LEARNING_RATE": "0.1"},
        }
        log(
            f"gunicorn as make up runs it (dispatch_site/gunicorn.conf.py) on {base}; "
            f"wrk {CONNECTIONS} connections, {DURATION} each"
        )
        wrk(f"{base}/api/v1/me", token)  # warm-up: imports, connections, the runtime read
        endpoints = [
            ("GET /api/v1/me (trivial, authenticated)", f"{base}/api/v1/me", None),
            ("POST /api/v1/plan", f"{base}/api/v1/plan", body),
        ]
        # Interleaved rounds, so a slow moment of the machine hits every endpoint alike; the ratio is
        # taken per round (below).
        for round_number in range(1, ROUNDS + 1):
            for name, url, payload in endpoints:
                rows.append({"name": name, "round": round_number, **wrk(url, token, payload)})
        from scripts.bench_sessions import run as sessions_run

        log("session execute: through dispatch vs a direct kubernetes.stream call ...")
        rows.append({"name": "session-exec", **sessions_run(base, token, kubeconfig, BENCH_NAMESPACE)})
        from scripts.bench_starts import run as starts_run

        log("starts: TrainJobs/s through a threads worker vs the kubernetes client directly ...")
        rows.append({"name": "starts", **starts_run(kubeconfig, env, REPO / "var")})
        from scripts.bench_supervision import run as supervision_run

        log("supervision: requests per cycle (10/100/1000 jobs), derivation scaling, failure latency ...")
        rows.append({"name": "supervision", **supervision_run(kubeconfig)})
    finally:
        server.terminate()
        server.wait(timeout=30)
        removed = cleanup_django()
        import redis

        redis.Redis.from_url(redis_url()).flushdb()
        log(f"removed the bench's jobs ({removed} rows) and flushed Redis db {BENCH_REDIS_DB}")
    return rows


def submissions_lines() -> list[str]:
    """Submissions against a trivial request on a durable PostgreSQL of the bench's own
    (scripts/bench_submit.py, a subprocess: this process's Django is set up on the shared test database)."""
    import json

    from scripts.bench_submit import report_lines

    log("submissions/s against GET /api/v1/me on a durable PostgreSQL (scripts/bench_submit.py) ...")
    done = subprocess.run(
        [str(PY), str(REPO / "scripts" / "bench_submit.py")],
        cwd=REPO,
        env=os.environ | {"KUBECONFIG": cluster_kubeconfig()},
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    return report_lines(json.loads(done.stdout.strip().splitlines()[-1]))


def kueue_lines() -> list[str]:
    """Kueue: quota frees -> running, dispatch / bare (scripts/bench_kueue.py); Django is set up."""
    from scripts.bench_kueue import kueue_down, kueue_up, report_lines, run

    if os.environ.get("BENCH_KUEUE") == "off":  # Kueue's visibility server takes a fixed path per machine
        return ["", "## Kueue", "", "Skipped: BENCH_KUEUE=off."]
    kubeconfig = cluster_kubeconfig()
    started = kueue_up(kubeconfig)
    try:
        log("kueue: quota frees -> running, a dispatch job vs a bare TrainJob, paired rounds ...")
        return report_lines(run(kubeconfig))
    finally:
        if started:
            kueue_down()


def main() -> None:
    from scripts.bench_rules import run as rules_run

    lines = [
        f"# dispatch benchmark report ({time.strftime('%Y-%m-%d %H:%M:%S')}, {os.cpu_count()} cores)",
        "",
    ]
    lines += ["## Rule checker: check / parse (target <= 0.5)", ""]
    lines += ["| runtime | loader | parse µs | check µs | ratio | target met |", "|---|---|---|---|---|---|"]
    for row in rules_run():
        met = "yes" if row["ratio"] <= 0.5 else "NO"
        lines.append(
            f"| {row['name']} | {row.get('loader', '')} | {row['parse_seconds'] * 1e6:.1f} | "
            f"{row['check_seconds'] * 1e6:.1f} | {row['ratio']:.3f} | {met} |"
        )
    rows = server_bench()
    session_exec = next(r for r in rows if r["name"] == "session-exec")
    supervision = next(r for r in rows if r["name"] == "supervision")
    starts = next(r for r in rows if r["name"] == "starts")
    rows = [r for r in rows if r["name"] not in ("session-exec", "supervision", "starts")]
    by_name: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["name"] not in by_name or row["rps"] > by_name[row["name"]]["rps"]:
            by_name[row["name"]] = row
    trivial = by_name["GET /api/v1/me (trivial, authenticated)"]
    plan = by_name["POST /api/v1/plan"]
    lines += ["", "## One server, side by side (wrk)", ""]
    lines += [
        f"gunicorn as `make up` runs it ({web_shape()}); "
        f"wrk: {CONNECTIONS} connections, {DURATION} per measurement, "
        f"{ROUNDS} interleaved rounds (the best round of each endpoint counts)",
        "",
        "| endpoint | round | requests/s | requests | non-2xx | p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['round']} | {r['rps']:.0f} | {r['requests']} | {r['non_2xx']} "
            f"| {r['p99_ms']:.1f} |"
        )
    # The ratio of each round (plan and trivial measured back to back in it), then their median: never the
    # best of one side against the best of the other, which may come from different minutes.
    per_round = {r["round"]: r["rps"] for r in rows if r["name"] == "GET /api/v1/me (trivial, authenticated)"}
    ratios = sorted(
        r["rps"] / per_round[r["round"]]
        for r in rows
        if r["name"] == "POST /api/v1/plan" and per_round.get(r["round"])
    )
    ratio = statistics.median(ratios) if ratios else plan["rps"] / trivial["rps"]
    lines += [
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| plan rps / trivial rps, median of {len(ratios)} rounds (each round's pair back to back; "
        f"rounds {', '.join(f'{x:.2f}' for x in ratios)}) | {ratio:.2f} | >= 0.5 | "
        f"{'yes' if ratio >= 0.5 else 'NO'} |",
    ]
    lines += submissions_lines()
    from scripts.bench_starts import report_lines as starts_lines

    lines += starts_lines(starts)
    from scripts.bench_sessions import report_lines

    lines += report_lines(session_exec)
    from scripts.bench_supervision import report_lines as supervision_lines

    lines += supervision_lines(supervision)
    from scripts.bench_dashboard import report_lines as dashboard_lines
    from scripts.bench_dashboard import run as dashboard_run

    log("dashboard: job list with 100 / 100,000 jobs, job page 1x2 / 20x64 ...")
    lines += dashboard_lines(dashboard_run())
    lines += __import__("scripts.bench_metrics", fromlist=["bench_lines"]).bench_lines()  # issue 23
    lines += kueue_lines()  # issue 19
    report = "\n".join(lines) + "\n"
    out = REPO / "var" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
