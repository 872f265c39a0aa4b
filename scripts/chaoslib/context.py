"""The run's shared state (jobs, hits, faults, label domains, guarded by one lock) and the context the jobs
and the faults act on: what they used to capture from main()."""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.chaoslib.api import Client
from scripts.chaoslib.common import log
from scripts.chaoslib.kube import Kube
from scripts.chaoslib.outcomes import Hit
from scripts.chaoslib.plan import RunPlan
from scripts.chaoslib.plane import Plane, Witness
from scripts.chaoslib.proxy import Proxy
from scripts.chaoslib.stack import OwnPostgres, OwnRedis, Stack
from scripts.identity_observer import IdentityObserver


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.lock = threading.RLock()
        self.jobs: dict[int, dict[str, Any]] = {}  # plan index -> {id, kind, plan answer, cancel, ...}
        self.hits: dict[str, list[Hit]] = {}
        # job id -> attempt -> the run's time until which dispatch may not know the attempt was created (a
        # worker was killed holding its start: outcomes.START_RECOVERY_SECONDS)
        self.unseen: dict[str, dict[int, float]] = {}
        # the Kueue wave's Workload watch and its jobs, kept until the run is judged (faults_kueue.wave_hits)
        self.workload_watch: tuple[Any, set[str]] | None = None
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

    def keep_workload_watch(self, watch: Any, jobs: set[str]) -> None:
        with self.lock:
            self.workload_watch = (watch, set(jobs))

    def start_held(self, job_id: str, attempt: int, until: float) -> None:
        """A killed worker held this attempt's start: dispatch may not know the attempt before `until`."""
        with self.lock:
            held = self.unseen.setdefault(job_id, {})
            held[attempt] = max(held.get(attempt, 0.0), until)

    def job_by_id(self, job_id: str) -> dict[str, Any] | None:
        with self.lock:
            return next((j for j in self.jobs.values() if j.get("id") == job_id), None)


@dataclass
class Context:
    """Everything a job or a fault needs, made once the stack answers (run.started: the load's start)."""

    args: argparse.Namespace
    run: Run
    plan: RunPlan
    run_id: str
    hexid: str
    kube: Kube  # the run's own client, through the witness API server (plane.Witness)
    plane: Plane  # the local control plane's processes (the kill-* faults)
    witness: Witness
    client: Client
    stack: Stack
    pg: OwnPostgres
    run_dir: Path
    pg_pids: list[int]  # every postmaster this run started
    redis_server: OwnRedis
    redis_pids: list[int]  # every Redis this run started
    proxy: Proxy
    through_proxy: Any  # a VersionApi whose kubeconfig names the proxy
    observer: IdentityObserver
    namespace: str
    stranger_ns: str
    token: str  # a user's, for the jobs
    platform_token: str  # a platform user's, for the settings
    run_deadline: float  # monotonic: no request is retried past it
    lost_node: str
    main_nodes: list[str]
    kueue_names: dict[str, str]
    kill_lock: threading.Lock = field(default_factory=threading.Lock)  # one worker kill at a time
