"""The fence (cluster/fence.py, deploy/guard/fence.yaml): an attempt dispatch ended stays ended at the
cluster's door. Found by the short chaos run (tests/scripts/test_chaos.py): right after kube-apiserver
restarted, the JobSet controller, its watch of JobSets still behind, made the Jobs of a TrainJob dispatch had
just deleted again, and the Job controller ran each rank of that ended attempt 4 times. A stale cache cannot
be produced on demand, so these tests stand in for the stale controller with the admin making such a Job
again (the admin is outside every other door, but not this one); the pod it asks for is then created, or
refused, by the real Job controller through the real API server's admission.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

from cluster.errors import Rejected
from cluster.fence import FENCE_LABEL, FENCE_PREFIX, KEEP_SECONDS, fence_add, fence_entries, stale_entries
from jobs.models import Execution
from tests.jobs.supervision.support import supervise_until
from tests.support.cluster import Kube
from tests.support.deploy import DispatchServiceAccount
from tests.support.dispatch import api_as, job_body, submit_job, wait_for

FENCE_POLICY = "dispatch-ended-attempts-stay-ended"


def test_entries_older_than_a_week_go_and_unreadable_ones_too() -> None:
    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    entries = {
        "jaaaaaaaaaa-1": (now - timedelta(seconds=KEEP_SECONDS + 1)).isoformat(),
        "jbbbbbbbbbb-1": (now - timedelta(seconds=KEEP_SECONDS - 60)).isoformat(),
        "jcccccccccc-2": "yesterday",
        "jdddddddddd-3": (now - timedelta(days=30)).replace(tzinfo=None).isoformat(),  # naive: read as UTC
    }
    assert stale_entries(entries, now) == ["jaaaaaaaaaa-1", "jcccccccccc-2", "jdddddddddd-3"]
    annotations = {
        FENCE_PREFIX + "jaaaaaaaaaa-1": "t",
        "dispatch.dev/other": "x",
        "fence.example.com/j-1": "y",
    }
    assert fence_entries(annotations) == {"jaaaaaaaaaa-1": "t"}


def _pod_job(namespace: str, name: str, trainjob: str) -> dict[str, Any]:
    """A Job as the JobSet controller makes one for the TrainJob `trainjob` (its pod template carries the
    JobSet's name), made here by the admin in its stead."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {FENCE_LABEL: trainjob}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "node", "image": "localhost/trainer:v1"}],
                },
            },
        },
    }


def _pods_of(kube: Kube, namespace: str, job: str) -> list[Any]:
    return list(
        kube.core.list_namespaced_pod(namespace, label_selector=f"batch.kubernetes.io/job-name={job}").items
    )


def _refusals(kube: Kube, namespace: str, job: str) -> list[str]:
    events = kube.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={job}").items
    return [e.message or "" for e in events if e.reason == "FailedCreate"]


@pytest.mark.cluster
@pytest.mark.django_db
@pytest.mark.usefixtures("dispatch_kind_allowed")
def test_a_cancelled_attempts_pods_are_refused_even_to_the_job_controller(
    kube: Kube,
    namespace: str,
    guard: list[dict[str, Any]],
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A running job is cancelled through the API; its delete fences the attempt before the TrainJob goes.
    Then the Job controller, asked (as a stale JobSet controller would) to run a Job of that attempt, is
    refused its pod at admission, naming the fence; the same Job for an attempt that did not end gets its
    pod. Without the fence (before this change) both pods were created."""
    assert FENCE_POLICY in {o["metadata"]["name"] for o in guard}
    token = submitter[1]
    job_id = submit_job(
        token, job_body(namespace, env={"KWOK_STAY_RUNNING": "1"}), django_capture_on_commit_callbacks
    )
    supervise_until(token, job_id, lambda d: d["state"] == "running", what="running")
    with django_capture_on_commit_callbacks(execute=True):  # the delete task runs here, with its retries
        cancelled = api_as(token).post(f"/api/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code in (200, 202), cancelled.content
    trainjob = Execution.objects.get(job_id=job_id, attempt=1).trainjob_name
    wait_for(
        lambda: (
            not kube.core.list_namespaced_pod(namespace, label_selector=f"{FENCE_LABEL}={trainjob}").items
        ),
        timeout=90,
        what="the cancelled attempt's pods gone",
    )
    annotations = kube.core.read_namespace(namespace).metadata.annotations or {}
    assert FENCE_PREFIX + trainjob in annotations, annotations

    ended, live = f"{trainjob}-again-0", f"{job_id}-2-again-0"  # (the real Jobs may still be going)
    try:
        for name, of in ((ended, trainjob), (live, f"{job_id}-2")):
            kube.batch.create_namespaced_job(namespace, _pod_job(namespace, name, of))
        wait_for(lambda: _pods_of(kube, namespace, live), timeout=60, what="the live attempt's Job's pod")
        refused = wait_for(lambda: _refusals(kube, namespace, ended), timeout=60, what="a FailedCreate")
        assert any("ended (fenced by dispatch" in m and trainjob in m for m in refused), refused
        assert _pods_of(kube, namespace, ended) == []
    finally:
        for name in (ended, live):
            with contextlib.suppress(Exception):
                kube.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")


@pytest.mark.cluster
@pytest.mark.django_db
def test_dispatchs_account_fences_the_namespaces_it_is_granted_and_no_other(
    kube: Kube,
    namespace: str,
    dispatch_serviceaccount: DispatchServiceAccount,
    on_serviceaccount: DispatchServiceAccount,
) -> None:
    """deploy/rbac's Role lets dispatch annotate its own namespace (the API server authorizes a namespace's
    object in that namespace) and nothing else: with its token, fencing the granted namespace works, the
    plane's `default` (not granted here) is refused."""
    dispatch_serviceaccount.grant(namespace)
    fence_add(namespace, "jfencetest0-1")
    wait_for(
        lambda: (
            FENCE_PREFIX + "jfencetest0-1" in (kube.core.read_namespace(namespace).metadata.annotations or {})
        ),
        timeout=10,
        what="the fence annotation",
    )
    with pytest.raises(Rejected) as refused:
        fence_add("kube-system", "jfencetest0-1")
    assert refused.value.status == 403
