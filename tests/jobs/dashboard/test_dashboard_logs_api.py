"""GET /api/v1/jobs/{id}/logs without a cluster: field errors, 404 naming what exists, 503 naming Kubernetes.
The log itself, follow and the 404 for a rank without a pod are in tests/jobs/dashboard/test_logs.py."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.jobs.dashboard.test_job_pages import make_job, runtime_body

pytestmark = pytest.mark.django_db


def test_bad_parameters_are_400_with_field_errors(plain_user: Any, user_api: APIClient) -> None:
    job = make_job(plain_user[0])
    response = user_api.get(f"/api/v1/jobs/{job.id}/logs?tail=0&rank=-1&container=Bad_Name&follow=maybe")
    assert response.status_code == 400
    assert set(response.json()) >= {"tail", "rank", "container", "follow"}


def test_a_refused_job_has_no_pods_to_read(plain_user: Any, user_api: APIClient) -> None:
    job = make_job(plain_user[0], runtime=runtime_body(restart_policy="OnFailure"))
    response = user_api.get(f"/api/v1/jobs/{job.id}/logs")
    assert response.status_code == 404
    assert response.json() == {
        "detail": f"job {job.id} has no attempts (it is refused): no pod ever ran",
        "attempts": [],
    }


def test_an_attempt_that_does_not_exist_is_404_naming_the_attempts(
    plain_user: Any, user_api: APIClient
) -> None:
    job = make_job(plain_user[0])
    response = user_api.get(f"/api/v1/jobs/{job.id}/logs?attempt=3")
    assert response.status_code == 404
    assert response.json() == {"detail": f"job {job.id} has no attempt 3", "attempts": [1]}


def test_unreachable_cluster_is_503_naming_kubernetes(plain_user: Any, user_api: APIClient) -> None:
    job = make_job(plain_user[0])
    response = user_api.get(f"/api/v1/jobs/{job.id}/logs?rank=1")
    assert response.status_code == 503
    assert response.json()["detail"].startswith("Kubernetes is unavailable, the log could not be read:")


def test_someone_elses_job_is_404(user_api: APIClient, make_user: Any) -> None:
    bob = make_user("bob", namespaces=("team-b",))[0]
    job = make_job(bob, namespace="team-b")
    assert user_api.get(f"/api/v1/jobs/{job.id}/logs").status_code == 404


def _rank_pod(name: str, created: str, *, rjob: str = "node", restart: int = 0) -> Any:
    from cluster.logs import PodInfo

    return PodInfo(name, "ns", 1, restart, rjob, "Running", created, ("node",), uid=f"uid-{name}")


def test_two_pods_at_one_ranks_place_answer_neither_unless_the_plan_lets_ranks_be_replaced() -> None:
    """Pure (jobs.logtail.rank_pod): the newest pod of a rank used to answer, so a pod forged into the owner
    chain after the real one was the rank's log. Two pods in one JobSet restart, replicated job and job index
    claim the same place: neither is taken, both are named. A job whose plan warned that ranks restart
    (allowRankRestart) has its replaced pods there by design: the newest answers, as before. Pods of another
    JobSet restart or replicated job are other places."""
    from jobs.logtail import rank_pod

    real = _rank_pod("j-1-node-0-1-bcdfg", "2026-12-03T10:00:00Z")
    forged = _rank_pod("j-1-node-0-1-zzzzz", "2026-12-03T10:00:05Z")
    found = rank_pod([real, forged], rank=1, restart_attempt=None)
    assert found.pod is None and found.claims == (real, forged)
    assert rank_pod([real, forged], rank=1, restart_attempt=None, replaced=True).pod == forged
    older = _rank_pod("j-1-node-0-1-older", "2026-12-03T09:00:00Z", restart=0)
    newer = _rank_pod("j-1-node-0-1-newer", "2026-12-03T09:30:00Z", restart=1)
    assert rank_pod([older, newer], rank=1, restart_attempt=None).pod == newer
    launcher = _rank_pod("j-1-launcher-0-1-x", "2026-12-03T10:00:09Z", rjob="launcher")
    assert rank_pod([real, launcher], rank=1, restart_attempt=None).pod == launcher
