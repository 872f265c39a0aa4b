"""The job list's new filters (cause, identity warning, window), search by id or name, the capped count."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobs import selectors
from jobs.models import Job, JobState
from tests.jobs.dashboard.test_job_pages import client_for, make_job, page, runtime_body

pytestmark = pytest.mark.django_db


def _listed(html: str, *jobs: Job) -> set[str]:
    return {job.id for job in jobs if f'data-job="{job.id}"' in html}


def test_cause_identity_warning_and_window_filters(oncall_user: Any, plain_user: Any) -> None:
    uma = plain_user[0]
    oom = make_job(uma, state=JobState.FAILED, cause="oom")
    app = make_job(uma, state=JobState.FAILED, cause="app-error")
    warned = make_job(uma, runtime=runtime_body(backoff_limit_per_index=2), allow_rank_restart=True)
    old = make_job(uma, state=JobState.FAILED, cause="app-error")
    Job.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2))
    client = client_for(oncall_user[0])
    everything = (oom, app, warned, old)
    assert _listed(page(client, "/jobs/?cause=app-error"), *everything) == {app.id, old.id}
    assert _listed(page(client, "/jobs/?state=failed&cause=oom"), *everything) == {oom.id}
    assert _listed(page(client, "/jobs/?identity_warning=on"), *everything) == {warned.id}
    assert _listed(page(client, "/jobs/?cause=app-error&window=24h"), *everything) == {app.id}
    assert _listed(page(client, "/jobs/?cause=no-such-cause"), *everything) == set(j.id for j in everything)


def test_search_by_id_or_name(plain_user: Any) -> None:
    sweep = make_job(plain_user[0], display_name="resnet50 lr sweep")
    other = make_job(plain_user[0], display_name="bert finetune")
    client = client_for(plain_user[0])
    assert _listed(page(client, f"/jobs/?q={other.id}"), sweep, other) == {other.id}
    assert _listed(page(client, "/jobs/?q=LR+Sweep"), sweep, other) == {sweep.id}
    assert _listed(page(client, f"/jobs/?q={sweep.id[:6]}"), sweep, other) >= {sweep.id}


def test_the_count_stops_at_the_cap(plain_user: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selectors, "COUNT_CAP", 3)
    for _ in range(4):
        make_job(plain_user[0])
    html = page(client_for(plain_user[0]), "/jobs/")
    assert "more than 3 jobs" in html
    assert html.count("data-job=") == 4  # the page itself is not capped by the count


def test_the_first_page_reads_an_index_not_the_table(plain_user: Any) -> None:
    """The plan PostgreSQL picks for the filtered first page uses the list's indexes (0004)."""
    from django.db import connection

    make_job(plain_user[0], state=JobState.FAILED, cause="oom")
    queryset = selectors.jobs_filtered(plain_user[0], state="failed", cause="oom").order_by(
        "-created_at", "-id"
    )
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")  # a tiny table would be scanned whole otherwise
        try:
            plan = queryset[:51].explain()
        finally:
            cursor.execute("SET enable_seqscan = on")
    assert "job_list_" in plan or "jobs_job_owner" in plan, plan
