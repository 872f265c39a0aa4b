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
