#!/usr/bin/env python
"""make bench: one report, every ratio measured side by side in one run on this machine.

1. Rule checker: cost of checking a runtime / cost of parsing its YAML (target <= 0.5).
2. On one gunicorn server (PostgreSQL, Redis, the local control plane), driven by wrk:
   - plan requests/s / requests/s of a trivial authenticated endpoint (GET /api/v1/me), target >= 0.5;
   - accepted submissions/s (POST /api/v1/jobs answered 202, each recorded in PostgreSQL and enqueued
     to Redis), target >= 200. No worker runs during the measurement, so the cluster is not flooded;
     the bench's jobs and queued messages are removed afterwards.
   - a session execute through dispatch / the same exec with kubernetes.stream directly, p50 and p95,
     target <= 1.5 (scripts/bench_sessions.py).
3. Supervision (scripts/bench_supervision.py): API requests per cycle with 10/100/1,000 jobs (<= 6, the same
   for all), one cycle's derivation for 5,000 / 50 executions (<= 120), pod failure -> state change latency.
4. Dashboard (scripts/bench_dashboard.py): the job list's first page, unfiltered and state + cause, with
   100,000 / 100 jobs (<= 1.5), and the job page with 20 attempts of 64 ranks / 1 attempt of 2 (<= 5).
The report is printed and written to var/bench/report.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PY = Path(sys.executable)
DURATION = os.environ.get("BENCH_DURATION", "10s")
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "8"))
# One sync worker per core measured best here (more workers or threads only contend for the 2 cores).
GUNICORN_WORKERS = int(os.environ.get("BENCH_WORKERS", str(os.cpu_count() or 2)))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
GUNICORN_THREADS = int(os.environ.get("BENCH_THREADS", "1"))
BENCH_REDIS_DB = 2  # the bench's own Redis database, flushed afterwards
BENCH_NAMESPACE = "bench"


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cluster_kubeconfig() -> str:
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    log("starting the local control plane (scripts/cluster up) ...")
    up = subprocess.run(
        [str(REPO / "scripts" / "cluster"), "up"], capture_output=True, text=True, check=False
    )
    if up.returncode != 0:
        sys.exit(f"scripts/cluster up failed:\n{up.stderr[-3000:]}")
    return up.stdout.strip().splitlines()[-1]


def redis_url() -> str:
    base = os.environ.get("REDIS_URL", "redis://127.0.0.1:26379/1")
    return re.sub(r"/\d+$", "", base) + f"/{BENCH_REDIS_DB}"


def setup_django(env: dict[str, str]) -> str:
    """Migrate, create the bench user, allow-list dispatch-kind; return the user's token."""
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.contrib.auth.models import User

    from dispatch_site import roles
    from dispatch_site.services import user_create
    from runtimes.models import AllowListEntry

    User.objects.filter(username="bench").delete()
    _, token = user_create(username="bench", role=roles.USER, namespaces=[BENCH_NAMESPACE])
    AllowListEntry.objects.get_or_create(kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind")
    return token


def cleanup_django() -> int:
    from django.contrib.auth.models import User

    from dispatch_site.models import AuditEvent
    from jobs.models import Job

    user = User.objects.get(username="bench")
    count, _ = Job.objects.filter(owner=user).delete()
    AuditEvent.objects.filter(actor_name="bench").delete()
    user.delete()
    return count


def wrk(url: str, token: str, body: dict[str, Any] | None = None) -> dict[str, float]:
    script = f"""
wrk.headers["Authorization"] = "Token {token}"
wrk.headers["Content-Type"] = "application/json"
{"wrk.method = 'POST'" if body is not None else ""}
{"wrk.body = " + json.dumps(json.dumps(body)) if body is not None else ""}
"""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        lua.write(script)
    result = subprocess.run(
        ["wrk", "-t", "2", "-c", str(CONNECTIONS), "-d", DURATION, "--latency", "-s", lua.name, url],
        capture_output=True,
        text=True,
        check=True,
    )
    Path(lua.name).unlink()
    out = result.stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    p99_ms = 0.0
    if p99:
        p99_ms = float(p99.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    return {"rps": rps, "requests": total, "non_2xx": int(bad.group(1)) if bad else 0, "p99_ms": p99_ms}


def wait_http(url: str, timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"server did not answer {url}")


def server_bench() -> list[dict[str, Any]]:
    if not shutil.which("wrk"):
        log("installing wrk (Debian package) ...")
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    kubeconfig = cluster_kubeconfig()
    env = {
        "DATABASE_URL": os.environ.get(
            "DATABASE_URL", "postgres://dispatch:dispatch@127.0.0.1:25432/dispatch"
        ),
        "REDIS_URL": redis_url(),
        "KUBECONFIG": kubeconfig,
        "LOG_LEVEL": "WARNING",
        # One bench user sends hundreds of requests a second: the per-user API throttle would cap it.
        "THROTTLE_API_USER": "off",
    }
    token = setup_django(env)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            str(PY.parent / "gunicorn"),
            "dispatch_site.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(GUNICORN_WORKERS),
            "--threads",
            str(GUNICORN_THREADS),
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=os.environ | env,
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
            f"gunicorn with {GUNICORN_WORKERS} workers on {base}; "
            f"wrk {CONNECTIONS} connections, {DURATION} each"
        )
        wrk(f"{base}/api/v1/me", token)  # warm-up: imports, connections, the runtime read
        endpoints = [
            ("GET /api/v1/me (trivial, authenticated)", f"{base}/api/v1/me", None),
            ("POST /api/v1/plan", f"{base}/api/v1/plan", body),
            ("POST /api/v1/jobs (accepted: 202)", f"{base}/api/v1/jobs", body),
        ]
        # Interleaved rounds, so a slow moment of the machine hits every endpoint alike; best round kept.
        for round_number in range(1, ROUNDS + 1):
            for name, url, payload in endpoints:
                rows.append({"name": name, "round": round_number, **wrk(url, token, payload)})
        from scripts.bench_sessions import run as sessions_run

        log("session execute: through dispatch vs a direct kubernetes.stream call ...")
        rows.append({"name": "session-exec", **sessions_run(base, token, kubeconfig, BENCH_NAMESPACE)})
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
    rows = [r for r in rows if r["name"] not in ("session-exec", "supervision")]
    by_name: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["name"] not in by_name or row["rps"] > by_name[row["name"]]["rps"]:
            by_name[row["name"]] = row
    trivial = by_name["GET /api/v1/me (trivial, authenticated)"]
    plan = by_name["POST /api/v1/plan"]
    submit = by_name["POST /api/v1/jobs (accepted: 202)"]
    lines += ["", "## One server, side by side (wrk)", ""]
    lines += [
        f"gunicorn: {GUNICORN_WORKERS} sync workers x {GUNICORN_THREADS} thread; "
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
    ratio = plan["rps"] / trivial["rps"]
    # A round with any non-2xx answer does not count as accepted submissions.
    accepted = max((r["rps"] for r in rows if r["name"] == submit["name"] and r["non_2xx"] == 0), default=0.0)
    lines += [
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| plan rps / trivial rps | {ratio:.2f} | >= 0.5 | {'yes' if ratio >= 0.5 else 'NO'} |",
        f"| accepted submissions/s (PostgreSQL) | {accepted:.0f} | >= 200 | "
        f"{'yes' if accepted >= 200 else 'NO'} |",
    ]
    from scripts.bench_sessions import report_lines

    lines += report_lines(session_exec)
    from scripts.bench_supervision import report_lines as supervision_lines

    lines += supervision_lines(supervision)
    from scripts.bench_dashboard import report_lines as dashboard_lines
    from scripts.bench_dashboard import run as dashboard_run

    log("dashboard: job list with 100 / 100,000 jobs, job page 1x2 / 20x64 ...")
    lines += dashboard_lines(dashboard_run())
    report = "\n".join(lines) + "\n"
    out = REPO / "var" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
