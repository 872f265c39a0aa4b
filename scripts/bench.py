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
7. Usage (scripts/bench_usage.py): GET /api/v1/usage for 30 days over the daily rollup of 1,000,000 ended
   attempts (p95 < 300 ms), beside 1,000.
8. MultiKueue (scripts/bench_multikueue.py): the supervisor's cycle with N executions admitted to each of two
   workers / N on one, median of paired rounds (<= 2.2: the work doubles); recorded informer objects.
Each target is judged on the median of its rounds where it has rounds (never the best round). The report
is printed and written to var/bench/report.md (and as data to var/bench/report.json, which `python -m
scripts.figures keep` keeps as the docs' figure file); it opens with what the figures were measured on (the
commit and whether the checkout was dirty, PostgreSQL's fsync / synchronous_commit / full_page_writes as the
servers report them, etcd's --unsafe-no-fsync from its running command line) and ends with the verdict
(scripts/bench_verdict.py). A section that fails is reported as failed and the others still run. make bench
exits 1 on any missed target or failed section, after the whole report is written, and names each miss; a
section that cannot run here (Kueue absent, BENCH_KUEUE=off) is skipped with its reason and is not a miss.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench_common import (
    BENCH_NAMESPACE,
    BENCH_REDIS_DB,
    CONNECTIONS,
    DURABILITY_SETTINGS,
    DURATION,
    PY,
    REPO,
    ROUNDS,
    Target,
    cleanup_django,
    cluster_kubeconfig,
    free_port,
    fresh_database,
    gunicorn_command,
    log,
    median_of,
    redis_url,
    server_env,
    setup_django,
    wait_http,
    web_log,
    web_shape,
    wrk,
)
from scripts.bench_verdict import Durability, Outcome, durability_lines, exit_code, misses, verdict_lines


def attempt(section: str, action: Callable[[], Any]) -> tuple[Any, str]:
    """(the section's result, "") or (None, the error that stopped it): one failed section must never lose the
    others' figures (issue 34); the verdict counts it as a miss."""
    try:
        return action(), ""
    except (Exception, SystemExit) as exc:  # reported in the section and the verdict; the bench goes on
        log(f"{section} failed:\n{traceback.format_exc()}")
        return None, f"{type(exc).__name__}: {exc}"[:400]


def server_bench() -> dict[str, tuple[Any, str]]:
    """The sections on one gunicorn server: each one's (result, error)."""
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
    results: dict[str, tuple[Any, str]] = {}
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

        def plan_rounds() -> list[dict[str, Any]]:
            wrk(f"{base}/api/v1/me", token)  # warm-up: imports, connections, the runtime read
            endpoints = [
                (TRIVIAL, f"{base}/api/v1/me", None),
                (PLAN, f"{base}/api/v1/plan", body),
            ]
            # Interleaved rounds, so a slow moment of the machine hits every endpoint alike; the ratio is
            # taken per round (plan_section).
            rows = []
            for round_number in range(1, ROUNDS + 1):
                for name, url, payload in endpoints:
                    rows.append({"name": name, "round": round_number, **wrk(url, token, payload)})
            return rows

        results["plan"] = attempt("plan", plan_rounds)
        from scripts.bench_sessions import run as sessions_run

        log("session execute: through dispatch vs a direct kubernetes.stream call ...")
        results["session-exec"] = attempt(
            "session execute", lambda: sessions_run(base, token, kubeconfig, BENCH_NAMESPACE)
        )
        from scripts.bench_starts import run as starts_run

        log("starts: TrainJobs/s through a threads worker vs the kubernetes client directly ...")
        results["starts"] = attempt("starts", lambda: starts_run(kubeconfig, env, REPO / "var"))
        from scripts.bench_supervision import run as supervision_run

        log("supervision: requests per cycle (10/100/1000 jobs), derivation scaling, failure latency ...")
        results["supervision"] = attempt("supervision", lambda: supervision_run(kubeconfig))
    finally:
        server.terminate()
        server.wait(timeout=30)
        removed = cleanup_django()
        import redis

        redis.Redis.from_url(redis_url()).flushdb()
        log(f"removed the bench's jobs ({removed} rows) and flushed Redis db {BENCH_REDIS_DB}")
    return results


TRIVIAL = "GET /api/v1/me (trivial, authenticated)"
PLAN = "POST /api/v1/plan"
PLAN_TARGET = 0.5


def plan_target(rows: list[dict[str, Any]]) -> Target:
    """plan requests/s / trivial requests/s: the ratio of each round (the two measured back to back in it),
    judged on their median; never the best of one side against the best of the other."""
    per_round = {r["round"]: r["rps"] for r in rows if r["name"] == TRIVIAL}
    ratios = [
        r["rps"] / per_round[r["round"]] for r in rows if r["name"] == PLAN and per_round.get(r["round"])
    ]
    if not ratios:
        return Target("plan rps / trivial rps", "no round measured", f">= {PLAN_TARGET}", False)
    ratio = median_of(ratios)
    return Target(
        "plan requests/s / trivial authenticated requests/s",
        f"{ratio:.2f}",
        f">= {PLAN_TARGET}",
        ratio >= PLAN_TARGET,
        f"median of {len(ratios)} rounds (each round's pair back to back; rounds "
        f"{', '.join(f'{x:.2f}' for x in ratios)})",
    )


def plan_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## One server, side by side (wrk)", ""]
    lines += [
        f"gunicorn as `make up` runs it ({web_shape()}); "
        f"wrk: {CONNECTIONS} connections, {DURATION} per measurement, "
        f"{ROUNDS} interleaved rounds (the target is judged on the median of the rounds' ratios)",
        "",
        "| endpoint | round | requests/s | requests | non-2xx | p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['round']} | {r['rps']:.0f} | {r['requests']} | {r['non_2xx']} "
            f"| {r['p99_ms']:.1f} |"
        )
    target = plan_target(rows)
    lines += [
        "",
        "| measure | value | target | met | judged on |",
        "|---|---|---|---|---|",
        f"| {target.measure} | {target.value} | {target.target} | {'yes' if target.met else 'NO'} "
        f"| {target.judged_on} |",
    ]
    return lines


def rules_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Rule checker: check / parse (target <= 0.5, the median of the rounds' ratios)", ""]
    lines += ["| runtime | loader | parse µs | check µs | ratio | target met |", "|---|---|---|---|---|---|"]
    for row in rows:
        met = "yes" if row["ratio"] <= 0.5 else "NO"
        lines.append(
            f"| {row['name']} | {row.get('loader', '')} | {row['parse_seconds'] * 1e6:.1f} | "
            f"{row['check_seconds'] * 1e6:.1f} | {row['ratio']:.3f} | {met} |"
        )
    return lines


def submissions_run() -> dict[str, Any]:
    """Submissions against a trivial request on a durable PostgreSQL of the bench's own
    (scripts/bench_submit.py, a subprocess: this process's Django is set up on the shared test database)."""

    log("submissions/s against GET /api/v1/me on a durable PostgreSQL (scripts/bench_submit.py) ...")
    done = subprocess.run(
        [str(PY), str(REPO / "scripts" / "bench_submit.py")],
        cwd=REPO,
        env=os.environ | {"KUBECONFIG": cluster_kubeconfig()},
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def kueue_run() -> dict[str, Any]:
    """Kueue: quota frees -> running, dispatch / bare (scripts/bench_kueue.py); Django is set up."""
    from scripts.bench_kueue import kueue_down, kueue_up, run

    if os.environ.get("BENCH_KUEUE") == "off":  # Kueue's visibility server takes a fixed path per machine
        return {"skipped": "BENCH_KUEUE=off"}
    kubeconfig = cluster_kubeconfig()
    started = kueue_up(kubeconfig)
    try:
        log("kueue: quota frees -> running, a dispatch job vs a bare TrainJob, paired rounds ...")
        return run(kubeconfig)
    finally:
        if started:
            kueue_down()


def durability(submissions: dict[str, Any] | None) -> Durability:
    """What the figures were measured on, read from the running servers and the checkout."""
    from scripts.bench_common import etcd_unsafe_no_fsync, postgres_durability
    from scripts.provenance import commit_of

    url = os.environ.get("DATABASE_URL", "postgres://dispatch:dispatch@127.0.0.1:25432/dispatch")
    try:
        postgres = postgres_durability(url)
    except Exception as exc:  # the report says it could not read them
        postgres = {name: f"unknown ({type(exc).__name__})" for name in DURABILITY_SETTINGS}
    where = urlparse(url)
    # The plane the sections ran on (set by then), else scripts/cluster's default: never start one here.
    state = Path(os.environ.get("DISPATCH_CLUSTER_STATE", str(REPO / "var" / "cluster")))
    kubeconfig = os.environ.get("KUBECONFIG") or str(state / "admin.kubeconfig")
    settings = (submissions or {}).get("durability")
    return Durability(
        postgres=postgres,
        postgres_where=f"the server sections' ({where.hostname}:{where.port}, a database of the bench's own)",
        etcd_unsafe_no_fsync=etcd_unsafe_no_fsync(kubeconfig),
        commit=commit_of(REPO),
        submissions_postgres={k: str(v) for k, v in settings.items() if k != "data"} if settings else None,
    )


@dataclass(frozen=True)
class Section:
    """One section of the report: what runs it, renders its result and lists its targets (as judged)."""

    name: str
    run: Callable[[], Any]
    render: Callable[[Any], list[str]]
    targets: Callable[[Any], list[Target]]


def run_sections(sections: Sequence[Section]) -> tuple[list[str], list[Outcome], dict[str, Any]]:
    """Each section in turn, its figures in the report whatever another one did: (the report's lines, each
    section's outcome, each section's result or None)."""
    body: list[str] = []
    outcomes: list[Outcome] = []
    results: dict[str, Any] = {}
    for section in sections:
        result, error = attempt(section.name, section.run)
        results[section.name] = result
        if error:
            body += ["", f"## {section.name}", "", f"FAILED: {error} (make bench's log has the traceback)."]
            outcomes.append(Outcome(section.name, failed=error))
            continue
        body += section.render(result)
        if isinstance(result, dict) and result.get("skipped"):  # render() says so, with the reason
            outcomes.append(Outcome(section.name, skipped=str(result["skipped"])))
        else:
            outcomes.append(Outcome(section.name, targets=section.targets(result)))
    return body, outcomes, results


def write_report(body: list[str], outcomes: list[Outcome], measured_on: Durability, out: Path) -> int:
    """The whole report (what it was measured on, every section, the verdict) printed and written to
    `out`/report.md; then each miss named on stderr. Returns make bench's exit status (1 on any miss)."""
    lines = [
        f"# dispatch benchmark report ({time.strftime('%Y-%m-%d %H:%M:%S')}, {os.cpu_count()} cores)",
        "",
        "Measured on (read from the running servers and the checkout as the run ended):",
        "",
        *durability_lines(measured_on),
        *body,
        *verdict_lines(outcomes),
    ]
    report = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(report)
    missed = misses(outcomes)
    (out / "report.json").write_text(json.dumps(report_json(outcomes, measured_on, missed), indent=2) + "\n")
    print(report, flush=True)
    for miss in missed:
        log(f"MISSED: {miss}")
    log(f"report written to {out / 'report.md'}; {len(missed)} missed target(s)")
    return exit_code(outcomes)


def report_json(outcomes: Sequence[Outcome], measured_on: Durability, missed: list[str]) -> dict[str, Any]:
    """report.json: what `python -m scripts.figures keep` keeps as a figure file (the docs' table)."""
    return {
        "kind": "bench",
        "at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cores": os.cpu_count(),
        "measured_on": {
            "commit": dict(measured_on.commit),
            "lines": [line.removeprefix("- ") for line in durability_lines(measured_on)],
        },
        "outcomes": [
            {
                "section": o.section,
                "skipped": o.skipped,
                "failed": o.failed,
                "targets": [dataclasses.asdict(t) for t in o.targets],
            }
            for o in outcomes
        ],
        "missed": missed,
        "ok": not missed,
    }


def main() -> int:
    """make bench: every section, then what it was measured on and the verdict; its exit status."""
    from scripts import (
        bench_dashboard,
        bench_kueue,
        bench_metrics,
        bench_multikueue,
        bench_rules,
        bench_sessions,
        bench_starts,
        bench_submit,
        bench_supervision,
        bench_usage,
    )

    server: dict[str, tuple[Any, str]] = {}

    def on_server(name: str) -> Callable[[], Any]:
        """One of the sections server_bench runs on one gunicorn server (run once, for all of them)."""

        def run() -> Any:
            if not server:
                results, error = attempt("server sections", server_bench)
                server.update(results or {"": (None, error)})
            result, error = server.get(name) or server[""]
            if error:
                raise RuntimeError(error)
            return result

        return run

    def logged(message: str, run: Callable[[], Any]) -> Callable[[], Any]:
        def announced() -> Any:
            log(message)
            return run()

        return announced

    sections = [
        Section("rule checker", bench_rules.run, rules_lines, bench_rules.targets),
        Section("plan", on_server("plan"), plan_lines, lambda rows: [plan_target(rows)]),
        Section("submissions", submissions_run, bench_submit.report_lines, bench_submit.targets),
        Section("starts", on_server("starts"), bench_starts.report_lines, bench_starts.targets),
        Section(
            "session execute", on_server("session-exec"), bench_sessions.report_lines, bench_sessions.targets
        ),
        Section(
            "supervision", on_server("supervision"), bench_supervision.report_lines, bench_supervision.targets
        ),
        Section(
            "dashboard",
            logged(
                "dashboard: job list with 100 / 100,000 jobs, job page 1x2 / 20x64 ...", bench_dashboard.run
            ),
            bench_dashboard.report_lines,
            bench_dashboard.targets,
        ),
        Section(
            "metrics",
            logged("metrics: one scrape with 100 / 100,000 jobs ...", bench_metrics.run),
            bench_metrics.report_lines,
            bench_metrics.targets,
        ),
        Section(
            "usage",
            logged("usage: the 30-day query, rollups of 1,000 / 1,000,000 attempts ...", bench_usage.run),
            bench_usage.report_lines,
            bench_usage.targets,
        ),
        Section("Kueue", kueue_run, bench_kueue.report_lines, bench_kueue.targets),  # issue 19
        Section(  # issue 35
            "MultiKueue",
            logged(
                "multikueue: the supervisor's cycle, N executions on 1 worker / N on each of 2 ...",
                bench_multikueue.run,
            ),
            bench_multikueue.report_lines,
            bench_multikueue.targets,
        ),
    ]
    body, outcomes, results = run_sections(sections)
    return write_report(body, outcomes, durability(results.get("submissions")), REPO / "var" / "bench")


if __name__ == "__main__":
    sys.exit(main())
