"""Issue 32, supervision: a pod's tombstones and the order of two supervisors' observations, on the real
control plane (the API server with the Trainer, JobSet and Job controllers; KWOK plays the kubelet) and real
PostgreSQL.

- Two deliveries of one pod's deletion, the stale one first (the informer's periodic re-list reports the pod
  in its last state seen while the watch, lagging, has not yet delivered the eviction), keep the one with the
  DisruptionTarget: the attempt reads `evicted`, not `unknown-failure` (never retried).
- A tombstone written by another supervisor after a cycle read the tombstones is not deleted by that cycle's
  commit, the cycle's final status (derived without it) is refused, and the execution is derived again on
  the next cycle, with it: `evicted`.
- Observations are ordered by the database's clock: a supervisor whose host clock runs an hour ahead does
  not have the next supervisor's newer observations refused.

The lagging watch is a fault injected into the informer (its watch thread holds the events it receives until
the test lets them through: a real stream cannot be made late on demand); the skewed host clock is a fake
clock, used only to inject the skew. Everything else is the supervisor's own code: its informers, the
tombstones it writes, its cycles and their writes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase
from django.utils import timezone

from cluster import gateway
from cluster.informer import Informer
from jobs.models import Execution, Job, JobState
from jobs.supervision import cycle
from jobs.supervision.cache import CacheSource
from tests.jobs.supervision.support import _evict, _post, pods_of, running_pods
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster]

DOMAIN = "dispatch.dev"
SUPERVISED = (JobState.PENDING, JobState.QUEUED, JobState.RUNNING, JobState.UNKNOWN)


class _HeldPods(Informer):
    """A pod informer whose watch can lag: while `holding` is set, its watch thread keeps each event it
    receives (in order) until the hold is released, as a stream that delivers late would."""

    def __init__(self, *args: Any, holding: threading.Event, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._holding = holding

    def _apply(self, kind: str, raw: dict[str, Any]) -> Any:
        while self._holding.is_set() and not self._stop.is_set():
            time.sleep(0.05)
        return super()._apply(kind, raw)


class LaggingPods:
    """The informer factory of one supervisor (CacheSource(informer=...)): its pod watches can lag, and every
    pod it reports deleted is recorded, in order (the deliveries its tombstones are written from)."""

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.informers: list[Informer] = []
        self.deliveries: list[dict[str, Any]] = []

    def __call__(self, resource: Any, namespace: str, **kwargs: Any) -> Informer:
        if resource != gateway.PODS:
            return Informer(resource, namespace, **kwargs)
        on_delete = kwargs.pop("on_delete")

        def recorded(pod: dict[str, Any]) -> None:
            self.deliveries.append(pod)
            on_delete(pod)

        informer = _HeldPods(resource, namespace, holding=self.holding, on_delete=recorded, **kwargs)
        self.informers.append(informer)
        return informer

    def relist(self) -> None:
        """The informers' periodic re-list, now (it runs beside the watch: a held watch does not stop it)."""
        for informer in self.informers:
            informer._relist()


def _disrupted(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "DisruptionTarget" for c in (pod.get("status") or {}).get("conditions") or [])


def run_cycle(source: CacheSource, name: str) -> cycle.CycleReport:
    """What `manage.py supervise` does each period: prepare the cache, then one cycle (what it enqueues on
    commit runs, as a worker would)."""
    source.prepare()
    with TestCase.captureOnCommitCallbacks(execute=True):
        return cycle.supervise(name=name, source=source)


def cycle_until(
    source: CacheSource, name: str, check: Callable[[], bool], what: str, timeout: float = 60
) -> None:
    wait_for(lambda: run_cycle(source, name) and check(), timeout=timeout, interval=0.3, what=what)


def _state(job_id: str) -> str:
    return str(Job.objects.get(pk=job_id).state)


def _attempt(job_id: str) -> Execution:
    return Execution.objects.get(job_id=job_id, attempt=1)


@contextmanager
def sources(*factories: LaggingPods | None) -> Iterator[list[CacheSource]]:
    made = [CacheSource(informer=f) if f is not None else CacheSource() for f in factories]
    try:
        yield made
    finally:
        for source in made:
            source.close()


def _both_running_in(source: CacheSource, job_id: str) -> bool:
    pods = source.labelled("Pod", DOMAIN, job_id, 1)
    return len(pods) == 2 and all((p.get("status") or {}).get("phase") == "Running" for p in pods)


def _trainjob_failed_in(source: CacheSource, job_id: str) -> bool:
    return any(
        c.get("type") == "Failed" and c.get("status") == "True"
        for tj in source.labelled("TrainJob", DOMAIN, job_id, 1)
        for c in (tj.get("status") or {}).get("conditions") or []
    )


def _evict_rank_0_behind_a_lagging_watch(kube: Any, namespace: str, job_id: str, lag: LaggingPods) -> Any:
    """Rank 0 is evicted (the Eviction API) and its pod goes while the supervisor's pod watch lags; the
    periodic re-list then finds it gone and reports it deleted in its last state seen (Running, no
    DisruptionTarget). The watch is still held when this returns."""
    victim = sorted(running_pods(kube, namespace, job_id), key=lambda p: p.metadata.name)[0]
    lag.holding.set()
    _evict(kube, namespace, victim)
    wait_for(
        lambda: victim.metadata.uid not in {p.metadata.uid for p in pods_of(kube, namespace, job_id)},
        timeout=60,
        what="the evicted pod gone",
    )
    lag.relist()
    stale = [p for p in lag.deliveries if p["metadata"]["uid"] == victim.metadata.uid]
    assert len(stale) == 1 and not _disrupted(stale[0]), stale  # the stale delivery came first
    return victim


def _release_the_watch(lag: LaggingPods, victim: Any) -> None:
    lag.holding.clear()
    wait_for(
        lambda: any(p["metadata"]["uid"] == victim.metadata.uid and _disrupted(p) for p in lag.deliveries),
        timeout=30,
        what="the watch's delivery of the deletion, with the DisruptionTarget",
    )


def _assert_evicted(job_id: str, victim: Any) -> None:
    execution = _attempt(job_id)
    assert (execution.state, execution.cause) == ("failed", "evicted"), (
        execution.message,
        execution.evidence,
    )
    assert Job.objects.get(pk=job_id).cause == "evicted"
    assert execution.rank == int(victim.metadata.labels["batch.kubernetes.io/job-completion-index"])
    assert any("EvictionByEvictionAPI" in str(e["value"]) for e in execution.evidence)


# ---------------------------------------------------------------- tombstones


@pytest.mark.django_db(transaction=True)
def test_a_stale_deletion_delivered_first_does_not_hide_the_evictions_disruption_target(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any
) -> None:
    """The supervisor's pod watch lags while rank 0 is evicted and its pod goes; the periodic re-list
    reports the pod deleted as it last saw it (Running, no DisruptionTarget), then the watch delivers the
    deletion with the DisruptionTarget. Both are written as the pod's tombstone before the next cycle.
    Before, the first one written was kept (the second was a conflict, ignored) and the attempt read
    `unknown-failure`, never retried. The one with the DisruptionTarget is kept: `evicted`."""
    runtime_on(None)
    job_id = _post(
        submitter[1], namespace, {"KWOK_STAY_RUNNING": "1"}, recovery_policy={"retry": {"evicted": 0}}
    )
    lag = LaggingPods()
    with sources(lag) as (source,):
        cycle_until(source, "t", lambda: _state(job_id) == JobState.RUNNING, "running")
        wait_for(lambda: _both_running_in(source, job_id), timeout=30, what="both ranks Running in the copy")
        victim = _evict_rank_0_behind_a_lagging_watch(kube, namespace, job_id, lag)
        _release_the_watch(lag, victim)
        cycle_until(source, "t", lambda: _attempt(job_id).state not in SUPERVISED, "attempt 1 judged")
    _assert_evicted(job_id, victim)


@pytest.mark.django_db(transaction=True)
def test_a_tombstone_written_after_a_cycle_read_them_is_neither_deleted_nor_missed(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two supervisors. A's pod watch lags (for the rest of the test): its re-list reports the evicted rank
    gone as it last saw it (Running, no DisruptionTarget). A's cycle writes that tombstone, reads it, derives
    the attempt failed (nothing explains why), and is held before its write; meanwhile B, whose watch saw the
    eviction, writes the pod's tombstone with the DisruptionTarget. Before, A's commit wrote its final
    status and deleted every tombstone of the execution, B's too: `unknown-failure`, never retried. Now A's
    final status is refused (it missed a tombstone), B's tombstone stays, and A derives the execution again
    on its next cycle, though its own watch never shows it anything new: `evicted`."""
    runtime_on(None)
    job_id = _post(
        submitter[1], namespace, {"KWOK_STAY_RUNNING": "1"}, recovery_policy={"retry": {"evicted": 0}}
    )
    lag, b_pods = LaggingPods(), LaggingPods()
    real_apply = cycle.apply_status
    a_thread: list[int] = []
    a_writing, release_a = threading.Event(), threading.Event()
    a_wrote: list[Any] = []

    def apply(*args: Any, **kwargs: Any) -> Any:
        if a_thread and threading.get_ident() == a_thread[0] and not release_a.is_set():
            a_wrote.append(kwargs["status"].state)
            a_writing.set()
            assert release_a.wait(60), "A was never released"
        result = real_apply(*args, **kwargs)
        if a_thread and threading.get_ident() == a_thread[0]:
            a_wrote.append(result)
        return result

    monkeypatch.setattr(cycle, "apply_status", apply)
    with sources(lag, b_pods) as (a, b):
        cycle_until(a, "a", lambda: _state(job_id) == JobState.RUNNING, "running")
        b.prepare()  # B follows the job too (its watches list the namespace)
        wait_for(
            lambda: _both_running_in(a, job_id) and _both_running_in(b, job_id),
            timeout=30,
            what="both ranks Running in each copy",
        )
        victim = _evict_rank_0_behind_a_lagging_watch(kube, namespace, job_id, lag)
        wait_for(
            lambda: any(
                p["metadata"]["uid"] == victim.metadata.uid and _disrupted(p) for p in b_pods.deliveries
            ),
            timeout=30,
            what="B's watch delivering the deletion with the DisruptionTarget",
        )
        wait_for(lambda: _trainjob_failed_in(a, job_id), timeout=60, what="the TrainJob failed in A's copy")

        def a_cycle() -> None:
            a_thread.append(threading.get_ident())
            try:
                run_cycle(a, "a")
            finally:
                connection.close()

        thread = threading.Thread(target=a_cycle)
        thread.start()
        try:
            assert a_writing.wait(60), "A's cycle never reached its write"
            assert a_wrote == [JobState.FAILED]  # A derived a final status from the stale tombstone
            b.flush()  # B's tombstone, after A read them (what B's prepare does whichever holds the lease)
        finally:
            release_a.set()
            thread.join(60)
        assert _attempt(job_id).state == JobState.RUNNING, _attempt(job_id).cause
        cycle_until(a, "a", lambda: _attempt(job_id).state not in SUPERVISED, "attempt 1 judged", timeout=30)
        assert not any(p["metadata"]["uid"] == victim.metadata.uid and _disrupted(p) for p in lag.deliveries)
    _assert_evicted(job_id, victim)


# ---------------------------------------------------------------- two supervisors, two host clocks


@pytest.mark.django_db(transaction=True)
def test_a_supervisor_whose_host_clock_runs_ahead_does_not_hold_back_the_next_ones_newer_observations(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Supervisor B, on a host whose clock is an hour ahead (a fake clock: the only way to skew one host's
    clock in a test), follows the job to `running`; then A, on a host with the right time, supervises (B's
    host is gone). A rank is evicted. Before, observations were timed by each host's clock: every one of A's
    was "older" than B's last write and refused, and the job read `running` for an hour. They are timed by
    the database's clock now: A's newer observation is written, `evicted`."""
    runtime_on(None)
    job_id = _post(
        submitter[1], namespace, {"KWOK_STAY_RUNNING": "1"}, recovery_policy={"retry": {"evicted": 0}}
    )
    real_now = timezone.now
    ahead = threading.Event()
    monkeypatch.setattr(
        timezone, "now", lambda: real_now() + (timedelta(hours=1) if ahead.is_set() else timedelta())
    )
    with sources(None, None) as (a, b):
        ahead.set()
        try:
            cycle_until(b, "b", lambda: _state(job_id) == JobState.RUNNING, "B wrote running")
        finally:
            ahead.clear()
        a.prepare()
        wait_for(lambda: _both_running_in(a, job_id), timeout=30, what="both ranks Running in A's copy")
        victim = sorted(running_pods(kube, namespace, job_id), key=lambda p: p.metadata.name)[0]
        _evict(kube, namespace, victim)
        cycle_until(
            a, "a", lambda: _attempt(job_id).state not in SUPERVISED, "A judged attempt 1", timeout=60
        )
    _assert_evicted(job_id, victim)
