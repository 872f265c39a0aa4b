"""The job list's new filters (cause, identity warning, window), search by id or name, the capped count."""

from __future__ import annotations

import re
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


# The dashboard's first pages and the index of jobs/migrations/0004 each must be read from. Each case names
# the 0004 index by name: "some index" proved nothing while Django's own single-column indexes (owner_id,
# state, created_at) fitted each query in part (issue 20). Migration 0011 dropped those, as 0004's indexes
# lead with the same columns; the second test drops 0004's indexes and shows none of the names is then read.
FIRST_PAGES: tuple[tuple[str, str, dict[str, Any], str], ...] = (
    ("everybody's jobs", "oncall", {}, "job_list_newest"),
    ("a user's own jobs", "plain", {}, "job_list_owner"),
    ("a user's failed jobs", "plain", {"state": "failed"}, "job_list_owner"),
    ("everybody's failed/oom jobs", "oncall", {"state": "failed", "cause": "oom"}, "job_list_state_cause"),
    ("everybody's oom jobs", "oncall", {"cause": "oom"}, "job_list_cause"),
)
INDEXES_0004 = (
    "job_list_newest",
    "job_list_state",
    "job_list_state_cause",
    "job_list_cause",
    "job_list_namespace",
    "job_list_owner",
    "job_list_runtime",
    "job_list_identity_warned",
)


def _many_jobs(owners: list[Any], count: int = 20_000) -> None:
    """`count` jobs copied in SQL from one real one: 20 owners, 60% succeeded, 25% failed (a tenth of them
    oom), 15% running, one a second apart; then ANALYZE, so the planner knows the table as it would in use."""
    from django.db import connection

    template = make_job(owners[0], state=JobState.SUCCEEDED)
    columns = [f.column for f in Job._meta.concrete_fields]
    overrides = {
        "id": "'k' || lpad(n::text, 10, '0')",
        "owner_id": f"(ARRAY[{', '.join(str(o.pk) for o in owners)}])[1 + mod(n, {len(owners)})]",
        "state": "CASE WHEN mod(n, 20) < 12 THEN 'succeeded' WHEN mod(n, 20) < 17 THEN 'failed' "
        "ELSE 'running' END",
        "cause": "CASE WHEN mod(n, 20) = 12 AND mod(n, 200) < 40 THEN 'oom' "
        "WHEN mod(n, 20) BETWEEN 12 AND 16 THEN 'app-error' ELSE '' END",
        "created_at": "now() - n * interval '1 second'",
    }
    select = ", ".join(overrides.get(c, c) for c in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO jobs_job ({', '.join(columns)}) SELECT {select} "
            f"FROM jobs_job, generate_series(1, %s) AS n WHERE jobs_job.id = %s",
            [count, template.id],
        )
        cursor.execute("ANALYZE jobs_job")
        cursor.execute("ANALYZE auth_user")


def _first_page_plans(users: dict[str, Any]) -> dict[str, str]:
    return {
        name: selectors.jobs_filtered(users[who], **filters).order_by("-created_at", "-id")[:51].explain()
        for name, who, filters, _ in FIRST_PAGES
    }


def _users(oncall_user: Any, plain_user: Any) -> dict[str, Any]:
    from django.contrib.auth.models import User

    others = [User.objects.create(username=f"owner-{n}") for n in range(19)]
    _many_jobs([plain_user[0], *others])
    return {"plain": plain_user[0], "oncall": oncall_user[0]}


def test_the_first_pages_read_the_list_indexes_of_0004(oncall_user: Any, plain_user: Any) -> None:
    plans = _first_page_plans(_users(oncall_user, plain_user))
    for name, _, _, index in FIRST_PAGES:
        # An Index Scan, or a Bitmap Index Scan when the planner also ANDs in another index (seen in CI).
        assert re.search(rf"Index Scan (using|on) {index} ", plans[name]), f"{name}: {plans[name]}"


def test_without_0004_the_planner_reads_other_indexes(oncall_user: Any, plain_user: Any) -> None:
    """What the test above would meet without migration 0004 (its indexes dropped inside this test's
    transaction): none of the names it asserts."""
    from django.db import connection

    users = _users(oncall_user, plain_user)
    with connection.cursor() as cursor:
        for index in INDEXES_0004:
            cursor.execute(f"DROP INDEX {index}")
        cursor.execute("ANALYZE jobs_job")
    plans = _first_page_plans(users)
    for name, _, _, index in FIRST_PAGES:
        assert index not in plans[name], f"{name}: {plans[name]}"
