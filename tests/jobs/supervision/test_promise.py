"""Issue 18, supervision: strangers cannot end a job, the label domain a job was made with is the one it is
supervised by, attempt A+1 waits for A's pods, a job that ran never reads `queued` again, and the states that
stayed wrong (an old FailedCreate, tombstones dropped while the beat held the lease, an older observation
written after a newer one, a long host name).

Each test takes the user's path (POST /api/v1/jobs, then supervision cycles: the beat's code, or the
`manage.py supervise` loop with its watches) on the real local control plane, and proves the interleaving it
is about happened by waiting on the state that shows it. Where a controller or KWOK must be held between two
of its steps, the test pauses that process of this worktree's control plane (support.paused); where KWOK
cannot produce a state (an in-place container restart, a pod failing while KWOK is held), the test writes the
pod's status as a kubelet would, and says so.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase
from kubernetes import client
from rest_framework.test import APIClient

from jobs.models import Execution, Job, JobEvent, JobState, SupervisorCycle
from jobs.supervision import cycle
from tests.jobs.supervision.support import (
    api,
    body,
    get,
    paused,
    pods_of,
    running_pods,
    submit,
    supervise_until,
    supervisor_process,
    trainjob_exists,
    transitions,
    wait_job,
)
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster]


@pytest.fixture
def other_namespace(kube: Any) -> Iterator[str]:
    name = f"t-other-{uuid.uuid4().hex[:6]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for(
        lambda: _exists(lambda: kube.core.read_namespaced_service_account("default", name)),
        timeout=30,
        what="default ServiceAccount",
    )
    yield name
    with contextlib.suppress(client.ApiException):
        kube.core.delete_namespace(name, propagation_policy="Background")


def _exists(read: Callable[[], Any]) -> bool:
    try:
        read()
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _stranger_pod(name: str, job_id: str, rank: int, env: dict[str, str]) -> dict[str, Any]:
    """A pod anyone with pod create rights can make: the job's labels, its rank's completion index and the
    JobSet labels of rank `rank` in restart-attempt 0. It has no ownerReference to the job's Job."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "dispatch.dev/job": job_id,
                "dispatch.dev/attempt": "1",
                "batch.kubernetes.io/job-completion-index": str(rank),
                "jobset.sigs.k8s.io/restart-attempt": "0",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/job-index": "0",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "node",
                    "image": "localhost/stranger:v1",
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                }
            ],
        },
    }


def _pod_phase(kube: Any, namespace: str, name: str) -> str:
    return str(kube.core.read_namespaced_pod(name, namespace).status.phase or "")


# ---------------------------------------------------------------- 1. strangers' objects


@pytest.mark.parametrize("path", ["beat", "watch"])
@pytest.mark.django_db(transaction=True)
def test_a_strangers_labelled_pods_neither_end_the_job_nor_delete_its_trainjob(
    path: str,
    submitter: tuple[User, str],
    namespace: str,
    other_namespace: str,
    runtime_on: Any,
    kube: Any,
) -> None:
    """Two pods carrying the job's id, attempt, rank 1's completion index and restart-attempt 0, one in
    another namespace and one in the job's own, both failing with exit code 1: before, the cycle grouped
    pods by label alone, so rank 1 had 'run twice' (identity-violation, never retried) and dispatch deleted
    the TrainJob. Now they are outside the TrainJob's owner chain: the job runs on and succeeds, and its
    page names the stranger in its namespace."""
    runtime_on(None)
    token = submitter[1]
    response = api(token).post("/api/v1/jobs", body(namespace, {"KWOK_RUN_DURATION": "10s"}), format="json")
    job_id = response.json()["id"]
    with supervisor_process() if path == "watch" else contextlib.nullcontext():
        if path == "beat":
            supervise_until(token, job_id, lambda d: d["state"] == "running", what="running")
        else:
            wait_job(job_id, lambda j: j.state == JobState.RUNNING, what="running")
        failing = {"KWOK_EXIT_CODE": "1", "KWOK_RUN_DURATION": "1s"}
        for ns, name in ((other_namespace, "stranger-elsewhere"), (namespace, "stranger-here")):
            kube.core.create_namespaced_pod(ns, _stranger_pod(name, job_id, 1, failing))
        # The strangers have failed while the job still runs: the state a cycle must not be fooled by.
        wait_for(
            lambda: (
                _pod_phase(kube, namespace, "stranger-here") == "Failed"
                and _pod_phase(kube, other_namespace, "stranger-elsewhere") == "Failed"
            ),
            timeout=30,
            what="the strangers' pods Failed",
        )
        assert Job.objects.get(pk=job_id).state == JobState.RUNNING
        if path == "beat":
            seen = supervise_until(
                token, job_id, lambda d: bool(d.get("supervision_warnings")) or d["state"] != "running"
            )
            data = supervise_until(
                token, job_id, lambda d: d["state"] in ("succeeded", "failed", "cancelled"), what="ended"
            )
        else:
            wait_job(
                job_id,
                lambda j: bool(j.supervision_warnings) or j.state != JobState.RUNNING,
                what="a cycle after the strangers failed",
            )
            seen = get(token, job_id)
            wait_job(job_id, lambda j: j.state not in (JobState.RUNNING, JobState.QUEUED), what="ended")
            data = get(token, job_id)
    outcome = (data["state"], data["cause"])
    assert outcome == ("succeeded", ""), (*outcome, data["message"])
    assert data["identity_findings"] == []
    # While it ran, the page named the stranger in the job's namespace (the other namespace is not read:
    # no active execution lives there).
    assert seen["state"] == "running"
    assert [w["object"] for w in seen["supervision_warnings"]] == [f"Pod {namespace}/stranger-here"]
    assert "not in the owner chain" in seen["supervision_warnings"][0]["message"]
    # dispatch never stopped it: the TrainJob is still there (a completed TrainJob is kept).
    assert trainjob_exists(kube, namespace, f"{job_id}-1")
    assert ("running", "failed") not in transitions(data)


# ---------------------------------------------------------------- 4. the label domain stored with the job


@pytest.mark.django_db
def test_a_running_job_is_supervised_by_its_own_label_domain_after_the_site_changes_it(
    submitter: tuple[User, str],
    platform_api: APIClient,
    namespace: str,
    runtime_on: Any,
    kube: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """PATCH /api/v1/settings {"label_domain": ...} while a job runs: before, the cycle listed and grouped by
    the site's current domain, so the running job read `cancelled` ("deleted outside dispatch") and its
    TrainJob ran on unfollowed. Now each job is supervised by the domain stored with it: the first job keeps
    running and succeeds, a job submitted after the change carries the new domain, and both are supervised
    in the same cycles."""
    runtime_on(None)
    token = submitter[1]
    first = submit(token, body(namespace, {"KWOK_RUN_DURATION": "12s"}), django_capture_on_commit_callbacks)
    supervise_until(token, first, lambda d: d["state"] == "running", what="first running")
    changed = platform_api.patch("/api/v1/settings", {"label_domain": "other.example"}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["label_domain"] == "other.example"
    second = submit(token, body(namespace, {"KWOK_RUN_DURATION": "3s"}), django_capture_on_commit_callbacks)
    made = kube.custom.get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", f"{second}-1"
    )
    assert made["metadata"]["labels"]["other.example/job"] == second
    assert "dispatch.dev/job" not in made["metadata"]["labels"]

    both: dict[str, list[str]] = {first: [], second: []}

    def check() -> bool:
        with TestCase.captureOnCommitCallbacks(execute=True):
            cycle.supervise()
        for job_id, states in both.items():
            state = get(token, job_id)["state"]
            if not states or states[-1] != state:
                states.append(state)
        return all(states[-1] in ("succeeded", "failed", "cancelled") for states in both.values())

    wait_for(check, timeout=90, interval=0.5, what="both ended")
    assert both[first] == ["running", "succeeded"], both
    assert both[second][-2:] == ["running", "succeeded"], both
    assert "cancelled" not in both[first]
    first_data = get(token, first)
    assert transitions(first_data)[-1] == ("running", "succeeded"), transitions(first_data)
    # The first job's TrainJob still carries the domain it was made with, and dispatch followed it.
    assert Job.objects.get(pk=first).label_domain == "dispatch.dev"
    assert Job.objects.get(pk=second).label_domain == "other.example"


# ---------------------------------------------------------------- 7. A+1 after A's pods stopped


def _fail_rank_as_kubelet(kube: Any, namespace: str, pod: Any, code: int) -> None:
    """The kubelet's report of a container that exited with `code` (KWOK is held, so the test writes it)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    container = next(c for c in pod.status.container_statuses if c.name == "node")
    kube.core.patch_namespaced_pod_status(
        pod.metadata.name,
        namespace,
        {
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "node",
                        "image": container.image,
                        "imageID": container.image_id or "",
                        "ready": False,
                        "restartCount": 0,
                        "started": False,
                        "state": {
                            "terminated": {
                                "exitCode": code,
                                "reason": "Error",
                                "startedAt": now,
                                "finishedAt": now,
                            }
                        },
                    }
                ],
            }
        },
    )


def _job_conditions(kube: Any, namespace: str, job_id: str) -> set[str]:
    jobs = kube.batch.list_namespaced_job(namespace, label_selector=f"dispatch.dev/job={job_id}").items
    return {c.type for j in jobs for c in (j.status.conditions or []) if c.status == "True"}


def _rank(pod: Any) -> int:
    return int(pod.metadata.labels["batch.kubernetes.io/job-completion-index"])


def _cycles(
    token: str, job_id: str, predicate: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """Beat cycles whose on-commit work (the delete and submit tasks) runs, until the predicate holds."""
    return supervise_until(token, job_id, predicate, what=what)


@pytest.mark.django_db
def test_attempt_2_starts_only_once_a_list_shows_attempt_1s_pods_stopped(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    kube: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Rank 1 fails while KWOK (the kubelet) is held, so rank 0's pod, deleted by the Job controller and then
    with the TrainJob, stays terminating: before, attempt 2 started as soon as the backoff (0 s) ran out,
    beside a rank 0 still running under attempt 1. Now the job waits, and says so, until a list shows none of
    attempt 1's pods; then attempt 2 starts. The failure was read from the Job's FailureTarget (the Job
    cannot turn Failed while a pod terminates), and that failure deleted the TrainJob."""
    runtime_on(None)
    token = submitter[1]
    policy = {"retry": {"app-error": 1}, "backoff_seconds": {"app-error": 0}, "budgets": {"user": 1}}
    job_id = submit(
        token,
        body(namespace, {"KWOK_STAY_RUNNING": "1"}, recovery_policy=policy),
        django_capture_on_commit_callbacks,
    )
    _cycles(token, job_id, lambda d: d["state"] == "running", "running")
    pods = running_pods(kube, namespace, job_id)
    rank1 = next(p for p in pods if _rank(p) == 1)
    rank0 = next(p for p in pods if _rank(p) == 0)
    with paused("kwok"):
        _fail_rank_as_kubelet(kube, namespace, rank1, 3)
        # The Job controller saw it: FailureTarget, and rank 0 deleted but (no kubelet) still terminating.
        wait_for(
            lambda: (
                "FailureTarget" in _job_conditions(kube, namespace, job_id)
                and kube.core.read_namespaced_pod(rank0.metadata.name, namespace).metadata.deletion_timestamp
            ),
            timeout=30,
            what="FailureTarget, rank 0 terminating",
        )
        waiting = _cycles(
            token,
            job_id,
            lambda d: "waiting for attempt 1's pods to stop" in d["message"],
            "the job waiting for attempt 1's pods",
        )
        assert "Failed" not in _job_conditions(kube, namespace, job_id)  # read from FailureTarget alone
        assert waiting["state"] == "pending"
        assert waiting["current_attempt"] == 1
        assert waiting["queued_reason"]["reason"] == "retry-backoff"
        assert rank0.metadata.name in waiting["queued_reason"]["message"]
        assert [e["attempt"] for e in waiting["executions"]] == [1]
        first = waiting["executions"][0]
        assert (first["state"], first["cause"]) == ("failed", "app-error")
        # The failure deleted the TrainJob while the Job still only had FailureTarget.
        wait_for(lambda: not trainjob_exists(kube, namespace, f"{job_id}-1"), timeout=30, what="deleted")
        # A few more cycles while the pod still terminates: still no attempt 2.
        for _ in range(3):
            with TestCase.captureOnCommitCallbacks(execute=True):
                cycle.supervise()
        assert Job.objects.get(pk=job_id).current_attempt == 1
        assert not Execution.objects.filter(job_id=job_id, attempt=2).exists()
        assert pods_of(kube, namespace, job_id)  # rank 0 still there
    data = _cycles(token, job_id, lambda d: d["current_attempt"] == 2, "attempt 2")
    assert [e["attempt"] for e in data["executions"]] == [1, 2]
    assert not pods_of(kube, namespace, job_id, attempt=1)


@pytest.mark.django_db
def test_a_failure_read_from_a_jobs_failure_target_deletes_the_trainjob(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    kube: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Not retried: the job reads failed from the Job's FailureTarget while rank 0 still terminates (KWOK
    held), and dispatch deletes the TrainJob. Before, only a 'stop' deleted it, so the healthy ranks kept
    their GPUs while the job read failed."""
    runtime_on(None)
    token = submitter[1]
    job_id = submit(
        token,
        body(namespace, {"KWOK_STAY_RUNNING": "1"}, recovery_policy={"retry": {"app-error": 0}}),
        django_capture_on_commit_callbacks,
    )
    _cycles(token, job_id, lambda d: d["state"] == "running", "running")
    pods = running_pods(kube, namespace, job_id)
    with paused("kwok"):
        _fail_rank_as_kubelet(kube, namespace, next(p for p in pods if _rank(p) == 1), 3)
        wait_for(
            lambda: "FailureTarget" in _job_conditions(kube, namespace, job_id),
            timeout=30,
            what="FailureTarget",
        )
        data = _cycles(token, job_id, lambda d: d["state"] == "failed", "failed")
        assert (data["cause"], data["failing_rank"], data["exit_code"]) == ("app-error", 1, 3)
        assert "Failed" not in _job_conditions(kube, namespace, job_id)
        wait_for(
            lambda: not trainjob_exists(kube, namespace, f"{job_id}-1"), timeout=30, what="TrainJob deleted"
        )


# ---------------------------------------------------------------- 8. a completed job keeps its findings


@pytest.mark.django_db
def test_a_completed_job_still_records_and_shows_a_rank_that_ran_twice(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    kube: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Complete wins the state (status-facts §12), but a rank that ran twice is still a finding. KWOK has
    no kubelet to restart a container in place, so once the TrainJob completed the test writes rank 1's
    container status as a kubelet would after one in-place restart (restartCount 1, a previous run that
    ended Error 137). The first cycle after that reads succeeded, with the finding on the job, its message
    and its timeline. Before, the finding was kept on the job but nothing said so on the timeline."""
    runtime_on(None)
    token = submitter[1]
    job_id = submit(token, body(namespace, {"KWOK_RUN_DURATION": "2s"}), django_capture_on_commit_callbacks)

    def completed() -> bool:
        tj = kube.custom.get_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", f"{job_id}-1"
        )
        conditions = tj.get("status", {}).get("conditions", [])
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

    wait_for(completed, timeout=60, what="TrainJob Complete")
    [rank1] = [p for p in pods_of(kube, namespace, job_id) if _rank(p) == 1]
    container = next(c for c in rank1.status.container_statuses if c.name == "node")
    terminated = container.state.terminated
    kube.core.patch_namespaced_pod_status(
        rank1.metadata.name,
        namespace,
        {
            "status": {
                "containerStatuses": [
                    {
                        "name": "node",
                        "image": container.image,
                        "imageID": container.image_id or "",
                        "ready": False,
                        "restartCount": 1,
                        "started": False,
                        "state": {
                            "terminated": {
                                "exitCode": 0,
                                "reason": "Completed",
                                "startedAt": terminated.started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                "finishedAt": terminated.finished_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                            }
                        },
                        "lastState": {
                            "terminated": {
                                "exitCode": 137,
                                "reason": "Error",
                                "startedAt": terminated.started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                "finishedAt": terminated.started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                            }
                        },
                    }
                ]
            }
        },
    )
    data = supervise_until(token, job_id, lambda d: d["state"] == "succeeded", what="succeeded")
    assert data["cause"] == ""
    [finding] = data["identity_findings"]
    assert finding["rank"] == 1 and not finding["expected"]
    assert "restarted in place" in finding["why"]
    assert "identity finding" in data["message"]
    [event] = [e for e in data["timeline"] if e["kind"] == "identity-finding"]
    assert "rank" not in event["message"] or "restarted in place" in event["message"]
    assert event["details"]["findings"][0]["rank"] == 1
    # The JobSet is never deleted by dispatch: a completed TrainJob keeps it.
    assert _exists(
        lambda: kube.custom.get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", f"{job_id}-1"
        )
    )


# ---------------------------------------------------------------- 9. an old FailedCreate


def _failed_creates(kube: Any, namespace: str) -> list[Any]:
    events = kube.core.list_namespaced_event(namespace, field_selector="reason=FailedCreate").items
    return [e for e in events if "exceeded quota" in (e.message or "")]


@pytest.mark.django_db
def test_exceeded_quota_waits_the_no_capacity_threshold_and_an_old_failed_create_does_not_pin_the_job(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    kube: Any,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A ResourceQuota of 0 pods: the Job controller's creates fail with "exceeded quota". Before, the job
    failed as no-capacity after 15 s (the admission-denial wait); now it waits NO_CAPACITY_AFTER_SECONDS.
    Then the quota goes, the pods are made and run: before, the old FailedCreate events (they live an hour)
    kept the job at queued / pods-not-created; now a FailedCreate older than the pods made since says
    nothing, and the job runs and succeeds."""
    runtime_on(None)
    settings.NO_CAPACITY_AFTER_SECONDS = 600
    token = submitter[1]
    kube.core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
    )
    wait_for(
        lambda: (
            (kube.core.read_namespaced_resource_quota("no-pods", namespace).status.hard or {}).get("pods")
            == "0"
        ),
        timeout=30,
        what="the quota in force",
    )
    job_id = submit(token, body(namespace, {"KWOK_RUN_DURATION": "3s"}), django_capture_on_commit_callbacks)
    waiting = supervise_until(
        token,
        job_id,
        lambda d: d["queued_reason"].get("reason") == "pods-not-created",
        what="pods-not-created",
    )
    assert "exceeded quota" in waiting["queued_reason"]["message"]

    def first_failure_older_than(seconds: float) -> bool:
        found = _failed_creates(kube, namespace)
        firsts = [e.first_timestamp or e.event_time for e in found if e.first_timestamp or e.event_time]
        return bool(firsts) and (datetime.now(UTC) - min(firsts)).total_seconds() > seconds

    wait_for(lambda: first_failure_older_than(16), timeout=60, what="the creates failing for 16 s")
    data = supervise_until(token, job_id, lambda d: True, what="a cycle")
    assert data["state"] == "queued", (data["state"], data["cause"], data["message"])
    assert data["queued_reason"]["reason"] == "pods-not-created"

    kube.core.delete_namespaced_resource_quota("no-pods", namespace)
    # The Job controller tries again (with its backoff) and the pods are made: the FailedCreate events stay.
    running = supervise_until(
        token, job_id, lambda d: d["state"] != "queued", timeout=180, what="out of queued"
    )
    assert _failed_creates(kube, namespace), "the old FailedCreate events are still there"
    assert running["state"] in ("running", "succeeded"), (running["state"], running["message"])
    assert running["queued_reason"].get("reason") != "pods-not-created"
    data = supervise_until(token, job_id, lambda d: d["state"] == "succeeded", what="succeeded")
    assert ("queued", "failed") not in transitions(data)


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

    # Pause point: the beat's first read of the cluster (the _start_due_retries call precedes it; the lease
    # is already taken then).
    monkeypatch.setattr(cycle, "_start_due_retries", paused_at_reads(cycle._start_due_retries))

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

    monkeypatch.setattr(cycle, "_start_due_retries", long_step)
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


# ---------------------------------------------------------------- 12. a job that ran never reads queued


@pytest.mark.django_db
def test_four_ranks_oom_killed_go_running_to_failed_never_back_to_queued(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    kube: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """4 ranks OOM-killed (KWOK_OOM=1). Between the pods failing and the Job controller writing the Job's
    failure there is a moment with no pod running and no failure condition anywhere; the test holds it by
    pausing kube-controller-manager. Before, a cycle then read `queued` (running -> queued -> failed, as
    seen on a job page). Now the Failed pods fail the job at once (under dispatch's rules a Failed rank
    fails its Job: backoffLimit 0), running -> failed."""
    runtime_on(None)
    token = submitter[1]
    job_id = submit(
        token,
        body(namespace, {"KWOK_OOM": "1", "KWOK_RUN_DURATION": "4s"}, num_nodes=4),
        django_capture_on_commit_callbacks,
    )
    supervise_until(token, job_id, lambda d: d["state"] == "running", what="running")
    running_pods(kube, namespace, job_id, count=4)
    with paused("kube-controller-manager"):
        wait_for(
            lambda: [p.status.phase for p in pods_of(kube, namespace, job_id)] == ["Failed"] * 4,
            timeout=60,
            what="4 pods OOM-killed",
        )
        assert not _job_conditions(kube, namespace, job_id) & {"FailureTarget", "Failed"}
        data = supervise_until(token, job_id, lambda d: True, what="a cycle in between")
        assert (data["state"], data["cause"]) == ("failed", "oom"), (data["state"], data["message"])
        assert "OOM-killed" in data["message"]
        assert not _job_conditions(kube, namespace, job_id) & {"FailureTarget", "Failed"}
    assert transitions(data) == [("queued", "running"), ("running", "failed")], transitions(data)
