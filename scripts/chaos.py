#!/usr/bin/env python3
"""make chaos: submit and cancel jobs concurrently through the real stack while faults hit it, then reconcile
the database with the cluster and report the figures (issue 10).

What runs (all real): a throwaway PostgreSQL and Redis of its own (scripts/services on other ports, other data
and state directories; the shared ones on 25432/26379 are never touched), dispatch's web server (gunicorn),
Celery workers, Celery beat (the supervisor's cycle `jobs.supervision.tasks.supervise` and the stale sweep),
and the local control plane with KWOK (`KWOK_RUN_DURATION=2s`, so jobs finish).

Faults, at seeded random moments: SIGKILL of a worker process (restarted a moment later), a Redis restart
(its queue is lost: it keeps nothing on disk), a PostgreSQL restart, and an API server outage of 30 s.
The outage is made by a small TCP proxy on 127.0.0.1 that this script starts: dispatch's processes reach
the API server only through a kubeconfig naming the proxy, and pausing the proxy closes its listener and every
connection through it. From dispatch's side that is exactly an API server that is down (connection
refused), without stopping the shared control plane other people's tests use.

Afterwards (faults over, plus a settle time) it reports: duplicate TrainJobs per (job, attempt); orphaned
TrainJobs (not finished, with no active job behind them); accepted jobs lost (never reached the cluster nor a
terminal state with a cause); jobs stuck in a non-terminal state; 5xx answers (a 503 that names the dependency
that is down is the expected answer during an outage and is counted apart); deadlocks in the PostgreSQL log.
Every decision (job kinds, which jobs are cancelled and when, fault times and targets) comes from --seed, so a
failing run can be replayed; thread and process timing still varies from run to run.

    scripts/chaos.py --jobs 200 --seed 1     # make chaos
    scripts/chaos.py --jobs 20 --short       # the short run inside `make test` (tests/scripts/test_chaos.py)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlparse

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PY = str(REPO / ".venv" / "bin" / "python")
SHARED_PORTS = {25432, 26379}


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------- the API server proxy


class Proxy:
    """TCP proxy 127.0.0.1:port -> the API server. pause(): the listener and every connection close, so
    dispatch's calls are refused as if the API server were down; resume() listens again on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
                with self._lock:
                    self._conns.discard(s)

    def pause(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def resume(self) -> None:
        self.start()


# ---------------------------------------------------------------- processes


@dataclass
class Stack:
    env: dict[str, str]
    services_env: dict[str, str]
    run_dir: Path
    web_port: int
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def services(self, action: str, *which: str) -> None:
        subprocess.run(
            [str(REPO / "scripts" / "services"), action, *which],
            env=self.services_env,
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def stop_redis(self, port: int) -> None:
        """Stop our Redis by the pid it reports (its pidfile is not always there to read)."""
        info = subprocess.run(
            ["redis-cli", "-p", str(port), "info", "server"], capture_output=True, text=True, check=False
        ).stdout
        pids = [line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("process_id:")]
        if not pids:
            return
        pid = int(pids[0])
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        out = (self.run_dir / f"{name}.log").open("ab")
        return subprocess.Popen(args, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def start_worker(self, index: int) -> None:
        process = self._spawn(
            f"worker-{index}",
            [
                PY,
                "-m",
                "celery",
                "-A",
                "dispatch_site",
                "worker",
                "--pool",
                "solo",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "INFO",
                "-n",
                f"chaos{index}-{uuid.uuid4().hex[:6]}@%h",
            ],
        )
        if index < len(self.workers):
            self.workers[index] = process
        else:
            self.workers.append(process)

    def start(self, workers: int) -> None:
        self.others.append(
            self._spawn(
                "web",
                [
                    PY,
                    "-m",
                    "gunicorn",
                    "dispatch_site.wsgi:application",
                    "--bind",
                    f"127.0.0.1:{self.web_port}",
                    "--workers",
                    "2",
                    "--timeout",
                    "60",
                ],
            )
        )
        self.others.append(
            self._spawn(
                "beat",
                [
                    PY,
                    "-m",
                    "celery",
                    "-A",
                    "dispatch_site",
                    "beat",
                    "--loglevel",
                    "INFO",
                    "-s",
                    str(self.run_dir / "celerybeat-schedule"),
                ],
            )
        )
        for i in range(workers):
            self.start_worker(i)

    def stop(self) -> None:
        for process in [*self.workers, *self.others]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in [*self.workers, *self.others]:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


# ---------------------------------------------------------------- the load


@dataclass
class Figures:
    answers: Counter[int] = field(default_factory=Counter)
    unnamed_503: int = 0
    refused_connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, response: requests.Response | None) -> None:
        with self.lock:
            if response is None:
                self.refused_connections += 1
                return
            self.answers[response.status_code] += 1
            if response.status_code == 503:
                text = response.text.lower()
                if not any(dep in text for dep in ("database", "redis", "broker", "cluster")):
                    self.unnamed_503 += 1


def call_api(
    figures: Figures, method: str, url: str, token: str, deadline: float, **kwargs: Any
) -> requests.Response | None:
    """One request, repeated while the answer is 503 or no answer (an outage), until `deadline`."""
    while time.monotonic() < deadline:
        try:
            response = requests.request(
                method, url, headers={"Authorization": f"Token {token}"}, timeout=30, **kwargs
            )
        except requests.RequestException:
            figures.record(None)
            time.sleep(1)
            continue
        figures.record(response)
        if response.status_code in (502, 503, 504):
            time.sleep(1)
            continue
        return response
    return None


def job_body(namespace: str, kind: str) -> dict[str, Any]:
    env = {
        "succeeds": {"KWOK_RUN_DURATION": "2s"},
        "app-error": {"KWOK_RUN_DURATION": "2s", "KWOK_EXIT_CODE": "3"},
        "runs-until-cancelled": {"KWOK_STAY_RUNNING": "1"},
    }[kind]
    return {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
        "env": env,
    }


# ---------------------------------------------------------------- the run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED", "1")))
    parser.add_argument("--short", action="store_true", help="fewer worker kills, a shorter submission phase")
    parser.add_argument("--outage-seconds", type=float, default=30.0)
    parser.add_argument("--settle-seconds", type=float, default=420.0)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--pg-port", type=int, default=int(os.environ.get("CHAOS_PG_PORT", "35432")))
    parser.add_argument("--redis-port", type=int, default=int(os.environ.get("CHAOS_REDIS_PORT", "36379")))
    parser.add_argument("--web-port", type=int, default=int(os.environ.get("CHAOS_WEB_PORT", "18080")))
    parser.add_argument("--kubeconfig", default=str(REPO / "var" / "cluster" / "admin.kubeconfig"))
    parser.add_argument("--report", default=str(REPO / "var" / "chaos" / "report.json"))
    args = parser.parse_args(argv)
    if {args.pg_port, args.redis_port} & SHARED_PORTS:
        parser.error("the chaos run restarts its PostgreSQL and Redis: never the shared ones (25432, 26379)")
    rng = random.Random(args.seed)
    run_dir = REPO / "var" / "chaos" / f"seed-{args.seed}-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    pg_data = f"/var/tmp/dispatch-chaos-pg-{args.pg_port}"

    # The proxied kubeconfig: same credentials and CA, the server is the proxy.
    kubeconfig = yaml.safe_load(Path(args.kubeconfig).read_text())
    server = urlparse(kubeconfig["clusters"][0]["cluster"]["server"])
    proxy = Proxy((server.hostname or "127.0.0.1", server.port or 443))
    proxy.start()
    kubeconfig["clusters"][0]["cluster"]["server"] = f"https://{server.hostname}:{proxy.port}"
    for cluster in kubeconfig["clusters"]:
        cluster["cluster"].pop("tls-server-name", None)
    proxied = run_dir / "proxied.kubeconfig"
    proxied.write_text(yaml.safe_dump(kubeconfig))

    database_url = f"postgres://dispatch:dispatch@127.0.0.1:{args.pg_port}/dispatch"
    services_env = os.environ | {
        "DISPATCH_PG_PORT": str(args.pg_port),
        "DISPATCH_REDIS_PORT": str(args.redis_port),
        "DISPATCH_PG_DATA": pg_data,
        "DISPATCH_SERVICES_STATE": str(REPO / "var" / "chaos" / f"services-{args.pg_port}"),
    }
    env = os.environ | {
        "DATABASE_URL": database_url,
        "REDIS_URL": f"redis://127.0.0.1:{args.redis_port}/0",
        "KUBECONFIG": str(proxied),
        "KUBE_TIMEOUT_SECONDS": "5",
        "SUPERVISOR_INTERVAL_SECONDS": "5",
        "DJANGO_SETTINGS_MODULE": "dispatch_site.settings",
        "PYTHONUNBUFFERED": "1",
    }
    stack = Stack(env=env, services_env=services_env, run_dir=run_dir, web_port=args.web_port)
    log(f"seed {args.seed}, {args.jobs} jobs, logs in {run_dir}")
    stack.services("up")
    pg_log = Path(pg_data) / "server.log"
    pg_log_start = pg_log.stat().st_size if pg_log.exists() else 0

    # Django in this process: setup before the faults, reconciliation after them.
    os.environ.update({k: v for k, v in env.items() if k != "KUBECONFIG"} | {"KUBECONFIG": args.kubeconfig})
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections
    from kubernetes import client, config

    from dispatch_site import roles
    from dispatch_site.services import user_create
    from jobs.models import TERMINAL_STATES, Execution, Job, JobState
    from runtimes.models import AllowListEntry

    call_command("migrate", verbosity=0)
    with contextlib.suppress(Exception):
        call_command("seed_local_runtime", verbosity=0)
    api_client = config.new_client_from_config(config_file=args.kubeconfig)
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    namespace = f"chaos-{args.seed}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    for _ in range(100):  # pods are refused until the namespace's default ServiceAccount exists
        with contextlib.suppress(client.ApiException):
            core.read_namespaced_service_account("default", namespace)
            break
        time.sleep(0.1)
    _, token = user_create(username=f"chaos-{namespace}", role=roles.USER, namespaces=[namespace])
    AllowListEntry.objects.get_or_create(
        kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind", defaults={"for_jobs": True}
    )
    AllowListEntry.objects.filter(kind="ClusterTrainingRuntime", name="dispatch-kind").update(for_jobs=True)
    connections.close_all()

    stack.start(args.workers)
    base = f"http://127.0.0.1:{args.web_port}"
    for _ in range(120):
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{base}/healthz", timeout=2).status_code == 200:
                break
        time.sleep(0.5)

    # The plan of the run, all from the seed.
    submit_phase = 40.0 if args.short else max(120.0, args.jobs * 0.6)
    kinds = rng.choices(["succeeds", "app-error", "runs-until-cancelled"], weights=[70, 10, 20], k=args.jobs)
    plan = []
    for i, kind in enumerate(kinds):
        cancel = kind == "runs-until-cancelled" or rng.random() < 0.1
        plan.append(
            {
                "index": i,
                "kind": kind,
                "at": rng.uniform(0, submit_phase),
                "cancel_after": rng.uniform(0, 20.0) if cancel else None,
            }
        )
    kills = 2 if args.short else 8
    fault_window = submit_phase + 20
    faults: list[tuple[float, str]] = [(rng.uniform(3, fault_window), "kill-worker") for _ in range(kills)]
    # The three outages start in separate thirds of the window (the 30 s API outage may overlap the next).
    for n, what in enumerate(rng.sample(["redis", "postgres", "api-server"], 3)):
        lo = 3 + n * fault_window / 3
        faults.append((rng.uniform(lo, lo + fault_window / 3 - 10), what))
    faults.sort()
    worker_picks = [rng.randrange(args.workers) for _ in range(kills)]

    figures = Figures()
    kill_lock = threading.Lock()
    accepted: dict[int, str] = {}
    started = time.monotonic()
    fault_log: list[dict[str, Any]] = []
    run_deadline = started + submit_phase + args.outage_seconds + 600

    def run_fault(at: float, what: str) -> None:
        time.sleep(max(0.0, started + at - time.monotonic()))
        t = round(time.monotonic() - started, 1)
        if what == "kill-worker":
            with kill_lock:  # one kill at a time: each restarted worker is tracked, none leaks
                index = worker_picks.pop()
                victim = stack.workers[index]
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                time.sleep(1)
                stack.start_worker(index)
            fault_log.append({"at": t, "fault": f"SIGKILL worker {index} (pid {victim.pid}), restarted"})
        elif what == "redis":
            stack.stop_redis(args.redis_port)
            time.sleep(5)
            stack.services("up", "redis")
            fault_log.append({"at": t, "fault": "Redis stopped for 5 s (its queues lost), started again"})
        elif what == "postgres":
            stack.services("down", "postgres")
            time.sleep(5)
            stack.services("up", "postgres")
            fault_log.append({"at": t, "fault": "PostgreSQL stopped for 5 s (fast shutdown), started again"})
        elif what == "api-server":
            proxy.pause()
            time.sleep(args.outage_seconds)
            proxy.resume()
            fault_log.append({"at": t, "fault": f"API server unreachable for {args.outage_seconds:.0f} s"})
        log(f"fault done: {fault_log[-1]['fault']} (at {t} s)")

    def run_job(item: dict[str, Any]) -> None:
        time.sleep(max(0.0, started + item["at"] - time.monotonic()))
        key = f"chaos-{args.seed}-{item['index']}"
        response = _submit(key, item)
        if response is None or response.status_code not in (200, 201, 202):
            return
        job_id = response.json()["id"]
        accepted[item["index"]] = job_id
        if item["cancel_after"] is not None:
            time.sleep(item["cancel_after"])
            call_api(figures, "POST", f"{base}/api/v1/jobs/{job_id}/cancel", token, run_deadline)

    def _submit(key: str, item: dict[str, Any]) -> requests.Response | None:
        while time.monotonic() < run_deadline:
            try:
                response = requests.post(
                    f"{base}/api/v1/jobs",
                    json=job_body(namespace, item["kind"]),
                    headers={"Authorization": f"Token {token}", "Idempotency-Key": key},
                    timeout=30,
                )
            except requests.RequestException:
                figures.record(None)
                time.sleep(1)
                continue
            figures.record(response)
            if response.status_code in (502, 503, 504):
                time.sleep(1)
                continue
            return response
        return None

    fault_threads = [threading.Thread(target=run_fault, args=f, daemon=True) for f in faults]
    for thread in fault_threads:
        thread.start()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(run_job, plan))
    for thread in fault_threads:
        thread.join()
    faults_over = time.monotonic()
    log(
        f"submissions and faults over after {faults_over - started:.0f} s; {len(accepted)} accepted; settling"
    )

    # Settle: until every accepted job is terminal and no delete is outstanding, or the settle time ran out.
    def outstanding() -> tuple[int, int]:
        connections.close_all()
        try:
            active = (
                Job.objects.filter(pk__in=list(accepted.values())).exclude(state__in=TERMINAL_STATES).count()
            )
            deletes = Execution.objects.filter(
                job_id__in=list(accepted.values()),
                delete_requested_at__isnull=False,
                objects_removed_at__isnull=True,
            ).count()
        except Exception as exc:  # the database may still be coming back
            log(f"settle: database not answering: {exc}")
            return 1, 1
        return active, deletes

    while time.monotonic() < faults_over + args.settle_seconds:
        active, deletes = outstanding()
        if not active and not deletes:
            break
        time.sleep(5)
    settled = time.monotonic() - faults_over
    time.sleep(5)  # the garbage collector and the last deletes

    # Reconcile the database with the cluster.
    connections.close_all()
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=list(accepted.values()))}
    executions = list(Execution.objects.filter(job_id__in=list(jobs)))
    listed = cast(
        dict[str, Any],
        custom.list_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs"),
    )
    trainjobs: list[dict[str, Any]] = listed["items"]
    domain = "dispatch.dev"
    per_key: Counter[tuple[str, str]] = Counter()
    orphans = []
    for tj in trainjobs:
        meta = tj["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels") or {}
        key = (labels.get(f"{domain}/job", ""), labels.get(f"{domain}/attempt", ""))
        per_key[key] += 1
        conditions = (tj.get("status") or {}).get("conditions") or []
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
        )
        job = jobs.get(key[0])
        behind = job is not None and job.state not in TERMINAL_STATES and str(job.current_attempt) == key[1]
        if not finished and not behind:
            orphans.append(meta["name"])
    submitted = {e.job_id for e in executions if e.submitted_at is not None}
    lost = [
        job_id
        for job_id in accepted.values()
        if job_id not in jobs
        or (jobs[job_id].state in (JobState.FAILED, JobState.UNKNOWN) and not jobs[job_id].cause)
        or (
            job_id not in submitted
            and jobs[job_id].state not in (JobState.CANCELLED, JobState.REFUSED, JobState.FAILED)
        )
    ]
    stuck = [j.pk for j in jobs.values() if j.state not in TERMINAL_STATES]
    deadlocks = 0
    if pg_log.exists():
        with pg_log.open("rb") as f:
            f.seek(pg_log_start)
            deadlocks = f.read().decode(errors="replace").count("deadlock detected")
    server_errors = sum(n for code, n in figures.answers.items() if code >= 500 and code != 503)
    figures_out = {
        "duplicate_trainjobs": sum(n - 1 for n in per_key.values() if n > 1),
        "orphaned_trainjobs": len(orphans),
        "lost_jobs": len(lost),
        "stuck_jobs": len(stuck),
        "server_errors_5xx": server_errors + figures.unnamed_503,
        "deadlocks": deadlocks,
    }
    report: dict[str, Any] = {
        "seed": args.seed,
        "jobs_planned": args.jobs,
        "jobs_accepted": len(accepted),
        "states": dict(Counter(j.state for j in jobs.values())),
        "causes": dict(Counter(j.cause for j in jobs.values() if j.cause)),
        "faults": fault_log,
        "settle_seconds": round(settled, 1),
        "answers": {str(k): v for k, v in sorted(figures.answers.items())},
        "no_answer": figures.refused_connections,
        "figures": figures_out,
        "examples": {"orphans": orphans[:5], "lost": lost[:5], "stuck": stuck[:5]},
        "logs": str(run_dir),
    }
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))

    stack.stop()
    connections.close_all()
    stack.services("down", "postgres")
    stack.stop_redis(args.redis_port)
    with contextlib.suppress(Exception):
        core.delete_namespace(namespace, propagation_policy="Background")
    ok = all(v == 0 for v in figures_out.values()) and len(accepted) == args.jobs
    log("all figures at target" if ok else "FIGURES OFF TARGET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
