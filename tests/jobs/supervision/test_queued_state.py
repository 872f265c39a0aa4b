"""Issue 18, supervision: an old FailedCreate does not pin a job at queued, and a job that ran never reads
`queued` again.

Each test takes the user's path (POST /api/v1/jobs, then supervision cycles: the beat's code, or the
`manage.py supervise` loop with its watches) on the real local control plane, and proves the interleaving it
is about happened by waiting on the state that shows it. Where a controller must be held between two of its
steps, the test pauses that process of this worktree's control plane (support.paused).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.jobs.supervision.support import (
    _job_conditions,
    body,
    paused,
    pods_of,
    running_pods,
    submit,
    supervise_until,
    transitions,
)
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster]


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
