#!/usr/bin/env python3
"""make chaos: jobs submitted and cancelled through the real stack while faults hit it; every job's outcome
checked against what its plan meant, every rank watched by an identity observer outside dispatch, every fault
verified as it happened (issues 10 and 20).

What runs (all real): a PostgreSQL and a Redis this script starts itself, on free ports chosen at run time
(never a server that merely answers on a port: two runs, or `make test` beside `make chaos`, never share
one), dispatch's web server (gunicorn), Celery workers, Celery beat (the supervisor's cycle and the sweeps),
the supervisor's pod watch (`manage.py supervise`, as `make up` runs it), and the local control plane with
KWOK. dispatch reaches the API server only through a TCP proxy this script starts (its kubeconfig names the
proxy); everything this script reads or does to the cluster goes direct, with its own client.

The plan (all from --seed, so a failing run can be replayed; thread and process timing still vary):
each job has a kind and a recovery policy (`retry`: preempted/evicted/node-lost retried; `no-retry`):
  succeeds              KWOK_RUN_DURATION=2s                      -> succeeded
  app-error             KWOK_EXIT_CODE=3 on rank KWOK_FAIL_RANK   -> failed / app-error naming that rank
  runs-until-cancelled  KWOK_STAY_RUNNING=1, cancelled later      -> cancelled, no pod left
  long                  KWOK_RUN_DURATION=40s (20s with --short)  -> succeeded; the target of disruptions
A job hit by a disruption (eviction, lost node, Kueue preemption) is expected to end the way its policy says:
a retry as a new attempt whose predecessor carries the cause (then the kind's outcome), or failed with the
cause. A job whose cancel was accepted (202) is expected `cancelled` with no pod left (pods listed from the
API server). Every mismatch is listed with the job id, what was expected and what was seen.

Faults, at seeded moments, each verified as it happens (a fault that did not happen fails the run):
  kill-worker    SIGKILL of a Celery worker: it exited by SIGKILL, a new one runs under another pid
  redis          Redis stopped: PING refused, then answered by a new pid (its queues are lost)
  postgres       PostgreSQL fast shutdown: connections refused, then accepted by a new postmaster pid
  api-server     the proxy closes: connections to it refused (and /version answered before and after)
  eviction       policy/v1 Eviction of a running rank pod of a `long` job: 201, and the pod goes
  node-loss      a second KWOK node (created at start; the first one stays) is cordoned, the rank pods on it
                 are recorded, the Node is deleted: it is gone, and PodGC removes its pods
  label-domain   PATCH /api/v1/settings {label_domain} as a platform user mid-run: 200 and read back
  foreign-pods   bare pods carrying a running job's labels (job, attempt, completion index, JobSet labels) and
                 its DISPATCH_* env, made by this script (not dispatch) in another namespace and in the job's
                 namespace: created and Running. The job must end as its plan meant.
  kueue-wave     (--kueue, on by default when the plane has Kueue) low-priority jobs on a LocalQueue of a
                 ClusterQueue with room for one, then a high-priority one: a low Workload is Evicted/Preempted

Figures (report.json, every one with its target; any miss exits 1): jobs accepted, outcome mismatches, the
identity observer's verdict (no rank ran twice, no in-place restart, except jobs whose plan answer carried an
identity warning) and whether its watch had gaps, faults not verified, requests without an answer within their
timeout (timeouts, resets: counted, then retried, never hidden), 5xx answers other than a 503 naming the
dependency, duplicate and orphaned TrainJobs, lost and stuck jobs, terminal jobs with pods still running,
Celery workers that exited without being killed (a Redis restart can end one for good),
deadlocks in the PostgreSQL log.

    scripts/chaos.py --jobs 200 --seed 1     # make chaos; var/chaos/<run>/report.json
    scripts/chaos.py --jobs 12 --short       # the short run inside `make test` (tests/scripts/test_chaos.py)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, cast
from urllib.parse import urlparse

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PY = str(REPO / ".venv" / "bin" / "python")

from scripts.identity_observer import IdentityObserver, observe  # noqa: E402
from scripts.identity_observer import now as iso_now  # noqa: E402

SUCCEEDS: Final = "succeeds"
APP_ERROR: Final = "app-error"
UNTIL_CANCELLED: Final = "runs-until-cancelled"
LONG: Final = "long"
KUEUE_LOW: Final = "kueue-low"
KUEUE_HIGH: Final = "kueue-high"
KIND_WEIGHTS: Final = {SUCCEEDS: 55, APP_ERROR: 10, UNTIL_CANCELLED: 20, LONG: 15}

INFRASTRUCTURE_CAUSES: Final = ("preempted", "node-lost", "evicted", "no-capacity")
POLICIES: Final[dict[str, dict[str, Any]]] = {
    "retry": {
        "retry": {"preempted": 2, "evicted": 2, "node-lost": 2},
        "backoff_seconds": {"preempted": 1, "evicted": 1, "node-lost": 1},
        "budgets": {"infrastructure": 3},
    },
    "no-retry": {"retry": {"preempted": 0, "evicted": 0, "node-lost": 0}},
}
TERMINAL: Final = ("succeeded", "failed", "cancelled", "refused")
DEPENDENCIES: Final = ("database", "redis", "broker", "cluster")
REQUEST_TIMEOUT: Final = 30.0
DOMAIN_LABEL_SUFFIXES: Final = ("/job", "/attempt")


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ================================================================ the plan (pure)


@dataclass(frozen=True)
class JobPlan:
    index: int
    kind: str
    at: float  # seconds after the start of the load
    policy: str  # a key of POLICIES
    cancel_after: float | None = None
    fail_rank: int | None = None
    duration: float = 2.0
    serves: str | None = None  # the fault this job is submitted for (its target)


@dataclass(frozen=True)
class FaultPlan:
    at: float
    fault: str
    pick: int  # a seeded number the fault uses to choose among what it finds (worker, rank, ...)
    targets: tuple[int, ...] = ()  # plan indexes of the jobs submitted for it


@dataclass(frozen=True)
class RunPlan:
    jobs: tuple[JobPlan, ...]
    faults: tuple[FaultPlan, ...]
    submit_phase: float
    long_duration: float


def make_plan(*, seed: int, jobs: int, short: bool, kueue: bool) -> RunPlan:
    """Everything the run decides up front, from the seed. Pure.

    Each eviction and the foreign pods get a `long` job of their own, submitted a few seconds before the
    fault, and the node loss three (which of their pods the scheduler put on the lost node is seen at the
    time); the other jobs are drawn by KIND_WEIGHTS."""
    rng = random.Random(seed)
    submit_phase = 30.0 if short else max(120.0, jobs * 0.6)
    long_duration = 20.0 if short else 40.0
    window = submit_phase + 20
    kills = 1 if short else 8
    evictions = 1 if short else 6
    # The short run keeps its outages after the targeted faults' jobs started: a start message lost with Redis
    # waits for the stale sweep (up to 2 min), longer than `make test` should. The full run mixes them.
    outages = (20.0, window) if short else (3.0, window)
    targeted = (8.0, 18.0) if short else (8.0, submit_phase)
    faults = [FaultPlan(rng.uniform(3, window), "kill-worker", rng.randrange(1 << 30)) for _ in range(kills)]
    # The three outages in separate thirds of their window.
    third = (outages[1] - outages[0]) / 3
    for n, what in enumerate(rng.sample(["redis", "postgres", "api-server"], 3)):
        lo = outages[0] + n * third
        faults.append(FaultPlan(rng.uniform(lo, lo + max(1.0, third - 10)), what, 0))
    faults += [
        FaultPlan(rng.uniform(*targeted), "eviction", rng.randrange(1 << 30)) for _ in range(evictions)
    ]
    faults.append(FaultPlan(rng.uniform(*targeted), "foreign-pods", rng.randrange(1 << 30)))
    faults.append(
        FaultPlan(rng.uniform(max(9.0, targeted[0]), targeted[1]), "node-loss", rng.randrange(1 << 30))
    )
    # The domain change ends every job still running on a build that supervises by the site's domain: in the
    # short run it comes last, so the faults before it are judged on their own.
    domain_at = (window * 0.75, window * 0.8) if short else (window * 0.3, window * 0.7)
    faults.append(FaultPlan(rng.uniform(*domain_at), "label-domain", 0))
    if kueue:
        faults.append(FaultPlan(rng.uniform(3, window * 0.4), "kueue-wave", rng.randrange(1 << 30)))
    faults = sorted((FaultPlan(round(f.at, 2), f.fault, f.pick) for f in faults), key=lambda f: f.at)

    # The jobs the targeted faults need, then the rest. The node loss gets jobs that run until cancelled, the
    # cancel well after the lost node's pods are gone: KWOK goes on playing the pods of a deleted Node until
    # PodGC removes them (40-60 s), so a pod with an end of its own may simply finish there.
    dedicated: list[tuple[str, float, int]] = []  # (kind, submit at, index of the fault it serves)
    for number, f in enumerate(faults):
        if f.fault in ("eviction", "foreign-pods"):
            dedicated.append((LONG, max(0.0, f.at - 4), number))
        elif f.fault == "node-loss":
            dedicated += [(UNTIL_CANCELLED, max(0.0, f.at - lead), number) for lead in (9, 7, 5)]
    dedicated = dedicated[:jobs]
    kinds = list(KIND_WEIGHTS)
    rest = rng.choices(kinds, weights=[KIND_WEIGHTS[k] for k in kinds], k=jobs - len(dedicated))
    if short:  # every kind at least once, whatever the seed
        for i, kind in enumerate(kinds[: len(rest)]):
            rest[i] = kind
    planned: list[tuple[str, float, int | None]] = [(kind, at, n) for kind, at, n in dedicated]
    planned += [(kind, rng.uniform(0, submit_phase), None) for kind in rest]
    rng.shuffle(planned)
    plan = []
    for i, (kind, at, serves) in enumerate(planned):
        policy = rng.choice(sorted(POLICIES))
        cancel_after: float | None = None
        if kind == UNTIL_CANCELLED and serves is not None:  # the node loss's: cancelled after its effect
            cancel_after = faults[serves].at - at + (90.0 if short else 120.0)
        elif kind == UNTIL_CANCELLED:
            cancel_after = rng.uniform(5.0, 25.0)
        elif kind in (SUCCEEDS, APP_ERROR) and rng.random() < 0.1:
            cancel_after = rng.uniform(0.0, 10.0)
        plan.append(
            JobPlan(
                index=i,
                kind=kind,
                at=round(at, 2),
                policy=policy,
                cancel_after=None if cancel_after is None else round(cancel_after, 2),
                fail_rank=rng.randrange(2) if kind == APP_ERROR else None,
                duration=long_duration if kind == LONG else 2.0,
                serves=None if serves is None else faults[serves].fault,
            )
        )
    targets = {
        n: [j.index for j, (_, _, s) in zip(plan, planned, strict=True) if s == n] for n in range(len(faults))
    }
    return RunPlan(
        jobs=tuple(plan),
        faults=tuple(FaultPlan(f.at, f.fault, f.pick, tuple(targets[n])) for n, f in enumerate(faults)),
        submit_phase=submit_phase,
        long_duration=long_duration,
    )


def job_body(item: JobPlan, namespace: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    env: dict[str, str] = {"KWOK_RUN_DURATION": f"{item.duration:g}s"}
    if item.kind == APP_ERROR:
        env |= {"KWOK_EXIT_CODE": "3", "KWOK_FAIL_RANK": str(item.fail_rank)}
    if item.kind == UNTIL_CANCELLED:
        env = {"KWOK_STAY_RUNNING": "1"}
    return {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "display_name": f"chaos {item.kind} #{item.index}",
        "env": env,
        "recovery_policy": POLICIES[item.policy],
        **(extra or {}),
    }


# ================================================================ expectations (pure)


@dataclass(frozen=True)
class Hit:
    """A disruption this run made to one attempt of a job: dispatch should see `cause`."""

    fault: str
    cause: str
    attempt: int
    at: float
    pod: str = ""


def retried(policy: Mapping[str, Any], earlier: Sequence[str], cause: str) -> bool:
    """Whether the policy (as the plan answer stated it) starts A+1 after a failure with `cause`, given the
    causes of the attempts before. The documented semantics (jobs/recovery.py's docstring, DESIGN.md), written
    out here so the expectation does not come from the code under test."""
    allowed = int((policy.get("retry") or {}).get(cause, 0))
    if sum(1 for c in earlier if c == cause) >= allowed:
        return False
    if cause in INFRASTRUCTURE_CAUSES:
        budget = int((policy.get("budgets") or {}).get("infrastructure", 0))
        if sum(1 for c in earlier if c in INFRASTRUCTURE_CAUSES) >= budget:
            return False
    return True


SEEN_WITHIN: Final = 20.0  # seconds dispatch may take to notice a disruption and start A+1 (a cycle is 5 s)


def expected_outcomes(
    *,
    kind: str,
    fail_rank: int | None,
    policy: Mapping[str, Any],
    hits: Iterable[Hit],
    cancel: str | None,
    cancel_at: float | None = None,
) -> list[dict[str, Any]]:
    """What the job's plan meant, as alternatives (any one matching is a match). Pure.

    `cancel`: None (no cancel), "accepted" (202), "refused" (409: the job had already ended), "unknown" (no
    answer we could read: the cancel may or may not have landed). A hit's `at` is when the disruption took
    effect (the pod gone). A cancel accepted at `cancel_at` ends the job `cancelled`; the hits that took
    effect SEEN_WITHIN before it must show on their attempts, and one the policy does not retry should have
    ended the job first (then the cancel should have been refused)."""
    first_per_attempt: dict[int, Hit] = {}
    for hit in sorted(hits, key=lambda h: (h.attempt, h.at)):
        if cancel == "accepted" and (cancel_at is None or hit.at + SEEN_WITHIN > cancel_at):
            continue  # the cancel may have come first
        first_per_attempt.setdefault(hit.attempt, hit)
    attempt_causes: dict[int, str] = {}
    earlier: list[str] = []
    outcome: dict[str, Any] | None = None
    attempt = 1
    for number in sorted(first_per_attempt):
        hit = first_per_attempt[number]
        if number != attempt:
            break  # a hit on an attempt the run's own faults never led to: the attempt count shows it
        attempt_causes[attempt] = hit.cause
        if not retried(policy, earlier, hit.cause):
            outcome = {
                "state": "failed",
                "cause": hit.cause,
                "why": f"{hit.fault} hit attempt {attempt}; the policy does not retry {hit.cause}",
            }
            break
        earlier.append(hit.cause)
        attempt += 1
    why = f"{len(earlier)} disruption(s) retried by the policy; then " if earlier else ""
    cancelled = {
        "state": "cancelled",
        "cause": "cancelled",
        "pods": "none",
        "why": why + "its cancel was accepted",
    }
    if outcome is None and cancel == "accepted":
        outcome = dict(cancelled)
    if outcome is None:
        if kind in (SUCCEEDS, LONG, KUEUE_LOW, KUEUE_HIGH):
            outcome = {"state": "succeeded", "cause": "", "why": why + "it runs to its end"}
        elif kind == APP_ERROR:
            outcome = {
                "state": "failed",
                "cause": "app-error",
                "rank": fail_rank,
                "exit_code": 3,
                "why": why + f"rank {fail_rank} exits 3",
            }
        else:  # runs until cancelled: only a cancel ends it
            outcome = {"state": "cancelled", "cause": "cancelled", "pods": "none", "why": why + "cancelled"}
    outcome |= {"attempts": attempt, "attempt_causes": attempt_causes}
    alternatives = [outcome]
    if cancel == "unknown":
        alternatives.append(cancelled | {"attempts": attempt, "attempt_causes": attempt_causes})
    return alternatives


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None or value == "" else int(value)
    except (TypeError, ValueError):
        return None


def mismatch(expected: Mapping[str, Any], seen: Mapping[str, Any], pods_left: Sequence[str]) -> list[str]:
    """What differs between one expected outcome and the job as the API shows it. Pure."""
    problems = []
    state, cause = seen.get("state"), seen.get("cause") or ""
    if state != expected["state"]:
        problems.append(
            f"state {state!r} (cause {cause!r}: {str(seen.get('message') or '')[:160]!r}), "
            f"expected {expected['state']!r}"
        )
    elif expected.get("cause") and cause != expected["cause"]:
        problems.append(f"cause {cause!r}, expected {expected['cause']!r}")
    if "rank" in expected and _int_or_none(seen.get("failing_rank")) != expected["rank"]:
        problems.append(f"failing rank {seen.get('failing_rank')!r}, expected {expected['rank']!r}")
    if "exit_code" in expected and _int_or_none(seen.get("exit_code")) != expected["exit_code"]:
        problems.append(f"exit code {seen.get('exit_code')!r}, expected {expected['exit_code']!r}")
    executions = sorted(seen.get("executions") or [], key=lambda e: int(e.get("attempt") or 0))
    counted = expected["state"] != "cancelled" and "attempts" in expected
    if counted and len(executions) != expected["attempts"]:
        listed = ", ".join(
            f"{e.get('attempt')}: {e.get('state')}/{e.get('cause') or '-'}" for e in executions
        )
        problems.append(f"{len(executions)} attempt(s) ({listed}), expected {expected['attempts']}")
    for attempt, hit_cause in (expected.get("attempt_causes") or {}).items():
        execution = next((e for e in executions if int(e.get("attempt") or 0) == int(attempt)), None)
        retried_past = int(attempt) < int(expected.get("attempts") or 0)
        if execution is not None and retried_past and (execution.get("cause") or "") != hit_cause:
            problems.append(
                f"attempt {attempt} ended {execution.get('state')}/{execution.get('cause') or '-'}, "
                f"expected cause {hit_cause!r}"
            )
    if expected.get("pods") == "none" and pods_left:
        problems.append(f"{len(pods_left)} pod(s) left: {', '.join(pods_left[:4])}")
    return problems


def judge_job(
    alternatives: Sequence[Mapping[str, Any]], seen: Mapping[str, Any], pods_left: Sequence[str]
) -> list[str]:
    """[] when any alternative matches, else the problems against the first one. Pure."""
    found = [mismatch(e, seen, pods_left) for e in alternatives]
    return [] if any(not f for f in found) else found[0]


def figure(value: Any, target: Any, ok: bool | None = None) -> dict[str, Any]:
    return {"value": value, "target": target, "ok": (value == target) if ok is None else ok}


# ================================================================ processes this run owns


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg_bin() -> Path:
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) for x in p.parent.name.split(".") if x.isdigit()],
    )
    if not found:
        sys.exit("chaos: PostgreSQL is not installed (scripts/services up installs it)")
    return found[-1]


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class OwnPostgres:
    """A PostgreSQL server this run initialised in its own data directory and started itself."""

    def __init__(self, data: Path, port: int) -> None:
        self.data, self.port, self.bin = data, port, _pg_bin()
        self.log = data / "server.log"

    def init(self) -> None:
        self.data.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            # Throwaway data: durability settings as the test services use (a fast shutdown is clean anyway).
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.data}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n"
            )

    def start(self) -> int:
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return self.pid()

    def stop(self) -> None:
        subprocess.run(
            _as_postgres(
                [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop"]
            ),
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def answer(self) -> tuple[bool, str]:
        """(True, data directory) when a server accepts a connection on our port; (False, the error)."""
        import psycopg

        try:
            with psycopg.connect(
                host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", connect_timeout=3
            ) as conn:
                row = conn.execute("SHOW data_directory").fetchone()
                return True, str(row[0] if row else "")
        except psycopg.OperationalError as exc:
            return False, str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)

    def create_database(self) -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute("CREATE ROLE dispatch LOGIN CREATEDB PASSWORD 'dispatch'")
            conn.execute("CREATE DATABASE dispatch OWNER dispatch")


class OwnRedis:
    """A Redis server this run started (foreground, so its pid is ours), nothing kept on disk."""

    def __init__(self, directory: Path, port: int) -> None:
        self.dir, self.port = directory, port
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.dir),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--logfile",
                str(self.dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(100):
            if self.ping()[0]:
                break
            time.sleep(0.1)
        return self.process.pid

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def ping(self) -> tuple[bool, str]:
        """(True, the answering server's process_id) or (False, the error)."""
        import redis

        try:
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=2, socket_timeout=2)
            client.ping()
            return True, str(client.info("server").get("process_id"))
        except redis.RedisError as exc:
            return False, str(exc)


class Proxy:
    """TCP proxy 127.0.0.1:port -> the API server. pause(): the listener and every connection close, so
    dispatch's calls are refused as if the API server were down; resume() listens again on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.accept_thread: threading.Thread | None = None

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self.accept_thread = threading.Thread(
            target=self._accept, args=(listener,), name=f"proxy-accept-{self.port}", daemon=True
        )
        self.accept_thread.start()

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
            # shutdown() first: close() alone leaves the socket listening while the accept thread is blocked
            # in accept() on it (Linux), and the "outage" would accept and proxy every new connection.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def resume(self) -> None:
        for _ in range(50):  # the port may be briefly held by a connection in TIME_WAIT
            try:
                self.start()
                return
            except OSError:
                time.sleep(0.2)
        self.start()

    def refuses(self) -> tuple[bool, str]:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
        except ConnectionRefusedError as exc:
            return True, repr(exc)
        except OSError as exc:
            return False, repr(exc)
        return False, "a connection was accepted"


@dataclass
class Stack:
    env: dict[str, str]
    run_dir: Path
    web_port: int
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)
    every_worker: list[tuple[int, subprocess.Popen[bytes]]] = field(default_factory=list)  # (index, process)
    killed: set[int] = field(default_factory=set)  # pids this run SIGKILLed

    def workers_that_exited(self) -> list[dict[str, Any]]:
        """Workers that ended without this run killing them (a worker process should never exit)."""
        ended = []
        for index, process in self.every_worker:
            if process.poll() is None or process.pid in self.killed:
                continue
            log_text = (self.run_dir / f"worker-{index}.log").read_text(errors="replace")
            why = [line[:300] for line in log_text.splitlines() if "Unrecoverable error" in line]
            ended.append({"worker": index, "pid": process.pid, "exit": process.returncode, "log": why[-3:]})
        return ended

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        out = (self.run_dir / f"{name}.log").open("ab")
        return subprocess.Popen(args, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def start_worker(self, index: int) -> subprocess.Popen[bytes]:
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
        self.every_worker.append((index, process))
        return process

    def start(self, workers: int, pod_watch: bool) -> None:
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
        if pod_watch:
            self.others.append(self._spawn("supervise", [PY, "manage.py", "supervise"]))
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
                process.wait()


# ================================================================ requests, counted


class Client:
    """Every request to dispatch is counted: its answer, or that none came within REQUEST_TIMEOUT (a timeout,
    a reset, a refused connection). A caller may retry (the same Idempotency-Key), but nothing is hidden."""

    def __init__(self, base: str, started: float) -> None:
        self.base, self.started = base, started
        self.lock = threading.Lock()
        self.answers: Counter[int] = Counter()
        self.unanswered: list[dict[str, Any]] = []
        self.named_503 = 0
        self.server_errors: list[dict[str, Any]] = []

    def _t(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def once(self, method: str, path: str, token: str, **kwargs: Any) -> requests.Response | None:
        headers = {"Authorization": f"Token {token}", **kwargs.pop("headers", {})}
        try:
            response = requests.request(
                method, self.base + path, headers=headers, timeout=REQUEST_TIMEOUT, **kwargs
            )
        except requests.RequestException as exc:
            text = repr(exc).lower()
            kind = (
                "timeout"
                if isinstance(exc, requests.Timeout)
                else "reset"
                if ("reset" in text or "aborted" in text or "remotedisconnected" in text)
                else "refused"
                if "refused" in text
                else "other"
            )
            with self.lock:
                self.unanswered.append(
                    {"at": self._t(), "method": method, "path": path, "kind": kind, "error": repr(exc)[:300]}
                )
            return None
        with self.lock:
            self.answers[response.status_code] += 1
            if response.status_code >= 500:
                named = response.status_code == 503 and any(d in response.text.lower() for d in DEPENDENCIES)
                if named:
                    self.named_503 += 1
                else:
                    self.server_errors.append(
                        {
                            "at": self._t(),
                            "method": method,
                            "path": path,
                            "status": response.status_code,
                            "body": response.text[:300],
                        }
                    )
        return response

    def call(
        self, method: str, path: str, token: str, deadline: float, **kwargs: Any
    ) -> requests.Response | None:
        """Until an answer other than 502/503/504, or the deadline."""
        while True:
            response = self.once(method, path, token, **dict(kwargs))
            if response is not None and response.status_code not in (502, 503, 504):
                return response
            if time.monotonic() > deadline:
                return response
            time.sleep(1)


# ================================================================ the cluster, direct


class Kube:
    """This script's own client to the API server (direct, never through the proxy)."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config

        self.client: Any = client
        self.api_client = config.new_client_from_config(config_file=kubeconfig)
        self.core: Any = client.CoreV1Api(self.api_client)
        self.custom: Any = client.CustomObjectsApi(self.api_client)
        self.ext: Any = client.ApiextensionsV1Api(self.api_client)

    def pods(self, namespace: str | None = None, *, node: str | None = None) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {"_preload_content": False, "_request_timeout": 30}
        if node:
            kwargs["field_selector"] = f"spec.nodeName={node}"
        if namespace:
            response = self.core.list_namespaced_pod(namespace, **kwargs)
        else:
            response = self.core.list_pod_for_all_namespaces(**kwargs)
        return cast(list[dict[str, Any]], json.loads(response.data)["items"])

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            response = self.core.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=10
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], json.loads(response.data))

    def namespace(self, name: str) -> None:
        client = self.client
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        for _ in range(200):  # pods are refused until the namespace's default ServiceAccount exists
            with contextlib.suppress(client.ApiException):
                self.core.read_namespaced_service_account("default", name)
                return
            time.sleep(0.1)

    def kueue_running(self) -> bool:
        """Kueue's CRDs are served and its webhooks registered (`scripts/cluster down --kueue` leaves the
        CRDs: jobs queued then would wait for ever, so the CRDs alone do not say Kueue runs)."""
        if not self.has_crd("clusterqueues.kueue.x-k8s.io"):
            return False
        hooks = self.client.AdmissionregistrationV1Api(self.api_client).list_mutating_webhook_configuration(
            _request_timeout=10
        )
        return any(h.metadata.name == "kueue-mutating-webhook-configuration" for h in hooks.items)

    def has_crd(self, name: str) -> bool:
        from kubernetes.client.rest import ApiException

        try:
            self.ext.read_custom_resource_definition(name, _request_timeout=10)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise


def pod_identity(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the pod runs under (the identity observer's reading: DISPATCH_* env, completion index, owner)."""
    record = observe(None, pod, event="LISTED", at=iso_now())
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return {
        "job": record["job"],
        "attempt": _int_or_none(record["attempt"]),
        "rank": record["rank"],
        "job_controlled": any(
            o.get("kind") == "Job" and o.get("controller") for o in record["owner_references"]
        ),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "phase": status.get("phase"),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "start": status.get("startTime"),
        "deleting": bool(meta.get("deletionTimestamp")),
    }


def _age_seconds(timestamp: str | None) -> float:
    if not timestamp:
        return 0.0
    from datetime import UTC, datetime

    return (datetime.now(UTC) - datetime.fromisoformat(timestamp.replace("Z", "+00:00"))).total_seconds()


# ================================================================ the run


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.lock = threading.RLock()
        self.jobs: dict[int, dict[str, Any]] = {}  # plan index -> {id, kind, plan answer, cancel, ...}
        self.hits: dict[str, list[Hit]] = {}
        self.faults: list[dict[str, Any]] = []
        self.targeted: set[str] = set()  # jobs a targeted fault chose already
        self.domains: list[str] = []

    def t(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def fault_done(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.faults.append(entry)
        state = "verified" if entry["verified"] else "NOT VERIFIED"
        log(f"fault {entry['fault']} at {entry['at']} s: {state}: {entry.get('summary', '')}")

    def hit(self, job_id: str, hit: Hit) -> None:
        with self.lock:
            self.hits.setdefault(job_id, []).append(hit)

    def job_by_id(self, job_id: str) -> dict[str, Any] | None:
        with self.lock:
            return next((j for j in self.jobs.values() if j.get("id") == job_id), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED", "1")))
    parser.add_argument("--short", action="store_true", help="one of each fault, a short submission phase")
    parser.add_argument(
        "--outage-seconds", type=float, default=None, help="API server outage (30; 15 with --short)"
    )
    parser.add_argument(
        "--settle-seconds", type=float, default=None, help="after the faults (420; 150 with --short)"
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--no-pod-watch", action="store_true", help="do not run manage.py supervise")
    parser.add_argument(
        "--kueue",
        choices=["auto", "on", "off"],
        default=os.environ.get("CHAOS_KUEUE", "auto"),
        help="the Kueue preemption wave (auto: on when Kueue runs on the plane: its CRDs and webhooks)",
    )
    parser.add_argument(
        "--kueue-priority-field",
        default="priority_class",
        help="the job body field naming a WorkloadPriorityClass; `labels` sets the raw label "
        "kueue.x-k8s.io/priority-class through the job's labels instead",
    )
    parser.add_argument("--kubeconfig", default=str(REPO / "var" / "cluster" / "admin.kubeconfig"))
    parser.add_argument("--report", default=None, help="default var/chaos/<run>/report.json")
    parser.add_argument(
        "--faults",
        type=lambda v: set(v.split(",")),
        default=None,
        help="only these faults (comma-separated names); the plan, and so every job, stays the seed's",
    )
    parser.add_argument(
        "--keep", action="store_true", help="leave the namespaces and the node for a post-mortem"
    )
    args = parser.parse_args(argv)
    args.outage_seconds = args.outage_seconds or (15.0 if args.short else 30.0)
    args.settle_seconds = args.settle_seconds or (150.0 if args.short else 420.0)

    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-seed{args.seed}-{os.getpid()}"
    run_dir = REPO / "var" / "chaos" / run_id
    run_dir.mkdir(parents=True)
    report_path = Path(args.report) if args.report else run_dir / "report.json"
    hexid = uuid.uuid4().hex[:6]
    kube = Kube(args.kubeconfig)
    kueue = args.kueue == "on" or (args.kueue == "auto" and kube.kueue_running())
    plan = make_plan(seed=args.seed, jobs=args.jobs, short=args.short, kueue=kueue)
    run = Run(args)
    log(
        f"run {run_id}: seed {args.seed}, {args.jobs} jobs, {len(plan.faults)} faults, "
        f"kueue wave {'on' if kueue else 'off'}; logs in {run_dir}"
    )

    cleanups: list[Callable[[], None]] = []  # undone in reverse order, whatever happens
    signal.signal(signal.SIGTERM, _terminated)
    try:
        # -- our own PostgreSQL and Redis on ports free right now
        scratch = Path(f"/var/tmp/dispatch-chaos-{run_id}")
        scratch.mkdir(parents=True)
        scratch.chmod(0o755)
        cleanups.append(lambda: shutil.rmtree(scratch, ignore_errors=True))
        pg = OwnPostgres(scratch / "pg", free_port())
        pg.init()
        pg_pids = [pg.start()]
        cleanups.append(pg.stop)
        pg.create_database()
        redis_server = OwnRedis(run_dir / "redis", free_port())
        redis_pids = [redis_server.start()]
        cleanups.append(redis_server.stop)
        ok, answered_by = redis_server.ping()
        if not ok or answered_by != str(redis_pids[0]):
            sys.exit(f"chaos: Redis on {redis_server.port} is not the one we started ({answered_by})")
        ok, data_dir = pg.answer()
        if not ok or Path(data_dir).resolve() != pg.data.resolve():
            sys.exit(f"chaos: PostgreSQL on {pg.port} is not the one we started ({data_dir})")

        # -- the proxy and dispatch's kubeconfig through it
        kubeconfig = yaml.safe_load(Path(args.kubeconfig).read_text())
        server = urlparse(kubeconfig["clusters"][0]["cluster"]["server"])
        proxy = Proxy((server.hostname or "127.0.0.1", server.port or 443))
        proxy.start()
        kubeconfig["clusters"][0]["cluster"]["server"] = f"https://{server.hostname}:{proxy.port}"
        proxied = run_dir / "proxied.kubeconfig"
        proxied.write_text(yaml.safe_dump(kubeconfig))
        from kubernetes import client as kclient
        from kubernetes import config as kconfig

        through_proxy = kclient.VersionApi(kconfig.new_client_from_config(config_file=str(proxied)))

        def proxy_answers() -> tuple[bool, str]:
            try:
                return True, str(through_proxy.get_code(_request_timeout=5).git_version)
            except Exception as exc:
                return False, repr(exc)[:200]

        database_url = f"postgres://dispatch:dispatch@127.0.0.1:{pg.port}/dispatch"
        web_port = free_port()
        env = os.environ | {
            "DATABASE_URL": database_url,
            "REDIS_URL": f"redis://127.0.0.1:{redis_server.port}/0",
            "KUBECONFIG": str(proxied),
            "KUBE_TIMEOUT_SECONDS": "5",
            "SUPERVISOR_INTERVAL_SECONDS": "5",
            "DJANGO_SETTINGS_MODULE": "dispatch_site.settings",
            "PYTHONUNBUFFERED": "1",
        }
        stack = Stack(env=env, run_dir=run_dir, web_port=web_port)
        cleanups.append(stack.stop)
        report: dict[str, Any] = {
            "run": run_id,
            "command": [sys.executable, *sys.argv] if argv is None else [sys.executable, __file__, *argv],
            "seed": args.seed,
            "short": args.short,
            "jobs_planned": args.jobs,
            "kueue_wave": kueue,
            "ports": {"postgres": pg.port, "redis": redis_server.port, "web": web_port, "proxy": proxy.port},
            "logs": str(run_dir),
        }

        # -- Django in this process: setup now, reconciliation at the end (direct kubeconfig: not the proxy)
        os.environ.update(
            {k: v for k, v in env.items() if k != "KUBECONFIG"} | {"KUBECONFIG": args.kubeconfig}
        )
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        from dispatch_site import roles
        from dispatch_site.services import user_create
        from jobs.models import TERMINAL_STATES, Execution, Job

        cleanups.append(connections.close_all)  # before PostgreSQL stops
        from runtimes.models import AllowListEntry, SiteSettings

        call_command("migrate", verbosity=0)
        namespace = f"chaos-{args.seed}-{hexid}"
        stranger_ns = f"{namespace}-stranger"
        kube.namespace(namespace)
        kube.namespace(stranger_ns)

        def namespaces_delete() -> None:
            if args.keep:
                log(f"kept namespaces {namespace} and {stranger_ns} (--keep)")
                return
            for ns in (namespace, stranger_ns):
                kube.core.delete_namespace(ns, propagation_policy="Background")

        cleanups.append(namespaces_delete)
        _, token = user_create(username=f"chaos-{hexid}", role=roles.USER, namespaces=[namespace])
        _, platform_token = user_create(
            username=f"chaos-platform-{hexid}", role=roles.PLATFORM, namespaces=[namespace]
        )
        AllowListEntry.objects.get_or_create(
            kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind", defaults={"for_jobs": True}
        )
        AllowListEntry.objects.filter(kind="ClusterTrainingRuntime", name="dispatch-kind").update(
            for_jobs=True
        )
        run.domains.append(SiteSettings.load().label_domain)
        connections.close_all()

        # -- the second KWOK node, the one the run loses
        main_nodes = [n.metadata.name for n in kube.core.list_node().items]
        lost_node = f"chaos-{hexid}-node"

        def node_delete() -> None:
            with contextlib.suppress(kube.client.ApiException):
                kube.core.delete_node(lost_node)

        cleanups.append(node_delete)
        kube.core.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": lost_node,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": lost_node,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "chaos-run": hexid,
                    },
                },
                "status": {
                    "allocatable": {
                        "cpu": "32",
                        "memory": "256Gi",
                        "pods": "250",
                        "nvidia.com/gpu": "8",
                        "ephemeral-storage": "1Ti",
                    },
                    "capacity": {
                        "cpu": "32",
                        "memory": "256Gi",
                        "pods": "250",
                        "nvidia.com/gpu": "8",
                        "ephemeral-storage": "1Ti",
                    },
                },
            }
        )
        for _ in range(300):
            node = kube.core.read_node(lost_node)
            ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
            if ready and not node.spec.taints:
                break
            time.sleep(0.2)
        else:
            log(f"node {lost_node} did not become Ready without taints")

        kueue_names = {
            "flavor": f"chaos-{hexid}",
            "cq": f"chaos-{hexid}",
            "lq": "chaos",
            "low": f"chaos-{hexid}-low",
            "high": f"chaos-{hexid}-high",
        }
        if kueue:
            cleanups.append(lambda: _kueue_teardown(kube, kueue_names))
            _kueue_setup(kube, namespace, kueue_names)

        # -- the identity observer, its own client, direct
        observer = IdentityObserver(args.kubeconfig).start()

        client = Client(f"http://127.0.0.1:{web_port}", run.started)
        stack.start(args.workers, pod_watch=not args.no_pod_watch)
        for _ in range(240):
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{client.base}/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        run.started = time.monotonic()
        client.started = run.started
        run_deadline = run.started + plan.submit_phase + args.outage_seconds + 600

        # ------------------------------------------------------------ jobs

        def submit(item: JobPlan, extra: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
            body = job_body(item, namespace, extra)
            entry: dict[str, Any] = {
                "index": item.index,
                "kind": item.kind,
                "policy_name": item.policy,
                "plan": asdict(item),
            }
            answer = client.call("POST", "/api/v1/plan", token, run_deadline, json=body)
            if answer is None or answer.status_code != 200:
                entry["error"] = (
                    f"plan answered {answer.status_code}: {answer.text[:300]}"
                    if answer is not None
                    else "plan: no answer"
                )
            else:
                planned = answer.json()
                entry["identity_warnings"] = planned.get("identity_warnings") or []
                entry["policy"] = planned.get("recovery_policy") or POLICIES[item.policy]
            key = f"chaos-{run_id}-{item.index}"
            response = client.call(
                "POST", "/api/v1/jobs", token, run_deadline, json=body, headers={"Idempotency-Key": key}
            )
            entry["submit_status"] = response.status_code if response is not None else None
            if response is not None and response.status_code == 202:
                entry["id"] = response.json()["id"]
                entry["accepted_at"] = run.t()
            elif response is not None:
                entry["error"] = f"submit answered {response.status_code}: {response.text[:300]}"
            with run.lock:
                run.jobs[item.index] = entry
            return entry if "id" in entry else None

        def cancel(entry: dict[str, Any]) -> None:
            outcome, unanswered = "unknown", False
            while time.monotonic() < run_deadline:
                response = client.once("POST", f"/api/v1/jobs/{entry['id']}/cancel", token)
                if response is None or response.status_code in (502, 503, 504):
                    unanswered = unanswered or response is None
                    time.sleep(1)
                    continue
                if response.status_code == 202:
                    outcome = "accepted"
                elif response.status_code == 409:
                    outcome = "unknown" if unanswered else "refused"
                entry["cancel_status"] = response.status_code
                break
            entry["cancel"] = outcome
            entry["cancel_at"] = run.t()

        def run_job(item: JobPlan) -> None:
            time.sleep(max(0.0, run.started + item.at - time.monotonic()))
            entry = submit(item)
            if entry is not None and item.cancel_after is not None:
                time.sleep(item.cancel_after)
                cancel(entry)

        # ------------------------------------------------------------ faults

        def running_rank_pods(indexes: Iterable[int], *, margin: float) -> list[dict[str, Any]]:
            """Running rank pods (of dispatch's Jobs, in the run's namespace) of the planned jobs `indexes`,
            with at least `margin` seconds of their run still ahead; sorted by job index and rank."""
            with run.lock:
                wanted = {run.jobs[i]["id"]: run.jobs[i] for i in indexes if run.jobs.get(i, {}).get("id")}
            found = []
            for pod in kube.pods(namespace):
                who = pod_identity(pod)
                job = wanted.get(who["job"] or "")
                if job is None or not who["job_controlled"] or who["deleting"] or who["phase"] != "Running":
                    continue
                duration = float(job["plan"]["duration"]) if job["kind"] != UNTIL_CANCELLED else 1e9
                if duration - _age_seconds(who["start"]) < margin:
                    continue
                found.append({**who, "index": job["index"]})
            return sorted(found, key=lambda p: (p["index"], str(p["rank"])))

        def wait_for_targets(indexes: Iterable[int], margin: float) -> list[dict[str, Any]]:
            """The targets' running rank pods, waiting for them as long as dispatch may take to start a job
            whose start message was lost with Redis (the stale sweep: up to 2 min), plus an API server
            outage."""
            deadline = time.monotonic() + 150 + args.outage_seconds
            while True:
                try:
                    found = running_rank_pods(indexes, margin=margin)
                except Exception as exc:  # our direct client: should not fail; say so if it does
                    log(f"listing pods failed: {exc!r}")
                    found = []
                if found or time.monotonic() > deadline:
                    return found
                time.sleep(1)

        def fault_kill_worker(f: FaultPlan, at: float) -> dict[str, Any]:
            with kill_lock:  # one kill at a time: each restarted worker is tracked, none leaks
                # The seed's worker, or the next one alive: a worker that died on its own is not killed again
                # (workers_exited_on_their_own counts it) but is started again, as a supervisor would.
                order = [(f.pick + n) % len(stack.workers) for n in range(len(stack.workers))]
                for dead in [i for i in order if stack.workers[i].poll() is not None]:
                    stack.start_worker(dead)
                index = order[0]
                victim = stack.workers[index]
                alive_before = victim.poll() is None
                stack.killed.add(victim.pid)
                victim.send_signal(signal.SIGKILL)
                code = victim.wait(30)
                time.sleep(1)
                new = stack.start_worker(index)
                time.sleep(3)
                alive = new.poll() is None
            verified = alive_before and code == -signal.SIGKILL and alive and new.pid != victim.pid
            return {
                "verified": verified,
                "summary": f"worker {index}: pid {victim.pid} exited {code}, new pid {new.pid} "
                f"{'running' if alive else 'NOT running'}",
                "evidence": {
                    "worker": index,
                    "old_pid": victim.pid,
                    "exit": code,
                    "new_pid": new.pid,
                    "new_running": alive,
                },
            }

        def fault_redis(f: FaultPlan, at: float) -> dict[str, Any]:
            before, pid_before = redis_server.ping()
            redis_server.stop()
            refused, error = redis_server.ping()
            time.sleep(5)
            new_pid = redis_server.start()
            redis_pids.append(new_pid)
            after, answered_by = redis_server.ping()
            verified = (
                before and not refused and after and answered_by == str(new_pid) and pid_before != answered_by
            )
            return {
                "verified": verified,
                "summary": f"PING answered by {pid_before}, then refused ({error[:60]}), "
                f"then answered by {answered_by} (started {new_pid})",
                "evidence": {
                    "pid_before": pid_before,
                    "down_error": error,
                    "pid_after": answered_by,
                    "started_pid": new_pid,
                },
            }

        def fault_postgres(f: FaultPlan, at: float) -> dict[str, Any]:
            old = pg.pid()
            before, _ = pg.answer()
            pg.stop()
            up, error = pg.answer()
            time.sleep(5)
            new = pg.start()
            pg_pids.append(new)
            after, directory = pg.answer()
            ours = after and Path(directory).resolve() == pg.data.resolve()
            verified = before and not up and ours and new != old
            return {
                "verified": verified,
                "summary": f"postmaster {old} stopped: connections refused ({error[:60]}); "
                f"postmaster {new} accepts ({'our data directory' if ours else directory})",
                "evidence": {
                    "postmaster_before": old,
                    "down_error": error,
                    "postmaster_after": new,
                    "data_directory": directory,
                },
            }

        def fault_api_server(f: FaultPlan, at: float) -> dict[str, Any]:
            before, version = proxy_answers()
            proxy.pause()
            refused, error = proxy.refuses()
            time.sleep(args.outage_seconds / 2)
            refused_later, _ = proxy.refuses()
            time.sleep(args.outage_seconds / 2)
            proxy.resume()
            after, _ = proxy_answers()
            verified = before and refused and refused_later and after
            return {
                "verified": verified,
                "summary": f"through the proxy: answered {before} ({version}), refused {refused} "
                f"({error[:50]}), answered again {after}; {args.outage_seconds:.0f} s",
                "evidence": {
                    "answered_before": before,
                    "refused": refused,
                    "still_refused_midway": refused_later,
                    "answered_after": after,
                    "seconds": args.outage_seconds,
                },
            }

        def fault_eviction(f: FaultPlan, at: float) -> dict[str, Any]:
            targets = wait_for_targets(f.targets, margin=5.0)
            if not targets:
                return {
                    "verified": False,
                    "summary": f"the target job {f.targets} had no running rank pod to evict",
                }
            pod = targets[f.pick % len(targets)]
            with run.lock:
                run.targeted.add(pod["job"])
            body = kube.client.V1Eviction(
                metadata=kube.client.V1ObjectMeta(name=pod["name"], namespace=namespace)
            )
            try:
                kube.core.create_namespaced_pod_eviction(pod["name"], namespace, body, _request_timeout=15)
                answer = "201"
            except kube.client.ApiException as exc:
                answer = f"{exc.status} {exc.reason}"
            gone = False
            for _ in range(60):
                current = kube.pod(namespace, pod["name"])
                if (
                    current is None
                    or (current.get("metadata") or {}).get("uid") != pod["uid"]
                    or (current.get("metadata") or {}).get("deletionTimestamp")
                ):
                    gone = True
                    break
                time.sleep(0.5)
            verified = answer == "201" and gone
            if verified:
                run.hit(
                    pod["job"], Hit("eviction", "evicted", int(pod["attempt"] or 0), run.t(), pod["name"])
                )
            return {
                "verified": verified,
                "summary": f"Eviction of {pod['name']} (job {pod['job']} attempt {pod['attempt']} "
                f"rank {pod['rank']}): {answer}, pod gone {gone}",
                "evidence": {
                    "pod": pod["name"],
                    "uid": pod["uid"],
                    "job": pod["job"],
                    "attempt": pod["attempt"],
                    "answer": answer,
                    "gone": gone,
                },
            }

        def fault_node_loss(f: FaultPlan, at: float) -> dict[str, Any]:
            wait_for_targets(f.targets, margin=10.0)  # the jobs submitted for it run (on either node)
            kube.core.patch_node(lost_node, {"spec": {"unschedulable": True}})
            time.sleep(3)  # nothing new lands there; what is there runs on
            deadline = time.monotonic() + 60
            while True:
                on_node = [pod_identity(p) for p in kube.pods(namespace, node=lost_node)]
                on_node = [
                    p
                    for p in on_node
                    if p["job_controlled"] and p["phase"] in ("Pending", "Running") and not p["deleting"]
                ]
                running = [
                    p
                    for p in on_node
                    if p["phase"] == "Running"
                    and (j := run.job_by_id(p["job"] or ""))
                    and j["kind"] in (LONG, UNTIL_CANCELLED)
                ]
                if running or time.monotonic() > deadline:
                    break
                kube.core.patch_node(
                    lost_node, {"spec": {"unschedulable": False}}
                )  # let pods land there, then again
                time.sleep(4)
                kube.core.patch_node(lost_node, {"spec": {"unschedulable": True}})
                time.sleep(5)
            if not running:
                kube.core.delete_node(lost_node)
                return {
                    "verified": False,
                    "summary": f"no running rank pod of a long or cancel-only job on {lost_node} "
                    "within 60 s; "
                    "node deleted anyway",
                }
            kube.core.delete_node(lost_node)
            deleted_at = run.t()
            node_gone = False
            for _ in range(60):
                try:
                    kube.core.read_node(lost_node, _request_timeout=5)
                except kube.client.ApiException as exc:
                    if exc.status == 404:
                        node_gone = True
                        break
                time.sleep(0.5)
            # PodGC removes the pods of a Node that no longer exists (after a 40 s quarantine). KWOK plays
            # them on meanwhile, so one may finish on its own first: a hit is a pod still unfinished when it
            # went (or failed by PodGC itself), and it takes effect when it is gone.
            last = {p["uid"]: p for p in on_node}
            gone_at: dict[str, float] = {}
            for _ in range(300):
                current = {q["metadata"]["uid"]: q for q in kube.pods(namespace, node=lost_node)}
                for uid in list(last):
                    if uid in gone_at:
                        continue
                    if uid in current:
                        pod = current[uid]
                        conditions = (pod.get("status") or {}).get("conditions") or []
                        target: dict[str, Any] = next(
                            (c for c in conditions if c.get("type") == "DisruptionTarget"), {}
                        )
                        last[uid] = {**pod_identity(pod), "disruption": target.get("reason")}
                    else:
                        gone_at[uid] = run.t()
                if len(gone_at) == len(last):
                    break
                time.sleep(1)
            left = [p for uid, p in last.items() if uid not in gone_at]
            hits = []
            for uid, p in last.items():
                job = run.job_by_id(p["job"] or "")
                if job is None or job["kind"] == APP_ERROR or uid not in gone_at:
                    continue  # an app-error job's failing rank exits 3 after 2 s, before the node went
                unfinished = p["phase"] in ("Pending", "Running") or p.get("disruption") == "DeletionByPodGC"
                if not unfinished:
                    continue
                hits.append(p)
                run.hit(
                    p["job"], Hit("node-loss", "node-lost", int(p["attempt"] or 0), gone_at[uid], p["name"])
                )
            verified = node_gone and not left
            return {
                "verified": verified,
                "summary": f"node {lost_node} deleted with {len(on_node)} pod(s) of "
                f"{len({p['job'] for p in on_node})} job(s) on it ({len(hits)} hits); node gone {node_gone}; "
                f"pods removed {not left} ({run.t() - deleted_at:.0f} s)",
                "evidence": {
                    "node": lost_node,
                    "pods": [
                        {k: p.get(k) for k in ("name", "job", "attempt", "rank", "phase", "disruption")}
                        for p in last.values()
                    ],
                    "hits": [p["name"] for p in hits],
                    "node_gone": node_gone,
                    "pods_left": [p["name"] for p in left],
                    "seconds_until_pods_gone": round(run.t() - deleted_at, 1),
                },
            }

        def fault_label_domain(f: FaultPlan, at: float) -> dict[str, Any]:
            new = f"chaos-{hexid}.example.com"
            before = client.call("GET", "/api/v1/settings", platform_token, run_deadline)
            old = (
                before.json().get("label_domain")
                if before is not None and before.status_code == 200
                else None
            )
            response = client.call(
                "PATCH", "/api/v1/settings", platform_token, run_deadline, json={"label_domain": new}
            )
            after = client.call("GET", "/api/v1/settings", platform_token, run_deadline)
            now_domain = (
                after.json().get("label_domain") if after is not None and after.status_code == 200 else None
            )
            verified = (
                response is not None and response.status_code == 200 and now_domain == new and old != new
            )
            if verified:
                with run.lock:
                    run.domains.append(new)
            return {
                "verified": verified,
                "summary": f"label domain {old} -> {now_domain} "
                f"(PATCH {response.status_code if response is not None else 'no answer'})",
                "evidence": {"old": old, "new": new, "read_back": now_domain},
            }

        def fault_foreign_pods(f: FaultPlan, at: float) -> dict[str, Any]:
            targets = wait_for_targets(f.targets, margin=8.0)
            if not targets:
                return {
                    "verified": False,
                    "summary": f"the target job {f.targets} had no running rank pod to copy",
                }
            real = targets[f.pick % len(targets)]
            with run.lock:
                run.targeted.add(real["job"])
            source = kube.pod(namespace, real["name"]) or {}
            meta = source.get("metadata") or {}
            # Labels as dispatch's rank pod has them, minus the Job controller's selector labels (the Job
            # controller would adopt an orphan matching its selector: that would be the Job's pod, not a
            # stranger's).
            labels = {
                k: v
                for k, v in (meta.get("labels") or {}).items()
                if "controller-uid" not in k and "job-name" not in k
            }
            annotations = {
                k: v
                for k, v in (meta.get("annotations") or {}).items()
                if k.startswith("batch.kubernetes.io/job-completion-index")
            }
            node_env = next(
                (
                    c.get("env") or []
                    for c in (source.get("spec") or {}).get("containers") or []
                    if c.get("name") == "node"
                ),
                [],
            )
            env = [e for e in node_env if str(e.get("name", "")).startswith("DISPATCH_") and "value" in e] + [
                {"name": "KWOK_STAY_RUNNING", "value": "1"}
            ]
            made, running = [], []
            for ns in (stranger_ns, namespace):
                name = f"forged-{real['name']}"[:63].rstrip("-.")
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
                    "spec": {
                        "nodeName": main_nodes[0],
                        "restartPolicy": "Never",
                        "containers": [{"name": "node", "image": "localhost/stranger:1", "env": env}],
                    },
                }
                try:
                    kube.core.create_namespaced_pod(ns, pod, _request_timeout=15)
                    made.append(f"{ns}/{name}")
                except kube.client.ApiException as exc:
                    log(f"foreign pod in {ns}: {exc.status} {exc.reason}")
                    continue
                for _ in range(40):
                    current = kube.pod(ns, name)
                    if current and (current.get("status") or {}).get("phase") == "Running":
                        running.append(f"{ns}/{name}")
                        break
                    time.sleep(0.5)
            verified = len(made) == 2 and len(running) == 2
            with run.lock:
                job = run.job_by_id(real["job"])
                if job is not None:
                    job.setdefault("foreign_pods", []).extend(running)
            return {
                "verified": verified,
                "summary": f"{len(running)} of 2 foreign pods Running with the labels of job {real['job']} "
                f"attempt {real['attempt']} rank {real['rank']}: {', '.join(running)}",
                "evidence": {
                    "job": real["job"],
                    "copied_from": real["name"],
                    "labels": labels,
                    "pods": made,
                    "running": running,
                },
            }

        def fault_kueue_wave(f: FaultPlan, at: float) -> dict[str, Any]:
            base = 10_000

            def priority(wpc: str) -> dict[str, Any]:
                if args.kueue_priority_field == "labels":  # the raw Kueue label, where the API allows it
                    return {"labels": {"kueue.x-k8s.io/priority-class": wpc}}
                return {args.kueue_priority_field: wpc}

            extra = lambda wpc: {  # noqa: E731
                "queue_name": kueue_names["lq"],
                **priority(wpc),
                "resources_per_node": {
                    "requests": {"nvidia.com/gpu": "1"},
                    "limits": {"nvidia.com/gpu": "1"},
                },
            }
            allowed = None
            if (
                args.kueue_priority_field != "labels"
            ):  # the platform allows the run's classes in its namespace
                answer = client.call(
                    "PATCH",
                    "/api/v1/settings",
                    platform_token,
                    run_deadline,
                    json={"kueue_priority_classes": {namespace: [kueue_names["low"], kueue_names["high"]]}},
                )
                allowed = answer.status_code if answer is not None else None
            lows = [
                JobPlan(index=base + i, kind=KUEUE_LOW, at=at, policy="retry", duration=plan.long_duration)
                for i in range(2)
            ]
            entries = [submit(item, extra(kueue_names["low"])) for item in lows]
            accepted = [e for e in entries if e is not None]
            if not accepted:
                errors = [run.jobs[i.index].get("error") for i in lows]
                return {
                    "verified": False,
                    "summary": f"low-priority jobs not accepted: {errors[0]} "
                    f"(priority classes PATCH: {allowed})",
                    "evidence": {"errors": errors, "priority_classes_patch": allowed},
                }
            low_ids = {e["id"] for e in accepted}
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                pods = [pod_identity(p) for p in kube.pods(namespace)]
                if any(p["job"] in low_ids and p["phase"] == "Running" and p["job_controlled"] for p in pods):
                    break
                time.sleep(1)
            else:
                return {"verified": False, "summary": "no low-priority job ran within 90 s"}
            # The low jobs' TrainJobs by name (a rank pod's JobSet is named after its TrainJob), read before
            # the wave: dispatch ends a preempted attempt within a second or so, deleting its TrainJob and so
            # its Workload, so the Workload is polled closely and its owner is not read back.
            trainjobs: dict[str, tuple[str, str]] = {}
            for raw in kube.pods(namespace):
                labels = raw["metadata"].get("labels") or {}
                identity = pod_identity(raw)
                if identity["job"] in low_ids and labels.get("jobset.sigs.k8s.io/jobset-name"):
                    trainjobs[labels["jobset.sigs.k8s.io/jobset-name"]] = (
                        identity["job"],
                        str(identity.get("attempt") or ""),
                    )
            high = JobPlan(index=base + 9, kind=KUEUE_HIGH, at=at, policy="retry", duration=3.0)
            high_entry = submit(high, extra(kueue_names["high"]))
            preempted: list[dict[str, Any]] = []
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not preempted:
                for wl in kube.custom.list_namespaced_custom_object(
                    "kueue.x-k8s.io", "v1beta2", namespace, "workloads", _request_timeout=10
                )["items"]:
                    conditions = {c["type"]: c for c in (wl.get("status") or {}).get("conditions") or []}
                    evicted = conditions.get("Evicted") or {}
                    if (evicted.get("status") == "True" and evicted.get("reason") == "Preempted") or (
                        conditions.get("Preempted") or {}
                    ).get("status") == "True":
                        owner = next(
                            (
                                o
                                for o in wl["metadata"].get("ownerReferences") or []
                                if o.get("kind") == "TrainJob"
                            ),
                            None,
                        )
                        if owner is None or owner["name"] not in trainjobs:
                            continue
                        job_id, attempt = trainjobs[owner["name"]]
                        preempted.append(
                            {
                                "workload": wl["metadata"]["name"],
                                "job": job_id,
                                "attempt": attempt,
                                "message": evicted.get("message", "")[:200],
                            }
                        )
                time.sleep(0.1)
            for p in preempted:
                run.hit(
                    p["job"], Hit("kueue-wave", "preempted", int(p["attempt"] or 0), run.t(), p["workload"])
                )
            verified = bool(preempted) and high_entry is not None
            return {
                "verified": verified,
                "summary": f"{len(accepted)} low, high {'accepted' if high_entry else 'NOT accepted'}; "
                f"{len(preempted)} low Workload(s) preempted",
                "evidence": {
                    "low": sorted(low_ids),
                    "high": high_entry.get("id") if high_entry else None,
                    "preempted": preempted,
                },
            }

        kill_lock = threading.Lock()
        faults: dict[str, Callable[[FaultPlan, float], dict[str, Any]]] = {
            "kill-worker": fault_kill_worker,
            "redis": fault_redis,
            "postgres": fault_postgres,
            "api-server": fault_api_server,
            "eviction": fault_eviction,
            "node-loss": fault_node_loss,
            "label-domain": fault_label_domain,
            "foreign-pods": fault_foreign_pods,
            "kueue-wave": fault_kueue_wave,
        }

        def run_fault(f: FaultPlan) -> None:
            time.sleep(max(0.0, run.started + f.at - time.monotonic()))
            at = run.t()
            try:
                result = faults[f.fault](f, at)
            except Exception as exc:
                result = {"verified": False, "summary": f"the fault raised {exc!r}"[:500]}
            run.fault_done({"fault": f.fault, "at": at, "planned_at": f.at, **result, "ended_at": run.t()})

        chosen_faults = [f for f in plan.faults if args.faults is None or f.fault in args.faults]
        fault_threads = [threading.Thread(target=run_fault, args=(f,), daemon=True) for f in chosen_faults]
        for thread in fault_threads:
            thread.start()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(run_job, plan.jobs))
        for thread in fault_threads:
            thread.join()
        faults_over = time.monotonic()
        accepted = {e["id"]: e for e in run.jobs.values() if e.get("id")}
        log(
            f"submissions and faults over after {faults_over - run.started:.0f} s; {len(accepted)} accepted; "
            "settling"
        )

        # -- settle: every accepted job terminal and no delete outstanding, or the settle time ran out
        def outstanding() -> tuple[int, int]:
            connections.close_all()
            try:
                active = Job.objects.filter(pk__in=list(accepted)).exclude(state__in=TERMINAL_STATES).count()
                deletes = Execution.objects.filter(
                    job_id__in=list(accepted),
                    delete_requested_at__isnull=False,
                    objects_removed_at__isnull=True,
                ).count()
            except Exception as exc:
                log(f"settle: database not answering: {exc}")
                return 1, 1
            return active, deletes

        while time.monotonic() < faults_over + args.settle_seconds:
            active, deletes = outstanding()
            if not active and not deletes:
                break
            time.sleep(5)
        settled = time.monotonic() - faults_over
        log(f"settled after {settled:.0f} s; reading every job through the API")

        # -- every job as the API shows it, and its pods as the API server lists them
        seen: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 120
        for job_id in accepted:
            response = client.call("GET", f"/api/v1/jobs/{job_id}", token, deadline)
            seen[job_id] = (
                response.json()
                if response is not None and response.status_code == 200
                else {"state": None, "message": "could not be read"}
            )

        def pods_by_job() -> dict[str, list[dict[str, Any]]]:
            grouped: dict[str, list[dict[str, Any]]] = {}
            for pod in kube.pods(namespace):
                who = pod_identity(pod)
                if who["job_controlled"] and who["job"]:
                    grouped.setdefault(who["job"], []).append(who)
            return grouped

        pods = pods_by_job()
        for _ in range(10):  # the garbage collector's last deletes
            if not any(accepted[j].get("cancel") == "accepted" and pods.get(j) for j in seen):
                break
            time.sleep(2)
            pods = pods_by_job()

        trainjobs: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs"
        )["items"]
        trainjobs_of: dict[str, list[dict[str, Any]]] = {}
        for tj in trainjobs:
            conditions = (tj.get("status") or {}).get("conditions") or []
            trainjobs_of.setdefault(tj["metadata"]["name"].rsplit("-", 1)[0], []).append(
                {
                    "name": tj["metadata"]["name"],
                    "deleting": bool(tj["metadata"].get("deletionTimestamp")),
                    "conditions": [f"{c.get('type')}={c.get('status')}" for c in conditions],
                    "labels": {
                        k: v
                        for k, v in (tj["metadata"].get("labels") or {}).items()
                        if k.endswith(DOMAIN_LABEL_SUFFIXES)
                    },
                }
            )
        results, mismatches = [], []
        for job_id, entry in accepted.items():
            alternatives = expected_outcomes(
                kind=entry["kind"],
                fail_rank=entry["plan"].get("fail_rank"),
                policy=entry.get("policy") or POLICIES[entry["policy_name"]],
                hits=run.hits.get(job_id, []),
                cancel=entry.get("cancel"),
                cancel_at=entry.get("cancel_at"),
            )
            left = [f"{p['name']} ({p['phase']})" for p in pods.get(job_id, [])]
            problems = judge_job(alternatives, seen[job_id], left)
            row = {
                "job": job_id,
                "index": entry["index"],
                "kind": entry["kind"],
                "policy": entry["policy_name"],
                "cancel": entry.get("cancel"),
                "hits": [asdict(h) for h in run.hits.get(job_id, [])],
                "foreign_pods": entry.get("foreign_pods", []),
                "expected": alternatives,
                "seen": {
                    k: seen[job_id].get(k)
                    for k in ("state", "cause", "message", "failing_rank", "exit_code", "current_attempt")
                },
                "seen_attempts": [
                    {k: e.get(k) for k in ("attempt", "state", "cause", "message")}
                    for e in seen[job_id].get("executions") or []
                ],
                "trainjobs_at_end": trainjobs_of.get(job_id, []),
                "ok": not problems,
                "problems": problems,
            }
            results.append(row)
            if problems:
                mismatches.append(
                    {
                        "job": job_id,
                        "kind": entry["kind"],
                        "expected": alternatives[0],
                        "seen": row["seen"],
                        "problems": problems,
                        "hits": row["hits"],
                        "foreign_pods": row["foreign_pods"],
                        "cancel": entry.get("cancel"),
                        "attempts": row["seen_attempts"],
                        "trainjobs_at_end": row["trainjobs_at_end"],
                        "timeline": [
                            {
                                k: e.get(k)
                                for k in (
                                    "at",
                                    "attempt",
                                    "kind",
                                    "from_state",
                                    "to_state",
                                    "cause",
                                    "message",
                                )
                            }
                            for e in (seen[job_id].get("timeline") or [])[-12:]
                        ],
                    }
                )
        running_after_end = {
            j: [
                f"{p['name']} ({p['phase']})" for p in pods.get(j, []) if p["phase"] in ("Pending", "Running")
            ]
            for j in accepted
            if seen[j].get("state") in TERMINAL
        }
        running_after_end = {j: v for j, v in running_after_end.items() if v}
        workers_exited = stack.workers_that_exited()

        # -- the identity observer's verdict (allowed: jobs whose plan answer carried an identity warning)
        observer.stop()
        allowed = sorted(e["id"] for e in accepted.values() if e.get("identity_warnings"))
        observed = observer.report(allowed_jobs=allowed, namespaces=[namespace])
        (run_dir / "observer.json").write_text(json.dumps(observed, indent=1, sort_keys=True))
        identity = observed["verdict"]

        # -- reconcile the database with the cluster
        connections.close_all()
        jobs = {j.pk: j for j in Job.objects.filter(pk__in=list(accepted))}
        executions = list(Execution.objects.filter(job_id__in=list(jobs)))
        per_key: Counter[tuple[str, str]] = Counter()
        orphans = []
        for tj in trainjobs:
            meta = tj["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            labels = meta.get("labels") or {}
            key = ("", "")
            for domain in run.domains:
                if f"{domain}/job" in labels:
                    key = (labels[f"{domain}/job"], labels.get(f"{domain}/attempt", ""))
            per_key[key] += 1
            conditions = (tj.get("status") or {}).get("conditions") or []
            finished = any(
                c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
            )
            job = jobs.get(key[0])
            behind = (
                job is not None and job.state not in TERMINAL_STATES and str(job.current_attempt) == key[1]
            )
            if not finished and not behind:
                orphans.append(meta["name"])
        submitted = {e.job_id for e in executions if e.submitted_at is not None}
        lost = [
            job_id
            for job_id in accepted
            if job_id not in jobs
            or (jobs[job_id].state in ("failed", "unknown") and not jobs[job_id].cause)
            or (job_id not in submitted and jobs[job_id].state not in ("cancelled", "refused", "failed"))
        ]
        stuck = [j.pk for j in jobs.values() if j.state not in TERMINAL_STATES]
        deadlocks = pg.log.read_text(errors="replace").count("deadlock detected") if pg.log.exists() else 0

        normal_accepted = sum(1 for e in accepted.values() if e["kind"] not in (KUEUE_LOW, KUEUE_HIGH))
        not_verified = [f for f in run.faults if not f["verified"]]
        planned_faults = Counter(f.fault for f in chosen_faults)
        done_faults = Counter(f["fault"] for f in run.faults)
        figures = {
            "jobs_accepted": figure(normal_accepted, args.jobs),
            "outcome_mismatches": figure(len(mismatches), 0),
            "identity_violations": figure(identity["counts"]["violations"], 0),
            "identity_anomalies": figure(identity["counts"]["anomalies"], 0),
            "observer_watch_gaps": figure(len(observed["watch"]["gaps"]), 0),
            "faults_not_verified": figure(
                len(not_verified) + sum((planned_faults - done_faults).values()), 0
            ),
            "unanswered_requests": figure(len(client.unanswered), 0),
            "server_errors_5xx": figure(len(client.server_errors), 0),
            "duplicate_trainjobs": figure(sum(n - 1 for n in per_key.values() if n > 1), 0),
            "orphaned_trainjobs": figure(len(orphans), 0),
            "lost_jobs": figure(len(lost), 0),
            "stuck_jobs": figure(len(stuck), 0),
            "terminal_jobs_with_running_pods": figure(len(running_after_end), 0),
            "workers_exited_on_their_own": figure(len(workers_exited), 0),
            "deadlocks": figure(deadlocks, 0),
        }
        ok = all(f["ok"] for f in figures.values())
        report |= {
            "ok": ok,
            "figures": figures,
            "jobs_accepted": normal_accepted,
            "jobs_accepted_with_kueue_wave": len(accepted),
            "states": dict(Counter(str(s.get("state")) for s in seen.values())),
            "causes": dict(Counter(str(s.get("cause")) for s in seen.values() if s.get("cause"))),
            "kinds": dict(Counter(e["kind"] for e in accepted.values())),
            "faults": sorted(run.faults, key=lambda f: f["at"]),
            "faults_planned": dict(planned_faults),
            "mismatches": mismatches,
            "identity": {
                "ok": identity["ok"],
                "counts": identity["counts"],
                "violations": identity["violations"][:50],
                "anomalies": identity["anomalies"][:50],
                "allowed_jobs": allowed,
                "watch": observed["watch"],
            },
            "requests": {
                "answers": {str(k): v for k, v in sorted(client.answers.items())},
                "named_503": client.named_503,
                "unanswered": client.unanswered,
                "unanswered_by_kind": dict(Counter(u["kind"] for u in client.unanswered)),
                "server_errors": client.server_errors[:50],
            },
            "settle_seconds": round(settled, 1),
            "domains": run.domains,
            "workers_exited": workers_exited,
            "postgres_pids": pg_pids,
            "redis_pids": redis_pids,
            "examples": {
                "orphans": orphans[:10],
                "lost": lost[:10],
                "stuck": stuck[:10],
                "running_after_end": dict(list(running_after_end.items())[:10]),
            },
            "not_submitted": [e for e in run.jobs.values() if not e.get("id")][:20],
            "jobs": results,
        }
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(report, indent=2, default=str))
        if report_path != run_dir / "report.json":
            (run_dir / "report.json").write_text(report_path.read_text())
        print_summary(report, report_path)

        return 0 if ok else 1
    finally:
        for undo in reversed(cleanups):
            try:
                undo()
            except Exception as exc:
                log(f"clean-up step {getattr(undo, '__name__', undo)!r} failed: {exc!r}")


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(f"chaos: signal {signum}: cleaning up")


def _kueue_setup(kube: Kube, namespace: str, names: Mapping[str, str]) -> None:
    """A ClusterQueue of this run's own with room for one 2-GPU job, a LocalQueue in the run's namespace, and
    two WorkloadPriorityClasses, so nothing is shared with other tests on the plane."""
    group, version = "kueue.x-k8s.io", "v1beta2"
    kube.custom.create_cluster_custom_object(
        group,
        version,
        "resourceflavors",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "ResourceFlavor",
            "metadata": {"name": names["flavor"]},
            "spec": {"nodeLabels": {"type": "kwok"}},
        },
    )
    kube.custom.create_cluster_custom_object(
        group,
        version,
        "clusterqueues",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "ClusterQueue",
            "metadata": {"name": names["cq"]},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "queueingStrategy": "BestEffortFIFO",
                "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Never"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": names["flavor"],
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "4"},
                                    {"name": "memory", "nominalQuota": "16Gi"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "2"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    for name, value in ((names["low"], 100), (names["high"], 1000)):
        kube.custom.create_cluster_custom_object(
            group,
            version,
            "workloadpriorityclasses",
            {
                "apiVersion": f"{group}/{version}",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    kube.custom.create_namespaced_custom_object(
        group,
        version,
        namespace,
        "localqueues",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "LocalQueue",
            "metadata": {"name": names["lq"], "namespace": namespace},
            "spec": {"clusterQueue": names["cq"]},
        },
    )


def _kueue_teardown(kube: Kube, names: Mapping[str, str]) -> None:
    group, version = "kueue.x-k8s.io", "v1beta2"
    for plural, name in (
        ("clusterqueues", names["cq"]),
        ("resourceflavors", names["flavor"]),
        ("workloadpriorityclasses", names["low"]),
        ("workloadpriorityclasses", names["high"]),
    ):
        with contextlib.suppress(Exception):
            kube.custom.delete_cluster_custom_object(group, version, plural, name)


def print_summary(report: Mapping[str, Any], path: Path) -> None:
    lines = [
        "",
        f"chaos run {report['run']} (seed {report['seed']}, {report['jobs_planned']} jobs"
        f"{', short' if report['short'] else ''})",
        "",
    ]
    lines.append(f"{'figure':36} {'target':>8} {'value':>8}")
    for name, f in report["figures"].items():
        lines.append(f"{name:36} {f['target']!s:>8} {f['value']!s:>8}  {'ok' if f['ok'] else 'MISS'}")
    lines += ["", "faults:"]
    for f in report["faults"]:
        lines.append(
            f"  {f['at']:>6} s {f['fault']:13} {'verified' if f['verified'] else 'NOT VERIFIED'}: "
            f"{f.get('summary', '')}"
        )
    if report["mismatches"]:
        lines += ["", f"outcome mismatches ({len(report['mismatches'])}):"]
        for m in report["mismatches"][:30]:
            lines.append(
                f"  {m['job']} ({m['kind']}): expected {m['expected']['state']}/"
                f"{m['expected'].get('cause') or '-'}; {'; '.join(m['problems'])}"
            )
    if report["identity"]["violations"]:
        lines += ["", "identity violations:"]
        for v in report["identity"]["violations"][:20]:
            lines.append(
                f"  {v['kind']}: job {v['job']} attempt {v['attempt']} rank {v['rank']} "
                f"({len(v['pods'])} pods)"
            )
    lines += [
        "",
        f"requests: {report['requests']['answers']}, named 503s {report['requests']['named_503']}, "
        f"unanswered {report['requests']['unanswered_by_kind']}",
        f"states: {report['states']}  causes: {report['causes']}",
        f"report: {path}",
        "ALL FIGURES AT TARGET" if report["ok"] else "FIGURES OFF TARGET",
        "",
    ]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
