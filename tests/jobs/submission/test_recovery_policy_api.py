"""The site's recovery policy over REST: platform sets it (audited), everybody reads it, bad input is a 400
naming the field; a job's own policy is validated the same way. (Which failure starts attempt A+1 is tested
in tests/jobs/test_recovery.py and, against the cluster, tests/jobs/supervision/test_supervision.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from dispatch_site.models import AuditEvent
from runtimes.models import SiteSettings

pytestmark = pytest.mark.django_db


def test_platform_sets_the_site_recovery_policy_and_everyone_reads_it(
    platform_api: APIClient, user_api: APIClient
) -> None:
    policy = {
        "retry": {"preempted": 5, "oom": 1},
        "backoff_seconds": {"preempted": 30},
        "budgets": {"user": 1},
    }
    response = platform_api.patch("/api/v1/settings", {"recovery_policy": policy}, format="json")
    assert response.status_code == 200, response.json()
    assert SiteSettings.load().recovery_policy == policy
    assert user_api.get("/api/v1/settings").json()["recovery_policy"] == policy
    event = AuditEvent.objects.get(action="settings.update")
    assert event.details["recovery_policy"]["to"] == policy
    assert user_api.patch("/api/v1/settings", {"recovery_policy": {}}, format="json").status_code == 403


@pytest.mark.parametrize(
    ("policy", "path"),
    [
        ({"retry": {"cancelled": 1}}, ("retry", "cancelled")),
        ({"retry": {"preempted": -1}}, ("retry", "preempted")),
        ({"retry": {"preempted": "3"}}, ("retry", "preempted")),
        ({"backoff_seconds": {"preempted": 99999}}, ("backoff_seconds", "preempted")),
        ({"budgets": {"infra": 1}}, ("budgets",)),
        ({"budgets": {"user": 100}}, ("budgets", "user")),
        ({"retries": {}}, ("retries",)),
    ],
)
def test_a_bad_site_policy_is_400_naming_the_field(
    platform_api: APIClient, policy: Any, path: tuple[str, ...]
) -> None:
    response = platform_api.patch("/api/v1/settings", {"recovery_policy": policy}, format="json")
    assert response.status_code == 400
    errors = response.json()["recovery_policy"]
    for key in path[:-1]:
        errors = errors[key]
    assert path[-1] in errors, response.json()
    assert SiteSettings.load().recovery_policy == {}
    assert not AuditEvent.objects.filter(action="settings.update").exists()


def test_a_bad_job_policy_is_400_and_records_nothing(user_api: APIClient) -> None:
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": "team-a",
        "image": "localhost/trainer:v1",
        "recovery_policy": {"backoff_seconds": {"identity-violation": 5}},
    }
    response = user_api.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 400
    assert "identity-violation" in response.json()["recovery_policy"]["backoff_seconds"]
