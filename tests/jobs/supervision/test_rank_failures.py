"""Issue 18, supervision: attempt A+1 waits for A's pods, a failure read from a Job's FailureTarget deletes
the TrainJob, and a completed job keeps its identity findings.

Each test takes the user's path (POST /api/v1/jobs, then supervision cycles: the beat's code, or the
`manage.py supervise` loop with its watches) on the real local control plane, and proves the interleaving it
is about happened by waiting on the state that shows it. Where KWOK must be held between two of its steps, the
test pauses that process of this worktree's control plane (support.paused); where KWOK cannot produce a state
(an in-place container restart, a pod failing while KWOK is held), the test writes the pod's status as a
kubelet would, and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import TestCase

from jobs.models import Execution, Job
from jobs.supervision import cycle
from tests.jobs.supervision.support import (
    _exists,
    _job_conditions,
    body,
    paused,
    pods_of,
    running_pods,
    submit,
    supervise_until,
    trainjob_exists,
)
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster]


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
