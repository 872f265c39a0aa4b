"""Data migrations, run forwards on the real database with a row written before them."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.test import APIClient

from jobs.models import Job as CurrentJob

pytestmark = pytest.mark.django_db(transaction=True)


def _migrate(target: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target)
    return executor.loader.project_state(target).apps


def test_a_job_recorded_with_the_old_empty_evidence_answers_a_list(platform_user: Any) -> None:
    """Job.evidence's first default was {}: a job recorded then reads as [] (one shape for every client)."""
    old = _migrate([("jobs", "0005_reliability")])
    try:
        Job = old.get_model("jobs", "Job")
        Job.objects.create(
            id="jaaaaaaaaaa",
            owner_id=platform_user[0].pk,
            namespace="team-a",
            runtime_kind="ClusterTrainingRuntime",
            runtime_name="dispatch-kind",
            spec={},
            evidence={},
        )
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {platform_user[1]}")
    response = client.get("/api/v1/jobs/jaaaaaaaaaa")
    assert response.status_code == 200, response.content
    assert response.json()["evidence"] == []
    # Every reader (the API, the job page, exports) sees the list the row now holds.
    assert CurrentJob.objects.get(pk="jaaaaaaaaaa").evidence == []


def test_a_job_recorded_before_jobs_stored_their_label_domain_keeps_the_domain_of_its_objects(
    platform_user: Any,
) -> None:
    """Jobs from before Job.label_domain have "": migration 0008 gives them the site's domain of the day (the
    one their objects carry), so nothing reads the site's current domain for a job any more."""
    old = _migrate([("jobs", "0007_session_security"), ("runtimes", "0004_allow_list_review")])
    try:
        Job = old.get_model("jobs", "Job")
        SiteSettings = old.get_model("runtimes", "SiteSettings")
        SiteSettings.objects.update_or_create(pk=1, defaults={"label_domain": "platform.example"})
        Job.objects.create(
            id="jbbbbbbbbbb",
            owner_id=platform_user[0].pk,
            namespace="team-a",
            runtime_kind="ClusterTrainingRuntime",
            runtime_name="dispatch-kind",
            spec={},
            label_domain="",
        )
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    assert CurrentJob.objects.get(pk="jbbbbbbbbbb").label_domain == "platform.example"
