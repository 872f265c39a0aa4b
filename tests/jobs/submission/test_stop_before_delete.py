"""Stop before delete, on every path (issue 32), against the real control plane: the Trainer v2.3.0 rebuilds
the JobSet of a TrainJob it still holds when the JobSet goes (status-facts §12), so dispatch deletes a
TrainJob only once it is stopped (spec.suspend, and the Trainer's Suspended condition), or a fallback after
the cluster first accepted the stop.

What the cluster did is read from the test's own watches (tests.support.kueue.Recorder: every TrainJob
write, the DELETED event keeping the object's last state) and from the identity observer
(scripts/identity_observer.py: no rank ran twice), never from dispatch's records. Kueue runs for this
module (fixture `kueue`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from celery.exceptions import Retry
from django.contrib.auth.models import User
from django.test import TestCase
from django.utils import timezone

from jobs.models import Execution, Job
from jobs.submission import sweeps
from jobs.supervision import cycle
from scripts.identity_observer import IdentityObserver
from tests.jobs.supervision.support import supervise_until
from tests.support.cluster import Kube, KueueQueue
from tests.support.dispatch import api_as, get_job, job_body, submit_job, wait_for
from tests.support.kueue import Recorder

pytestmark = [pytest.mark.cluster, pytest.mark.django_db, pytest.mark.usefixtures("dispatch_kind_allowed")]

# Rank 1 exits 3 after a second; rank 0 keeps running until its attempt is stopped (a healthy rank).
FAILING = {"KWOK_EXIT_CODE": "3", "KWOK_FAIL_RANK": "1", "KWOK_RUN_DURATION": "1s"}
RETRY_ONCE = {"retry": {"app-error": 1}, "backoff_seconds": {"app-error": 0}, "budgets": {"user": 1}}
NO_RETRY = {"retry": {"app-error": 0}}


def _unsuspended_deletes(
    recorder: Recorder, prefix: str, *, shown: bool = False
) -> tuple[list[str], list[str]]:
    """(every TrainJob named `<prefix>...` the watch saw deleted, those among them that were deleted with
    spec.suspend not true, or with `shown` without the Trainer's Suspended condition too): a TrainJob has
    no finalizer, so its DELETED event carries its state at the delete; a deletionTimestamp seen before (a
    finalizer someone added) counts as the delete too."""
    deleted: list[str] = []
    unsuspended: list[str] = []
    for seen in recorder.of("TrainJob"):
        meta = seen.obj.get("metadata") or {}
        if not str(meta.get("name", "")).startswith(prefix):
            continue
        if seen.type != "DELETED" and not meta.get("deletionTimestamp"):
            continue
        name = str(meta["name"])
        if name in deleted:
            continue
        deleted.append(name)
        conditions = (seen.obj.get("status") or {}).get("conditions") or []
        suspended = any(c.get("type") == "Suspended" and c.get("status") == "True" for c in conditions)
        if (seen.obj.get("spec") or {}).get("suspend") is not True or (shown and not suspended):
            unsuspended.append(name)
    return sorted(deleted), sorted(unsuspended)


def _queue_body(queue: KueueQueue, **extra: Any) -> dict[str, Any]:
    """A job in `queue` asking only dispatch-kind's own requests (no GPU): every job fits the ClusterQueue
    at once."""
    return job_body(queue.namespace, queue_name=queue.name) | extra


def test_under_kueue_every_failed_attempt_is_suspended_before_its_delete_and_no_rank_runs_twice(
    kube: Kube,
    kubeconfig: str,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """8 jobs on a Kueue LocalQueue fail (rank 1 exits 3; rank 0 would run on) and each is retried once:
    16 failed attempts. A failed TrainJob's Workload is Finished, so deactivating it changes nothing and
    Kueue never suspends the TrainJob: measured on make up, 4 of 8 were deleted with spec.suspend false.
    Now dispatch suspends it itself once Kueue can no longer resume it, and deletes it once the Trainer shows
    it Suspended: the test's own TrainJob watch sees every one of the 16 deleted with spec.suspend true, and
    the identity observer sees no rank run twice."""
    ns = kueue_queue.namespace
    token = submitter[1]
    recorder = Recorder(kube, ns).start(kinds=("TrainJob",))
    observer = IdentityObserver(kubeconfig).start()
    try:
        jobs = [
            submit_job(
                token,
                _queue_body(kueue_queue, env=FAILING, recovery_policy=RETRY_ONCE),
                django_capture_on_commit_callbacks,
            )
            for _ in range(8)
        ]

        def all_failed_twice() -> bool:
            with TestCase.captureOnCommitCallbacks(execute=True):
                cycle.supervise()
                # The beat's stale sweep, on a short period: a delete whose retries ran out is sent again
                # late, and must stop first too. (A task run in this process raises the retry it asks for;
                # a worker would run it a little later, and so does the next sweep here.)
                with contextlib.suppress(Retry):
                    sweeps.executions_resubmit_stale(older_than_seconds=5)
            return (
                all(Job.objects.filter(pk=j, state="failed", current_attempt=2).exists() for j in jobs)
                and not Execution.objects.filter(job_id__in=jobs, objects_removed_at__isnull=True).exists()
            )

        wait_for(
            all_failed_twice, timeout=240, interval=0.5, what="8 jobs failed in attempt 2, objects removed"
        )
        for job_id in jobs:
            data = get_job(token, job_id)
            assert [(e["attempt"], e["cause"]) for e in data["executions"]] == [
                (1, "app-error"),
                (2, "app-error"),
            ]
        wait_for(
            lambda: len(_unsuspended_deletes(recorder, "j")[0]) >= 16,
            timeout=30,
            what="16 TrainJob deletes seen",
        )
    finally:
        recorder.stop()
        observer.stop()
    deleted, unsuspended = _unsuspended_deletes(recorder, "j")
    assert deleted == sorted(f"{j}-{a}" for j in jobs for a in (1, 2)), deleted
    assert unsuspended == [], f"TrainJobs deleted with spec.suspend not true: {unsuspended}"
    # ... and each one only once the Trainer showed it Suspended (not by the fallback of a stop it never
    # showed): its rebuilt JobSet, if any, is suspended.
    assert _unsuspended_deletes(recorder, "j", shown=True)[1] == []
    verdict = observer.verdict(namespaces={ns})
    assert verdict["violations"] == [] and verdict["ok"], verdict


@pytest.mark.parametrize("queued", [True, False], ids=["kueue", "plain"])
def test_a_delete_the_sweep_delivers_late_still_stops_the_trainjob_first(
    queued: bool,
    kube: Kube,
    request: pytest.FixtureRequest,
    namespace: str,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A cancel's delete message is lost; the stale sweep sends it again two sweep periods later. The
    fallback (delete a TrainJob the Trainer never shows stopped) used to count from the cancel, so that
    late delete found its 30 s long gone and deleted the running TrainJob without a stop. It counts from
    the first stop the cluster accepted now: the late delete stops first (under Kueue by deactivating the
    Workload, which Kueue then evicts and suspends; without Kueue by spec.suspend), and the test's own
    TrainJob watch sees the TrainJob deleted with spec.suspend true."""
    token = submitter[1]
    if queued:
        queue: KueueQueue = request.getfixturevalue("kueue_queue")
        body = _queue_body(queue, env={"KWOK_STAY_RUNNING": "1"})
    else:
        body = job_body(namespace, env={"KWOK_STAY_RUNNING": "1"})
    recorder = Recorder(kube, namespace).start(kinds=("TrainJob",))
    try:
        job_id = submit_job(token, body, django_capture_on_commit_callbacks)
        supervise_until(token, job_id, lambda d: d["state"] == "running", what="running")
        with django_capture_on_commit_callbacks(execute=False) as lost:  # the delete message is lost
            cancelled = api_as(token).post(f"/api/v1/jobs/{job_id}/cancel")
        assert cancelled.status_code in (200, 202), cancelled.content
        assert lost, "the cancel sent no delete"
        execution = Execution.objects.get(job_id=job_id, attempt=1)
        # Two sweep periods (and more) later, the sweep finds the delete not done and sends it again.
        late = timezone.now() - timedelta(
            seconds=sweeps.STALE_PENDING_SECONDS * sweeps.STALE_DELETE_FACTOR + 30
        )
        Execution.objects.filter(pk=execution.pk).update(delete_requested_at=late)
        sent = sweeps.executions_resubmit_stale()  # the delete task runs in this process, with its retries
        assert execution.pk in sent
        wait_for(
            lambda: _unsuspended_deletes(recorder, execution.trainjob_name)[0],
            timeout=60,
            what="the TrainJob deleted",
        )
    finally:
        recorder.stop()
    deleted, unsuspended = _unsuspended_deletes(recorder, execution.trainjob_name, shown=True)
    assert deleted == [execution.trainjob_name]
    assert unsuspended == [], "the late delete deleted the running TrainJob without stopping it first"
    execution.refresh_from_db()
    assert execution.stop_accepted_at is not None and execution.stop_accepted_at > late


def test_attempt_2_waits_until_attempt_1s_trainjob_is_stopped_or_gone(
    kube: Kube,
    namespace: str,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Attempt 1 fails (both ranks exit 3: no pod of it runs any more) and the worker that would stop and
    delete its TrainJob is held back. Before, attempt 2 started as soon as a list showed attempt 1's pods
    ended, beside a failed TrainJob that still existed unsuspended, whose JobSet the Trainer rebuilds when it
    goes (outside attempt 2's quota and unwatched). Now the job waits, and says so; once the held delete
    runs (stop, then delete), attempt 2 starts."""
    token = submitter[1]
    env = {"KWOK_EXIT_CODE": "3", "KWOK_RUN_DURATION": "1s"}
    job_id = submit_job(
        token, job_body(namespace, env=env, recovery_policy=RETRY_ONCE), django_capture_on_commit_callbacks
    )
    held: list[Callable[[], Any]] = []

    def held_cycle() -> None:
        with TestCase.captureOnCommitCallbacks(execute=False) as callbacks:
            cycle.supervise()
        held.extend(callbacks)

    def retrying() -> bool:
        held_cycle()
        return Execution.objects.get(job_id=job_id, attempt=1).state == "failed"

    wait_for(retrying, timeout=90, interval=0.5, what="attempt 1 failed (its delete held back)")
    trainjob_name = Execution.objects.get(job_id=job_id, attempt=1).trainjob_name
    for _ in range(4):  # the backoff (0 s) ran out; attempt 1's pods have ended
        with TestCase.captureOnCommitCallbacks(execute=True):
            cycle.supervise()
    job = Job.objects.get(pk=job_id)
    assert job.current_attempt == 1, "attempt 2 started beside attempt 1's unstopped TrainJob"
    assert not Execution.objects.filter(job_id=job_id, attempt=2).exists()
    assert f"waiting for attempt 1's TrainJob {trainjob_name} to be suspended or deleted" in job.message
    assert get_job(token, job_id)["queued_reason"]["reason"] == "retry-backoff"
    for callback in held:  # the worker catches up: stop, then delete
        callback()
    held.clear()
    data = supervise_until(token, job_id, lambda d: d["current_attempt"] == 2, what="attempt 2 started")
    assert [e["attempt"] for e in data["executions"]] == [1, 2]
