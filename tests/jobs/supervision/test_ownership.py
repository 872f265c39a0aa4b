"""Issue 18, supervision: strangers cannot end a job (nor a TrainJob made again under its name and labels:
the job's is recognised by its UID), and the label domain a job was made with is the one it is supervised by.

Each test takes the user's path (POST /api/v1/jobs, then supervision cycles: the beat's code, or the
`manage.py supervise` loop with its watches) on the real local control plane, and proves the interleaving it
is about happened by waiting on the state that shows it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import TestCase
from kubernetes import client
from rest_framework.test import APIClient

from jobs.models import Execution, Job, JobState
from jobs.supervision import cycle
from jobs.supervision.status import TRAINJOB_GONE
from tests.jobs.supervision.support import (
    _exists,
    _post,
    api,
    body,
    get,
    pods_of,
    submit,
    supervise_until,
    supervisor_process,
    trainjob_exists,
    transitions,
    wait_job,
)
from tests.support.dispatch import GROUP, VERSION, trainjob_made_again, wait_for

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


# ---------------------------------------------------------------- the TrainJob by its UID


@pytest.mark.parametrize("path", ["beat", "watch"])
@pytest.mark.django_db(transaction=True)
def test_a_trainjob_made_again_under_the_jobs_name_and_labels_is_a_strangers(
    path: str, submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any
) -> None:
    """The job's TrainJob is deleted outside dispatch while no cycle runs, and somebody makes another under
    the same name with the same labels and annotations, on another runtime, which completes. Before, the cycle
    took the TrainJob by name and label, so the job read `succeeded` from the stranger's pods. Now it is
    recognised by the UID its start recorded: the job ends as deleted outside dispatch, names the stranger,
    and leaves it alone. (`watch`: the supervisor is down while the TrainJob is replaced, then started.)"""
    runtime_on(None)
    token = submitter[1]
    job_id = _post(token, namespace, {"KWOK_STAY_RUNNING": "1"})
    name = f"{job_id}-1"
    with supervisor_process() if path == "watch" else contextlib.nullcontext():
        if path == "beat":
            supervise_until(token, job_id, lambda d: d["state"] == "running", what="running")
        else:
            wait_job(job_id, lambda j: j.state == JobState.RUNNING, what="running")
    ours = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
    # The start recorded the UID of the TrainJob it created: the one the API server reports.
    recorded = Execution.objects.get(job_id=job_id, attempt=1).trainjob_uid
    assert recorded and recorded == ours["metadata"]["uid"]
    our_pods = {p.metadata.uid for p in pods_of(kube, namespace, job_id)}
    assert len(our_pods) == 2

    stranger = trainjob_made_again(kube, namespace, ours, "team-runtime", {"KWOK_RUN_DURATION": "1s"})
    assert stranger["metadata"]["uid"] != recorded

    def settled() -> bool:
        found = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
        complete = any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in (found.get("status") or {}).get("conditions") or ()
        )
        left = {p.metadata.uid for p in pods_of(kube, namespace, job_id)} & our_pods
        return complete and not left

    # The stranger's TrainJob has completed (the state a cycle must not take) and the job's pods are gone.
    wait_for(settled, timeout=60, what="the stranger's TrainJob Complete, the job's pods gone")
    ended = ("succeeded", "failed", "cancelled")
    if path == "beat":
        data = supervise_until(token, job_id, lambda d: d["state"] in ended, timeout=60, what="ended")
    else:
        with supervisor_process():
            wait_job(job_id, lambda j: j.state not in (JobState.RUNNING, JobState.QUEUED), timeout=60)
        data = get(token, job_id)
    assert (data["state"], data["cause"], data["message"]) == ("cancelled", "cancelled", TRAINJOB_GONE), data
    assert transitions(data)[-1] == ("running", "cancelled"), transitions(data)
    warnings = [w for w in data["supervision_warnings"] if w["object"] == f"TrainJob {namespace}/{name}"]
    assert warnings and "not the TrainJob dispatch created" in warnings[0]["message"], data[
        "supervision_warnings"
    ]
    # The stranger's TrainJob is not dispatch's to delete, and the execution still names its own.
    still = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
    assert still["metadata"]["uid"] == stranger["metadata"]["uid"]
    assert Execution.objects.get(job_id=job_id, attempt=1).trainjob_uid == recorded


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_job_whose_trainjob_was_made_again_leaves_the_strangers_alone(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any
) -> None:
    """The same replacement, and the user cancels the job before any cycle noticed: the cancel deletes what
    dispatch made under the name. The stranger's TrainJob carries the job's labels and dispatch's own
    annotations (its body hash), which passed the ownership check; its UID is not the one the start recorded,
    so it is left alone, and the execution's objects count as removed."""
    runtime_on(None)
    token = submitter[1]
    job_id = _post(token, namespace, {"KWOK_STAY_RUNNING": "1"})
    name = f"{job_id}-1"
    supervise_until(token, job_id, lambda d: d["state"] == "running", what="running")
    ours = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
    stranger = trainjob_made_again(kube, namespace, ours, "team-runtime", {"KWOK_RUN_DURATION": "600s"})
    answer = api(token).post(f"/api/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 202, answer.content
    execution = Execution.objects.get(job_id=job_id, attempt=1)
    wait_for(
        lambda: Execution.objects.get(pk=execution.pk).objects_removed_at is not None,
        timeout=60,
        what="the cancelled execution's objects counted as removed",
    )
    still = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
    assert still["metadata"]["uid"] == stranger["metadata"]["uid"]
    assert "deletionTimestamp" not in still["metadata"]
    assert get(token, job_id)["state"] == "cancelled"


# ---------------------------------------------------------------- 4. the label domain stored with the job


@pytest.mark.django_db(transaction=True)
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
