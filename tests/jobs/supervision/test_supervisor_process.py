"""The `manage.py supervise` process (issue 21), on the real control plane.

- two supervisors at once (a rolling update): one transition, one retry, no tombstone lost;
- the beat's cycle leaves the work to a live supervisor;
- the supervisor outlives a database connection it loses, and tombstones the database did not take wait for
  the next cycle.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

from jobs.models import Execution, JobEvent, JobState, PodTombstone, SupervisorCycle
from jobs.supervision import cycle, tasks
from jobs.supervision.cache import CacheSource
from jobs.supervision.watch import ALIVE
from tests.jobs.supervision.support import _evict, _post, pods_of, supervisor_process, wait_job, watching
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster]


# ---------------------------------------------------------------- two supervisors (a rolling update)


@pytest.mark.django_db(transaction=True)
def test_two_supervisors_during_a_rollout_retry_once_and_keep_the_tombstone(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any
) -> None:
    """Two `manage.py supervise` at once, each with its own watches: rank 0 is evicted (it vanishes within
    a moment: its DisruptionTarget is the only evidence). One transition, one retry, one attempt 2, the cause
    read from the tombstone; then the old supervisor stops and the new one carries attempt 2 on."""
    runtime_on(None)
    token = submitter[1]
    policy = {"retry": {"evicted": 1}, "backoff_seconds": {"evicted": 0}}
    job_id = _post(token, namespace, {"KWOK_STAY_RUNNING": "1"}, recovery_policy=policy)
    with contextlib.ExitStack() as new:
        _, new_reports = new.enter_context(watching(interval=1))
        with watching(interval=1) as (_, old_reports):
            wait_job(job_id, lambda j: j.state == JobState.RUNNING, what="running")
            wait_for(
                lambda: old_reports.since(0) and new_reports.since(0), what="both supervisors ran cycles"
            )
            _evict(
                kube, namespace, sorted(pods_of(kube, namespace, job_id), key=lambda p: p.metadata.name)[0]
            )
            wait_job(job_id, lambda j: j.current_attempt == 2, what="attempt 2")
        # The old supervisor has stopped (the rollout's second half): the new one carries on alone.
        wait_job(
            job_id, lambda j: j.state == JobState.RUNNING and j.current_attempt == 2, what="attempt 2 runs"
        )
    first = Execution.objects.get(job_id=job_id, attempt=1)
    assert (first.state, first.cause) == ("failed", "evicted"), (first.cause, first.message)
    assert any("EvictionByEvictionAPI" in str(e["value"]) for e in first.evidence)
    timeline = JobEvent.objects.filter(job_id=job_id).order_by("at", "id")
    events = list(timeline.values_list("kind", "attempt", "from_state", "to_state"))
    assert events.count(("retry", 1, "failed", "pending")) == 1, events
    assert [e for e in events if e[0] == "attempt"] == [("attempt", 2, "", "")], events
    moves = [(a, f, t) for kind, a, f, t in events if kind == "transition"]
    assert len(moves) == len(set(moves)), moves
    assert Execution.objects.filter(job_id=job_id).count() == 2
    assert not first.tombstones.exists()


@pytest.mark.django_db
def test_the_beats_cycle_leaves_the_work_to_a_live_supervisor(monkeypatch: Any) -> None:
    called: list[bool] = []

    def supervise(**_: Any) -> cycle.CycleReport:
        called.append(True)
        return cycle.CycleReport()

    monkeypatch.setattr(cycle, "supervise", supervise)
    tasks.supervise()
    assert called == [True]
    from datetime import timedelta

    from django.utils import timezone

    until = timezone.now() + timedelta(seconds=30)
    SupervisorCycle.objects.create(name=ALIVE, lease_holder="h:1:2", lease_until=until)
    tasks.supervise()
    assert called == [True]


@pytest.mark.django_db(transaction=True)
def test_the_supervisor_outlives_a_database_connection_it_loses() -> None:
    """`manage.py supervise` lost its connection when PostgreSQL restarted (seen in a chaos run: its loop died
    on "terminating connection due to administrator command" and nothing restarted it; supervision fell back
    to the beat's slower cycle). Here PostgreSQL itself ends every other backend of the test database
    (pg_terminate_backend, what a fast shutdown does to each): the loop keeps saying it is alive."""
    from django.db import connection
    from django.utils import timezone

    def lease() -> Any:
        return SupervisorCycle.objects.filter(name=ALIVE).values_list("lease_until", flat=True).first()

    with supervisor_process(source=CacheSource(), interval=1) as stop:
        wait_for(lease, timeout=30, what="the supervisor to say it is alive")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            ended = [row[0] for row in cursor.fetchall()]
        assert ended and all(ended), f"no backend of the supervisor was ended: {ended}"
        after = timezone.now()
        wait_for(
            lambda: (until := lease()) is not None and until - timedelta(seconds=3) > after,
            timeout=30,
            what="the supervisor to renew its alive lease after losing its connection",
        )
        assert not stop.is_set()


@pytest.mark.django_db
def test_tombstones_the_database_did_not_take_wait_for_the_next_cycle(
    plain_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deleted pod's last state is kept as a tombstone, written at the next cycle; when the database does
    not take them (a restart: injected here, since PostgreSQL cannot refuse one chosen INSERT on demand),
    they stay for the cycle after instead of being dropped with the evidence they hold."""
    from django.db.utils import OperationalError

    from tests.jobs.dashboard.test_job_pages import make_job

    job = make_job(plain_user[0])
    execution = Execution.objects.get(job=job, attempt=1)
    source = CacheSource()
    pod = {"kind": "Pod", "metadata": {"uid": "u-1", "name": f"{job.id}-1-node-0-1-x"}}
    source._dead.append((execution.pk, pod))
    real = PodTombstone.objects.bulk_create

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("terminating connection due to administrator command (injected)")

    monkeypatch.setattr(PodTombstone.objects, "bulk_create", refused)
    with pytest.raises(OperationalError):
        source.flush()
    assert not PodTombstone.objects.exists()
    monkeypatch.setattr(PodTombstone.objects, "bulk_create", real)
    source.flush()
    assert list(PodTombstone.objects.values_list("execution_id", "pod_uid")) == [(execution.pk, "u-1")]


@pytest.mark.django_db(transaction=True)
def test_a_tombstone_written_while_its_execution_finishes_does_not_outlive_it(
    plain_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One supervisor writes an execution's final status while the other's watch writes the tombstone of one
    of its pods. No cycle reads a finished execution again, so a tombstone written after that status would
    stay forever (the rollout test above found one left under load). The tombstone write waits for the
    status write's row lock and then drops it; one written later still is dropped too. The status write is
    held open between its locks and its commit by a slowed step (a pause PostgreSQL cannot produce on
    demand), so the two really overlap."""
    import threading

    from django.db import connection

    from jobs.supervision import apply
    from jobs.supervision.status import DerivedStatus
    from tests.jobs.dashboard.test_job_pages import make_job

    job = make_job(plain_user[0])
    execution = Execution.objects.get(job=job, attempt=1)
    locked, release = threading.Event(), threading.Event()
    real = apply._finding_events

    def held(*args: Any, **kwargs: Any) -> Any:
        locked.set()  # the job's and the execution's rows are locked by now
        release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(apply, "_finding_events", held)
    written: list[apply.Applied] = []

    def finish() -> None:
        try:
            status = DerivedStatus(state=JobState.SUCCEEDED, message="every rank completed")
            written.append(apply.apply_status(execution_id=execution.pk, status=status, job_id=job.id))
        finally:
            connection.close()

    def flush(source: CacheSource) -> None:
        try:
            source.flush()
        finally:
            connection.close()

    status_write = threading.Thread(target=finish)
    status_write.start()
    assert locked.wait(10), "the status write never took its locks"
    source = CacheSource()
    source._dead.append((execution.pk, {"kind": "Pod", "metadata": {"uid": "u-1", "name": "p-1"}}))
    tombstone_write = threading.Thread(target=flush, args=(source,))
    tombstone_write.start()
    tombstone_write.join(0.5)
    assert tombstone_write.is_alive(), "the tombstone write did not wait for the execution's row"
    release.set()
    status_write.join(10)
    tombstone_write.join(10)
    assert written == [apply.Applied(changed=True, supervised=False)]  # succeeded: no longer supervised
    assert Execution.objects.get(pk=execution.pk).state == JobState.SUCCEEDED
    assert not PodTombstone.objects.exists()
    source._dead.append((execution.pk, {"kind": "Pod", "metadata": {"uid": "u-2", "name": "p-2"}}))
    source.flush()
    assert not PodTombstone.objects.exists()
