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


def test_allow_list_entries_from_before_reviews_covered_metadata_serve_only_once_re_approved(
    platform_user: Any,
) -> None:
    """Entries allow-listed by name only, or with their spec's digest alone, never had their labels and
    annotations reviewed (dispatch's exec-containers annotation among them): migration runtimes 0006 marks
    them stale, and the rule checker refuses them until a platform user re-approves (issue 33)."""
    from runtimes.digest import spec_digest
    from runtimes.models import AllowListEntry
    from runtimes.rules import check_runtime
    from tests.support.dispatch import runtime_body

    body = runtime_body("ClusterTrainingRuntime", "old-by-spec")
    old = _migrate([("runtimes", "0005_session_cap")])
    try:
        Entry = old.get_model("runtimes", "AllowListEntry")
        Entry.objects.create(kind="ClusterTrainingRuntime", namespace="", name="old-by-name", review="name")
        Entry.objects.create(
            kind="ClusterTrainingRuntime",
            namespace="",
            name="old-by-spec",
            review="content",
            reviewed_hash=spec_digest(body),
            reviewed_spec=body["spec"],
        )
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    for entry in AllowListEntry.objects.filter(name__startswith="old-by-"):
        assert entry.review == "stale", entry.name
        verdict = check_runtime(body, allow_listed=True, review=entry.as_review())
        assert verdict.refused and verdict.codes == ("runtime-changed-since-review",), entry.name
        assert "re-approves it" in verdict.reasons[0].message
