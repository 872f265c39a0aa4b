"""Helpers for supervision tests against the real control plane: the user's path (the API), supervision cycles
(the beat's code, or the `manage.py supervise` loop with its watches), and the cluster's own view."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.db import connection
from django.test import TestCase
from kubernetes import client

from jobs.models import Job, JobState
from jobs.supervision import cycle
from jobs.supervision.cache import CacheSource
from tests.support.dispatch import api_as, get_job, submit_job, wait_for
from tests.support.dispatch import (
    trainjob_exists as trainjob_exists,  # the supervision tests take it from here
)

REPO = Path(__file__).resolve().parents[3]

# The supervision tests import these from here.
api = api_as
get = get_job


def body(namespace: str, env: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "runtime": {"kind": "TrainingRuntime", "name": "team-runtime"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "env": env,
    } | extra


def submit(token: str, body: dict[str, Any], capture: Any) -> str:
    """POST /api/v1/jobs (202), and the job is queued."""
    job_id = submit_job(token, body, capture)
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED
    return job_id


def supervise_until(
    token: str,
    job_id: str,
    predicate: Callable[[dict[str, Any]], bool],
    *,
    timeout: float = 90,
    what: str = "",
) -> dict[str, Any]:
    """Run supervision cycles (the beat task's code) until the job, read through the API, satisfies
    `predicate`."""
    seen: list[dict[str, Any]] = []

    def check() -> dict[str, Any] | None:
        # What the cycle enqueues on commit (start attempt A+1, remove objects) runs, as a worker would.
        with TestCase.captureOnCommitCallbacks(execute=True):
            cycle.supervise()
        data = get(token, job_id)
        seen.append({k: data.get(k) for k in ("state", "cause", "message", "current_attempt")})
        return data if predicate(data) else None

    try:
        result: dict[str, Any] = wait_for(check, timeout=timeout, interval=0.5, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {seen[-3:]}") from None
    return result


def pods_of(kube: Any, namespace: str, job_id: str, attempt: int = 1) -> list[Any]:
    selector = f"dispatch.dev/job={job_id},dispatch.dev/attempt={attempt}"
    return list(kube.core.list_namespaced_pod(namespace, label_selector=selector).items)


def running_pods(kube: Any, namespace: str, job_id: str, count: int = 2, attempt: int = 1) -> list[Any]:
    def ready() -> list[Any] | None:
        pods = pods_of(kube, namespace, job_id, attempt)
        return pods if len(pods) == count and all(p.status.phase == "Running" for p in pods) else None

    result: list[Any] = wait_for(ready, timeout=60, what=f"{count} running pods of attempt {attempt}")
    return result


@contextlib.contextmanager
def supervisor_process(**options: Any) -> Iterator[threading.Event]:
    """The `manage.py supervise` loop (its watches and cycles) in a thread, on its own DB connection; yields
    the event that stops it. `options` go to run_forever (interval 2 s unless given)."""
    from jobs.supervision.watch import run_forever

    stop = threading.Event()
    options.setdefault("interval", 2)

    def run() -> None:
        try:
            run_forever(stop.is_set, **options)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=15)


def wait_job(job_id: str, predicate: Callable[[Job], bool], timeout: float = 90, what: str = "") -> Job:
    def check() -> Job | None:
        job = Job.objects.get(pk=job_id)
        return job if predicate(job) else None

    result: Job = wait_for(check, timeout=timeout, interval=0.25, what=what)
    return result


@contextlib.contextmanager
def paused(component: str) -> Iterator[None]:
    """SIGSTOP one component of this worktree's local control plane (scripts/cluster: its pid file), SIGCONT
    on the way out: a controller or KWOK that is slow for a moment, so a test can hold the cluster in the
    state between two of their steps and prove a cycle saw it."""
    state = Path(os.environ.get("DISPATCH_CLUSTER_STATE", REPO / "var" / "cluster"))
    pid = int((state / "pids" / f"{component}.pid").read_text().strip())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def transitions(data: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["from_state"], e["to_state"]) for e in data["timeline"] if e["kind"] == "transition"]


def _post(token: str, namespace: str, env: dict[str, str], **extra: Any) -> str:
    response = api(token).post("/api/v1/jobs", body(namespace, env, **extra), format="json")
    assert response.status_code == 202, response.json()
    job_id: str = response.json()["id"]
    return job_id


def _evict(kube: Any, namespace: str, pod: Any) -> None:
    kube.core.create_namespaced_pod_eviction(
        pod.metadata.name,
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.metadata.name, "namespace": namespace},
        },
    )


class Reports:
    """The cycle reports of a supervisor, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[cycle.CycleReport] = []

    def __call__(self, report: cycle.CycleReport) -> None:
        with self._lock:
            self.items.append(report)

    def since(self, count: int) -> list[cycle.CycleReport]:
        with self._lock:
            return [r for r in self.items[count:] if r.ran]

    def __len__(self) -> int:
        with self._lock:
            return len(self.items)


@contextlib.contextmanager
def watching(**options: Any) -> Iterator[tuple[CacheSource, Reports]]:
    source, reports = CacheSource(), Reports()
    try:
        with supervisor_process(source=source, on_cycle=reports, **options):
            yield source, reports
    finally:
        source.close()


def _exists(read: Callable[[], Any]) -> bool:
    try:
        read()
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _job_conditions(kube: Any, namespace: str, job_id: str) -> set[str]:
    jobs = kube.batch.list_namespaced_job(namespace, label_selector=f"dispatch.dev/job={job_id}").items
    return {c.type for j in jobs for c in (j.status.conditions or []) if c.status == "True"}
