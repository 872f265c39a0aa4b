"""The live parts of the job page and the job list poll with the ETag they were rendered with: while nothing
changed the poll answers 304 with no body, and costs fewer queries than rendering the part (what every poll
cost before); a change (a transition, a timeline entry, a new job) answers 200 with a new ETag.
GET /api/v1/jobs/{id} answers If-None-Match the same way."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from dispatch_site import roles
from jobs.models import Job, JobEvent, JobState
from tests.jobs.dashboard.test_job_pages import make_job

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


def _poll(client: Client, url: str, etag: str = "") -> tuple[Any, int]:
    headers = dict(HTMX)
    if etag:
        headers["If-None-Match"] = etag
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, headers=headers)
    return response, len(queries)


@pytest.fixture
def olive(make_user: Any) -> Client:
    user, _ = make_user("olive", roles.ONCALL)
    client = Client()
    client.force_login(user)
    return client


def test_an_unchanged_job_page_poll_is_a_304_that_costs_less_than_rendering(
    make_user: Any, olive: Client
) -> None:
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    job = make_job(uma, state=JobState.RUNNING)
    url = f"/jobs/{job.pk}/"
    full, full_queries = _poll(olive, url)
    assert full.status_code == 200 and full["ETag"]
    assert full["ETag"].strip('"') in full.content.decode()
    same, same_queries = _poll(olive, url, full["ETag"])
    assert same.status_code == 304 and same.content == b""
    assert same_queries < full_queries, (same_queries, full_queries)
    # A timeline entry alone (no change to the job row) changes it; so does a transition.
    JobEvent.objects.create(job=job, attempt=1, kind="delete-pending", message="could not delete yet")
    after_event, _ = _poll(olive, url, full["ETag"])
    assert after_event.status_code == 200 and after_event["ETag"] != full["ETag"]
    # As every writer does (jobs.submission, jobs.supervision): compare-and-set with updated_at.
    Job.objects.filter(pk=job.pk).update(state=JobState.FAILED, cause="oom", updated_at=timezone.now())
    after_transition, _ = _poll(olive, url, after_event["ETag"])
    assert after_transition.status_code == 200 and b'data-state="failed"' in after_transition.content


def test_an_unchanged_job_list_poll_is_a_304_until_the_feed_moves(make_user: Any, olive: Client) -> None:
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    make_job(uma, state=JobState.RUNNING)
    first, first_queries = _poll(olive, "/jobs/?state=running")
    assert first.status_code == 200
    again, again_queries = _poll(olive, "/jobs/?state=running", first["ETag"])
    assert again.status_code == 304 and again_queries < first_queries, (again_queries, first_queries)
    make_job(uma, state=JobState.PENDING)  # a submission: a new change in the feed
    moved, _ = _poll(olive, "/jobs/?state=running", first["ETag"])
    assert moved.status_code == 200 and moved["ETag"] != first["ETag"]
    # Another user's view of the same URL has its own ETag.
    uma_client = Client()
    uma_client.force_login(uma)
    assert _poll(uma_client, "/jobs/?state=running", moved["ETag"])[0].status_code == 200


def test_the_api_answers_if_none_match_with_304(make_user: Any) -> None:
    uma, token = make_user("uma", roles.USER, ("team-a",))
    job = make_job(uma, state=JobState.RUNNING)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    first = api.get(f"/api/v1/jobs/{job.pk}")
    assert first.status_code == 200 and first["ETag"].startswith('"')
    with CaptureQueriesContext(connection) as cached:
        same = api.get(f"/api/v1/jobs/{job.pk}", HTTP_IF_NONE_MATCH=first["ETag"])
    assert same.status_code == 304 and same.content == b""
    with CaptureQueriesContext(connection) as rendered:
        api.get(f"/api/v1/jobs/{job.pk}")
    assert len(cached) < len(rendered)
    assert (
        api.get(f"/api/v1/jobs/{job.pk}", HTTP_IF_NONE_MATCH='W/"other", ' + first["ETag"]).status_code == 304
    )
    Job.objects.filter(pk=job.pk).update(
        state=JobState.SUCCEEDED
    )  # update() as services do: updated_at moves
    Job.objects.filter(pk=job.pk).update(updated_at=Job.objects.get(pk=job.pk).updated_at)
    JobEvent.objects.create(
        job=job, attempt=1, kind="transition", from_state="running", to_state="succeeded", message=""
    )
    changed = api.get(f"/api/v1/jobs/{job.pk}", HTTP_IF_NONE_MATCH=first["ETag"])
    assert changed.status_code == 200 and changed.json()["state"] == "succeeded"
