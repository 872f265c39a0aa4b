"""Logs over the API against the real control plane: GET /api/v1/jobs/{id}/logs reads a rank's pod log
through cluster/logs.py (KWOK serves every container the same simulated log: scripts/cluster's ClusterLogs).
The job is submitted through the API; the pods are the Job controller's, found by the job's labels."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from dispatch_site.models import AuditEvent
from jobs.models import Execution, Job, JobState
from jobs.supervision import cycle
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]

# The Job's own selector labels (controller-uid) and its name labels: a forger leaves them out, or the Job
# controller would adopt the pod and delete it as an extra one. (Exact keys: `jobset.sigs.k8s.io/
# replicatedjob-name`, which the copy keeps, contains "job-name".)
# The Job controller releases (strips the ownerReference from) a pod it controls that does not match its
# selector, so a forged controller reference lasts only until its next sync (a CI run's supervision met the
# pod already released). A plain ownerReference (controller false) stays: the forger's durable form.
JOB_SELECTOR_LABELS = frozenset(
    {"batch.kubernetes.io/controller-uid", "controller-uid", "batch.kubernetes.io/job-name", "job-name"}
)

KWOK_LOG = "kwok: simulated container log (dispatch local cluster)"


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


@pytest.fixture
def running_job(
    submitter: tuple[User, str],
    namespace: str,
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
    kube: Any,
) -> str:
    namespaced_runtime()
    body = {
        "runtime": {"kind": "TrainingRuntime", "name": "team-runtime"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "env": {"KWOK_STAY_RUNNING": "1"},
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = _api(submitter[1]).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.json()
    job_id: str = response.json()["id"]
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED

    def running() -> bool:
        pods = kube.core.list_namespaced_pod(namespace, label_selector=f"dispatch.dev/job={job_id}").items
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    wait_for(running, timeout=90, what="2 running pods")
    # Supervision runs beside the API (the beat's cycle here): it is what finds the pods in the job's chain.
    wait_for(
        lambda: (
            cycle.supervise()
            and Job.objects.get(pk=job_id).state == JobState.RUNNING
            and len(Execution.objects.get(job_id=job_id, attempt=1).pods_seen) == 2
        ),
        timeout=60,
        what="supervision reading the job running",
    )
    return job_id


def test_a_ranks_log_is_text_with_the_pod_named(submitter: tuple[User, str], running_job: str) -> None:
    response = _api(submitter[1]).get(f"/api/v1/jobs/{running_job}/logs?attempt=1&rank=1&tail=50")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert response.content.decode().strip() == KWOK_LOG
    assert response["X-Dispatch-Rank"] == "1" and response["X-Dispatch-Attempt"] == "1"
    assert response["X-Dispatch-Pod"].startswith(f"{running_job}-1-node-0-1-")
    assert response["X-Dispatch-Truncated"] == "false"
    # Who read which log is audited, once per reader, attempt and rank in ten minutes (a reloading page is
    # one read); another rank is another read.
    reads = AuditEvent.objects.filter(action="log.read", object_type="job", object_id=running_job)
    [read] = reads
    assert read.actor == submitter[0] and read.details["rank"] == 1 and read.details["via"] == "api"
    assert _api(submitter[1]).get(f"/api/v1/jobs/{running_job}/logs?attempt=1&rank=1").status_code == 200
    assert reads.count() == 1
    assert _api(submitter[1]).get(f"/api/v1/jobs/{running_job}/logs?attempt=1&rank=0").status_code == 200
    assert sorted(r.details["rank"] for r in reads.all()) == [0, 1]


def test_a_strangers_pod_with_the_ranks_labels_is_never_the_ranks_log(
    submitter: tuple[User, str], running_job: str, namespace: str, kube: Any
) -> None:
    """Anyone who can create a pod in the namespace can copy a rank's labels; the newest pod of a rank used to
    answer. Only a pod supervision found in the attempt's owner chain counts (the stranger is Running, newer,
    and carries the same job, attempt, completion index and JobSet restart)."""
    [real] = [
        p
        for p in kube.core.list_namespaced_pod(
            namespace, label_selector=f"dispatch.dev/job={running_job}"
        ).items
        if p.metadata.labels["batch.kubernetes.io/job-completion-index"] == "1"
    ]
    # The job's labels, the rank and the JobSet restart; not the Job's own selector (controller-uid), or the
    # Job controller would adopt the pod and delete it as an extra one.
    copied = {
        k: v for k, v in real.metadata.labels.items() if "controller-uid" not in k and "job-name" not in k
    }
    # Newer than the rank's pod by the API server's clock (creationTimestamp has whole seconds), so that a
    # choice by labels and age alone would pick the stranger.
    wait_for(
        lambda: datetime.now(UTC) - real.metadata.creation_timestamp > timedelta(seconds=1.5),
        what="a second past the rank pod's creation",
    )
    kube.core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{running_job}-1-node-0-1-zzzzz", "labels": copied},
            "spec": {
                "containers": [
                    {
                        "name": "node",
                        "image": "localhost/stranger:v1",
                        "env": [{"name": "KWOK_STAY_RUNNING", "value": "1"}],
                    }
                ],
            },
        },
    )
    wait_for(
        lambda: (
            kube.core.read_namespaced_pod(f"{running_job}-1-node-0-1-zzzzz", namespace).status.phase
            == "Running"
        ),
        what="the stranger's pod running",
    )
    response = _api(submitter[1]).get(f"/api/v1/jobs/{running_job}/logs?attempt=1&rank=1&tail=50")
    assert response.status_code == 200
    assert response["X-Dispatch-Pod"] == real.metadata.name


def test_follow_streams_while_the_pod_runs(
    submitter: tuple[User, str], running_job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A follow holds the connection until the pod ends or FOLLOW_SECONDS pass; KWOK keeps it open while the
    # pod runs, so the test shortens the hold (the production value is 300 s) instead of waiting it out.
    monkeypatch.setattr("jobs.dashboard.logs_api.FOLLOW_SECONDS", 5.0)
    started = time.monotonic()
    response: Any = _api(submitter[1]).get(f"/api/v1/jobs/{running_job}/logs?rank=0&follow=true")
    assert response.status_code == 200 and response.streaming
    assert b"".join(response.streaming_content).decode().strip() == KWOK_LOG
    assert time.monotonic() - started < 60


def test_a_rank_without_a_pod_is_404_naming_the_ranks_that_have_one(
    submitter: tuple[User, str], running_job: str
) -> None:
    response = _api(submitter[1]).get(f"/api/v1/jobs/{running_job}/logs?attempt=1&rank=5")
    assert response.status_code == 404
    data = response.json()
    assert data["ranks"] == [0, 1] and data["attempts"] == [1]
    assert f"attempt 1 of job {running_job} has no pod for rank 5; ranks with pods: 0, 1" == data["detail"]


def test_a_container_the_pod_does_not_have_is_404_naming_its_containers(
    submitter: tuple[User, str], running_job: str
) -> None:
    response = _api(submitter[1]).get(f"/api/v1/jobs/{running_job}/logs?rank=0&container=sidecar")
    assert response.status_code == 404
    assert "node" in response.json()["containers"]
    assert "has no container 'sidecar'" in response.json()["detail"]


def test_a_failed_ranks_log_is_kept_when_its_trainjob_is_deleted(
    submitter: tuple[User, str],
    namespace: str,
    namespaced_runtime: Callable[..., Any],
    kube: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Every terminal failure deletes the attempt's TrainJob, and its pods with it: the failing rank's last
    lines are read right before that delete (jobs.logtail), and the log API and the job page serve them."""
    from django.test import Client

    from tests.jobs.supervision import support

    namespaced_runtime()
    env = {"KWOK_EXIT_CODE": "3", "KWOK_FAIL_RANK": "1", "KWOK_RUN_DURATION": "2s"}
    job_id = support.submit(submitter[1], support.body(namespace, env), django_capture_on_commit_callbacks)
    support.supervise_until(submitter[1], job_id, lambda d: d["state"] == "failed", what="the job to fail")
    wait_for(
        lambda: (
            not support.trainjob_exists(kube, namespace, f"{job_id}-1")
            and not support.pods_of(kube, namespace, job_id)
        ),
        timeout=60,
        what="the failed attempt's TrainJob and pods to be gone",
    )

    response = _api(submitter[1]).get(f"/api/v1/jobs/{job_id}/logs?attempt=1&rank=1")
    assert response.status_code == 200, response.content
    assert response.content.decode().strip() == KWOK_LOG
    assert response["X-Dispatch-Pod"].startswith(f"{job_id}-1-node-0-1-")
    assert response["X-Dispatch-Kept"]
    # Rank 0 did not fail: nothing was kept for it, and its pod is gone.
    assert _api(submitter[1]).get(f"/api/v1/jobs/{job_id}/logs?attempt=1&rank=0").status_code == 404

    page = Client()
    page.force_login(submitter[0])
    html = page.get(f"/jobs/{job_id}/log/?attempt=1&rank=1").content.decode()
    assert KWOK_LOG in html and 'id="log-kept"' in html


def test_a_rank_whose_pod_went_first_is_recorded_once_not_listed_on_every_delete_pass(
    submitter: tuple[User, str],
    namespace: str,
    namespaced_runtime: Callable[..., Any],
    kube: Any,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each pass of a failed attempt's delete keeps the failing rank's log first (a delete is retried until
    its objects are gone); when the pod is already gone (the worker that deletes was late), every pass listed
    the pods again. Now the first records that no pod was left, and the later ones read nothing (the list
    calls are counted with a spy around the real gateway call)."""
    from django.test import TestCase

    from cluster import logs as cluster_logs
    from jobs.logtail import execution_log_keep
    from jobs.submission.cancel import execution_objects_delete
    from tests.jobs.supervision import support

    namespaced_runtime()
    env = {"KWOK_EXIT_CODE": "3", "KWOK_FAIL_RANK": "1", "KWOK_RUN_DURATION": "2s"}
    job_id = support.submit(submitter[1], support.body(namespace, env), django_capture_on_commit_callbacks)

    def failed_with_the_delete_held() -> bool:
        with TestCase.captureOnCommitCallbacks(execute=False):  # the worker that would delete is late
            cycle.supervise()
        return Execution.objects.get(job_id=job_id, attempt=1).state == JobState.FAILED

    wait_for(failed_with_the_delete_held, timeout=90, what="attempt 1 failed, its delete not run")
    kube.custom.delete_namespaced_custom_object(
        "trainer.kubeflow.org",
        "v1alpha1",
        namespace,
        "trainjobs",
        f"{job_id}-1",
        propagation_policy="Background",
    )
    wait_for(lambda: not support.pods_of(kube, namespace, job_id), timeout=60, what="its pods gone")
    calls: list[str] = []
    real = cluster_logs.list_pods

    def counted(namespace: str, label_selector: str) -> list[cluster_logs.PodInfo]:
        calls.append(label_selector)
        return real(namespace, label_selector)

    monkeypatch.setattr(cluster_logs, "list_pods", counted)
    job = Job.objects.get(pk=job_id)
    for _ in range(3):  # what each pass of the delete does first, on the execution as it reads it afresh
        execution_log_keep(job=job, execution=Execution.objects.get(job_id=job_id, attempt=1))
    assert len(calls) == 1, calls
    assert execution_objects_delete(job, Execution.objects.get(job_id=job_id, attempt=1))  # nothing left
    assert len(calls) == 1, calls
    execution = Execution.objects.get(job_id=job_id, attempt=1)
    assert execution.log_tail == {"rank": 1, "missing": "no pod of the rank was left to read"}
    response = _api(submitter[1]).get(f"/api/v1/jobs/{job_id}/logs?attempt=1&rank=1")
    assert response.status_code == 404  # nothing kept, no pod: the answer says so


def test_a_pod_forged_into_the_owner_chain_is_never_the_ranks_log(
    submitter: tuple[User, str], running_job: str, namespace: str, kube: Any
) -> None:
    """A pod with the rank's labels, its completion index and an ownerReference to the rank's real Job
    (name and UID) is in the owner chain, so supervision records it (Execution.pods_seen) and reports the rank
    ran twice; the newest pod of a rank used to answer, and to be the log kept when the failed attempt is
    deleted. The admission guard refuses such a pod from a namespace member (tests/deploy/
    test_guard_doors.py); here the plane's admin, whom the guard exempts, makes it, so this is dispatch's own
    defence without the guard: two recorded pods claim the rank, and neither is shown or kept as its log."""
    from django.test import TestCase

    from jobs.logtail import execution_log_keep

    [real] = [
        p
        for p in kube.core.list_namespaced_pod(
            namespace, label_selector=f"dispatch.dev/job={running_job}"
        ).items
        if p.metadata.labels["batch.kubernetes.io/job-completion-index"] == "1"
    ]
    owner = real.metadata.owner_references[0]
    copied = {k: v for k, v in real.metadata.labels.items() if k not in JOB_SELECTOR_LABELS}
    wait_for(
        lambda: datetime.now(UTC) - real.metadata.creation_timestamp > timedelta(seconds=1.5),
        what="a second past the rank pod's creation",
    )
    forged = f"{running_job}-1-node-0-1-zzzzz"
    made = kube.core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": forged,
                "labels": copied,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": owner.name,
                        "uid": owner.uid,
                        "controller": False,
                    }
                ],
            },
            "spec": {
                "containers": [
                    {
                        "name": "node",
                        "image": "localhost/forger:v1",
                        "env": [{"name": "KWOK_STAY_RUNNING", "value": "1"}],
                    }
                ],
            },
        },
    )
    wait_for(
        lambda: kube.core.read_namespaced_pod(forged, namespace).status.phase == "Running",
        what="the forged pod running",
    )

    def recorded() -> bool:
        with TestCase.captureOnCommitCallbacks(execute=False):  # the attempt's delete is held
            cycle.supervise()
        return made.metadata.uid in Execution.objects.get(job_id=running_job, attempt=1).pods_seen

    wait_for(recorded, timeout=60, what="supervision recording the forged pod in the chain")
    response = _api(submitter[1]).get(f"/api/v1/jobs/{running_job}/logs?attempt=1&rank=1&tail=50")
    assert response.status_code == 404, (response.status_code, response.get("X-Dispatch-Pod"))
    data = response.json()
    assert data["pods"] == [real.metadata.name, forged]
    assert f"2 pods claim rank 1 of attempt 1 of job {running_job}" in data["detail"]
    assert "does not guess" in data["detail"]
    # Rank 0 has one recorded pod: it still answers.
    assert _api(submitter[1]).get(f"/api/v1/jobs/{running_job}/logs?attempt=1&rank=0").status_code == 200

    job = Job.objects.get(pk=running_job)
    execution = Execution.objects.get(job_id=running_job, attempt=1)
    execution.rank = 1  # the failing rank (supervision names the rank that ran twice)
    assert execution_log_keep(job=job, execution=execution) is False
    kept = Execution.objects.get(pk=execution.pk).log_tail
    assert "pod" not in kept and "text" not in kept, kept
    assert "2 pods claim rank 1" in kept["missing"] and forged in kept["missing"]
