"""Issue 18, supervision: the cycle's lease and the states it kept wrong (tombstones dropped while the beat
held the lease, an older observation written after a newer one, a long host name).

Each test takes the user's path (POST /api/v1/jobs, then supervision cycles: the beat's code, or the
`manage.py supervise` loop with its watches) on the real local control plane, and proves the interleaving it
is about happened by waiting on the state that shows it. Where KWOK must be held between two of its steps, the
test pauses that process of this worktree's control plane (support.paused).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from jobs.models import Execution, Job, JobEvent, JobState, SupervisorCycle
from jobs.supervision import cycle
from tests.jobs.supervision.support import (
    _exists,
    api,
    body,
    paused,
    pods_of,
    running_pods,
    supervisor_process,
    wait_job,
)
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster]


# ---------------------------------------------------------------- 10. tombstones while the beat has the lease


@pytest.mark.django_db(transaction=True)
def test_an_evicted_pod_that_vanished_while_the_beat_held_the_lease_reads_evicted(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any, monkeypatch: Any
) -> None:
    """The beat's cycle holds the lease (paused before its reads); the supervisor's watch sees rank 0
    evicted (DisruptionTarget EvictionByEvictionAPI) and vanish, and its own cycle skips. Before, that skip
    cleared the watch's tombstones, and the beat's cycle then found the pod gone without its condition:
    unknown-failure, never retried. Now the tombstone is kept (in the database) until a cycle that used it
    commits, whichever process runs it: the job reads evicted."""
    runtime_on(None)
    token = submitter[1]
    response = api(token).post(
        "/api/v1/jobs",
        body(namespace, {"KWOK_STAY_RUNNING": "1"}, recovery_policy={"retry": {"evicted": 0}}),
        format="json",
    )
    job_id = response.json()["id"]
    wait_for(
        lambda: cycle.supervise() and Job.objects.get(pk=job_id).state == JobState.RUNNING,
        timeout=60,
        what="running",
    )
    victim = sorted(pods_of(kube, namespace, job_id), key=lambda p: p.metadata.name)[0]

    # The beat's cycle: it takes the lease, then pauses before it reads the cluster.
    beat_reading = threading.Event()
    release_beat = threading.Event()
    real_supervise = cycle.supervise
    attempts: list[tuple[float, bool]] = []
    beat_thread_id: list[int] = []

    def beat() -> None:
        beat_thread_id.append(threading.get_ident())
        try:
            real_supervise(name="supervisor")
        finally:
            connection.close()

    def paused_at_reads(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if beat_thread_id and threading.get_ident() == beat_thread_id[0]:
                beat_reading.set()
                assert release_beat.wait(120), "the beat was never released"
            return original(*args, **kwargs)

        return wrapper

    # Pause point: the beat's first read of the cluster (the start_due_retries call precedes it; the lease
    # is already taken then).
    monkeypatch.setattr(cycle, "start_due_retries", paused_at_reads(cycle.start_due_retries))

    def spy(*args: Any, **kwargs: Any) -> Any:
        report = real_supervise(*args, **kwargs)
        attempts.append((time.monotonic(), bool(report.ran)))
        return report

    beat_thread = threading.Thread(target=beat)
    beat_thread.start()
    try:
        assert beat_reading.wait(30), "the beat's cycle did not start"
        lease = SupervisorCycle.objects.get(name="supervisor")
        assert lease.lease_holder.endswith(f":{beat_thread_id[0]}")
        monkeypatch.setattr(cycle, "supervise", spy)
        with supervisor_process():
            # The supervisor watches (its informers list the job's namespace) before the eviction.
            wait_for(lambda: attempts, timeout=30, what="the supervisor's first attempt")
            kube.core.create_namespaced_pod_eviction(
                victim.metadata.name,
                namespace,
                {
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": victim.metadata.name, "namespace": namespace},
                },
            )
            gone_at: list[float] = []

            def vanished() -> bool:
                if not gone_at and not _exists(
                    lambda: kube.core.read_namespaced_pod(victim.metadata.name, namespace)
                ):
                    gone_at.append(time.monotonic())
                return bool(gone_at)

            wait_for(vanished, timeout=30, what="the evicted pod gone")
            # The supervisor tried a cycle after the pod vanished, and skipped: the beat holds the lease.
            wait_for(
                lambda: any(at > gone_at[0] and not ran for at, ran in attempts),
                timeout=30,
                what="a skipped supervisor cycle after the pod vanished",
            )
            release_beat.set()
            beat_thread.join(timeout=60)
            job = wait_job(job_id, lambda j: j.state == JobState.FAILED, what="failed")
    finally:
        release_beat.set()
        beat_thread.join(timeout=60)
    execution = Execution.objects.get(job_id=job_id, attempt=1)
    assert (job.cause, execution.cause) == ("evicted", "evicted"), (job.cause, job.message, job.evidence)
    assert any("EvictionByEvictionAPI" in str(e["value"]) for e in execution.evidence)


# ---------------------------------------------------------------- 11. lease, staleness, host names


@pytest.mark.django_db(transaction=True)
def test_a_long_cycle_renews_its_lease_so_a_second_cycle_cannot_start(
    settings: Any, monkeypatch: Any
) -> None:
    """A cycle that runs longer than its lease (1.5 s here): before, the lease was taken once and ran out,
    so a second cycle started beside the first. Now a thread renews it while the cycle runs."""
    settings.SUPERVISOR_LEASE_SECONDS = 1.5
    entered, release = threading.Event(), threading.Event()

    def long_step() -> int:
        entered.set()
        assert release.wait(60)
        return 0

    monkeypatch.setattr(cycle, "start_due_retries", long_step)
    reports: list[Any] = []

    def first() -> None:
        try:
            reports.append(cycle.supervise(name="t-lease"))
        finally:
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert entered.wait(30)
        taken = SupervisorCycle.objects.get(name="t-lease")
        original_until = taken.lease_until
        assert original_until is not None
        # Proof the lease would have run out: its first expiry is past, and it was renewed meanwhile.
        wait_for(
            lambda: (
                datetime.now(UTC) > original_until
                and (SupervisorCycle.objects.get(name="t-lease").lease_until or original_until)
                > original_until
            ),
            timeout=30,
            what="the first expiry passed and the lease renewed",
        )
        second = cycle.supervise(name="t-lease")
        assert not second.ran
    finally:
        release.set()
        thread.join(timeout=30)
    assert reports and reports[0].ran


@pytest.mark.django_db
def test_a_host_name_of_100_characters_holds_the_lease(monkeypatch: Any) -> None:
    """lease_holder was varchar(64): on PostgreSQL every cycle on such a host raised a DataError."""
    host = "h" * 100
    monkeypatch.setattr("socket.gethostname", lambda: host)
    report = cycle.supervise(name="t-host")
    assert report.ran
    assert connection.vendor == "postgresql"


@pytest.mark.django_db(transaction=True)
def test_an_older_observation_written_after_a_newer_one_is_refused(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any, monkeypatch: Any
) -> None:
    """Cycle X reads the cluster while the job's pods cannot run yet (KWOK held), and pauses before it
    writes; cycle Y (another supervisor) reads after the pods run and writes `running`. Before, X then wrote
    its older `queued` over it (running -> queued, and the pod memory went back). Now X's observation is
    older than the one written, and is refused."""
    runtime_on(None)
    token = submitter[1]
    real_apply = cycle.apply_status
    x_waiting, release_x = threading.Event(), threading.Event()
    x_ident: list[int] = []
    x_saw: list[str] = []

    def apply(*args: Any, **kwargs: Any) -> Any:
        if x_ident and threading.get_ident() == x_ident[0] and not release_x.is_set():
            x_saw.append(kwargs["status"].state)
            x_waiting.set()
            assert release_x.wait(60)
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(cycle, "apply_status", apply)

    def x() -> None:
        x_ident.append(threading.get_ident())
        try:
            cycle.supervise(name="x")
        finally:
            connection.close()

    thread = threading.Thread(target=x)
    try:
        with paused("kwok"):
            response = api(token).post(
                "/api/v1/jobs", body(namespace, {"KWOK_STAY_RUNNING": "1"}), format="json"
            )
            job_id = response.json()["id"]
            thread.start()
            assert x_waiting.wait(30), "cycle X never reached its write"
        assert x_saw == ["queued"]
        running_pods(kube, namespace, job_id)
        wait_for(
            lambda: cycle.supervise(name="y") and Job.objects.get(pk=job_id).state == JobState.RUNNING,
            timeout=60,
            what="Y wrote running",
        )
        memory = dict(Execution.objects.get(job_id=job_id, attempt=1).pods_seen)
    finally:
        release_x.set()
        thread.join(timeout=30)
    job = Job.objects.get(pk=job_id)
    execution = Execution.objects.get(job_id=job_id, attempt=1)
    assert job.state == JobState.RUNNING, job.message
    events = JobEvent.objects.filter(job_id=job_id, kind="transition")
    moves = list(events.values_list("from_state", "to_state"))
    assert ("running", "queued") not in moves, moves
    assert set(memory) <= set(execution.pods_seen)
    assert all(execution.pods_seen[uid]["phase"] == "Running" for uid in memory)
