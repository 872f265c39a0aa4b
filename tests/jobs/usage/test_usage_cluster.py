"""Usage end to end on the real control plane (issue 36's "done when"): two 2-node jobs with one GPU per node,
one running 20 s and succeeding, one running 10 s and failing with exit 3, submitted through the API and
supervised by the beat's cycle. The GPU-seconds the usage API answers (after the beat's rollup) match those
this test computes itself from the pods' container start and finish times, read from the cluster."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from dispatch_site import roles
from dispatch_site.services import user_create
from jobs.models import Execution, Job, JobState
from jobs.supervision import cycle
from jobs.usage.tasks import usage_rollup
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]

GPU = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
TERMINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


def _seconds(start: datetime | None, end: datetime | None) -> float:
    return (end - start).total_seconds() if start and end else 0.0


def test_usage_matches_the_gpu_seconds_read_from_the_pods(
    submitter: tuple[User, str],
    namespace: str,
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
    kube: Any,
) -> None:
    namespaced_runtime()
    api = _api(submitter[1])

    def submit(env: dict[str, str]) -> str:
        body = {
            "runtime": {"kind": "TrainingRuntime", "name": "team-runtime"},
            "namespace": namespace,
            "image": "localhost/trainer:v1",
            "num_nodes": 2,
            "resources_per_node": GPU,
            "env": env,
        }
        with django_capture_on_commit_callbacks(execute=True):
            response = api.post("/api/v1/jobs", body, format="json")
        assert response.status_code == 202, response.json()
        job_id: str = response.json()["id"]
        return job_id

    ok = submit({"KWOK_RUN_DURATION": "20s"})
    bad = submit({"KWOK_RUN_DURATION": "10s", "KWOK_EXIT_CODE": "3"})

    # The pods as the cluster reports them, read by this test (never through dispatch): uid -> (GPUs, ran s).
    seen: dict[str, tuple[str, float, float]] = {}

    def read_pods() -> None:
        for pod in kube.core.list_namespaced_pod(namespace).items:
            job = (pod.metadata.labels or {}).get("dispatch.dev/job")
            node = next((s for s in pod.status.container_statuses or () if s.name == "node"), None)
            if job is None or node is None:
                continue
            gpus = float(
                next(c for c in pod.spec.containers if c.name == "node").resources.limits["nvidia.com/gpu"]
            )
            done = node.state.terminated
            ran = _seconds(done.started_at, done.finished_at) if done else 0.0
            seen[pod.metadata.uid] = (job, gpus, ran)

    # While a job runs, its attempt's GPU-hours so far show under the cause `running` (measured until now).
    running_seen: list[float] = []

    def ended() -> bool:
        cycle.supervise()
        read_pods()
        if Job.objects.get(pk=ok).state == JobState.RUNNING:
            rows = api.get("/api/v1/usage", {"group_by": "cause", "namespace": namespace}).json()["results"]
            running_seen.extend(r["gpu_hours"] for r in rows if r["cause"] == "running")
        return {Job.objects.get(pk=j).state for j in (ok, bad)} <= TERMINAL

    wait_for(ended, timeout=120, interval=1, what="both jobs ended, as supervision sees them")
    assert Job.objects.get(pk=ok).state == JobState.SUCCEEDED
    assert Job.objects.get(pk=bad).state == JobState.FAILED and Job.objects.get(pk=bad).cause == "app-error"
    expected = {j: sum(g * s for job, g, s in seen.values() if job == j) for j in (ok, bad)}
    assert expected[ok] >= 2 * 18 and expected[bad] >= 2 * 8, seen  # every rank pod's run was read

    assert running_seen and max(running_seen) > 0, running_seen  # the running job's GPU-hours grew
    assert max(running_seen) * 3600 <= expected[ok] + expected[bad] + 5

    # Ended, not counted by the beat's rollup yet: the answer measures them already, and the same after.
    [early] = api.get("/api/v1/usage", {"group_by": "namespace", "namespace": namespace}).json()["results"]
    rolled = usage_rollup.apply().result
    assert rolled == 2  # both attempts, once each
    assert usage_rollup.apply().result == 0  # a second run counts nothing again

    answer = api.get("/api/v1/usage", {"group_by": "namespace", "namespace": namespace})
    assert answer.status_code == 200, answer.content
    [row] = answer.json()["results"]
    assert row["namespace"] == namespace
    assert row["gpu_hours"] * 3600 == pytest.approx(expected[ok] + expected[bad], rel=0.25)
    assert row["gpu_hours_lost"] * 3600 == pytest.approx(expected[bad], rel=0.25)
    assert row["jobs"] == 2 and row["attempts"] == 2
    assert row["queue_wait_p50_seconds"] is not None
    assert (early["gpu_hours"], early["jobs"], early["attempts"]) == pytest.approx((row["gpu_hours"], 2, 2))

    by_cause = api.get("/api/v1/usage", {"group_by": "cause", "namespace": namespace}).json()["results"]
    assert {r["cause"]: r["gpu_hours_lost"] > 0 for r in by_cause} == {"app-error": True, "succeeded": False}

    # The job page's attempt shows its own GPU-hours and queue wait.
    attempt = api.get(f"/api/v1/jobs/{ok}").json()["executions"][0]
    assert attempt["gpu_hours"] * 3600 == pytest.approx(expected[ok], rel=0.25)
    assert attempt["queue_wait_seconds"] is not None

    spreadsheet = api.get("/api/v1/usage", {"group_by": "namespace", "namespace": namespace, "format": "csv"})
    assert spreadsheet.status_code == 200 and spreadsheet["Content-Type"].startswith("text/csv")
    lines = list(csv.DictReader(io.StringIO(spreadsheet.content.decode())))
    assert [(r["namespace"], float(r["gpu_hours"]), r["jobs"]) for r in lines] == [
        (namespace, row["gpu_hours"], "2")
    ]

    # Scoped like every read: a user granted another namespace sees none of it; on-call sees it.
    _, stranger = user_create(username=f"eve-{namespace[-6:]}", role=roles.USER, namespaces=["elsewhere"])
    assert _api(stranger).get("/api/v1/usage", {"namespace": namespace}).json()["results"] == []
    _, oncall = user_create(username=f"oli-{namespace[-6:]}", role=roles.ONCALL)
    assert [r["namespace"] for r in _api(oncall).get("/api/v1/usage").json()["results"]] == [namespace]
    assert Execution.objects.filter(job_id__in=(ok, bad), usage_rolled_at__isnull=True).count() == 0


def test_a_bad_usage_query_is_a_400_naming_the_field(submitter: tuple[User, str]) -> None:
    api = _api(submitter[1])
    assert api.get("/api/v1/usage", {"group_by": "colour"}).json().keys() == {"group_by"}
    answer = api.get("/api/v1/usage", {"since": "2026-12-10", "until": "2026-12-01"})
    assert answer.status_code == 400 and "since" in answer.json()
    assert api.get("/api/v1/usage", {"step": "hour"}).status_code == 400
    assert api.get("/api/v1/usage", {"until": "yesterday"}).json().keys() == {"until"}
    early = api.get("/api/v1/usage", {"until": "0001-01-02"})  # the default 30 days end at the first day
    assert early.status_code == 200 and early.json()["since"] == "0001-01-01"
