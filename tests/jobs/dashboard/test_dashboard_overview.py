"""The overview (/) through the Django test client: counts per state and cause per window, each a link to
the filtered list that shows exactly those jobs; identity-warned jobs; verdict changes; the supervisor box.

Rows written here are the template's input (what supervision would have stored); the live behaviour is in
tests/browser/test_dashboard.py, driven through the supervisor on the local control plane.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobs.models import Job, JobState, SupervisorCycle
from runtimes.models import RuntimeVerdict
from tests.jobs.dashboard.test_job_pages import client_for, make_job, page, runtime_body

pytestmark = pytest.mark.django_db


def _aged(job: Job, **delta: float) -> Job:
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(**delta))
    return job


def _count(html: str, attribute: str, value: str) -> int:
    match = re.search(rf'<li data-{attribute}="{value}">.*?<strong class="n">(\d+)</strong>', html, re.S)
    assert match, f"no {attribute} {value} on the page"
    return int(match.group(1))


def test_counts_per_state_and_cause_follow_the_window(oncall_user: Any, plain_user: Any) -> None:
    uma = plain_user[0]
    _aged(make_job(uma, state=JobState.FAILED, cause="oom"), minutes=10)
    _aged(make_job(uma, state=JobState.FAILED, cause="app-error"), hours=5)
    _aged(make_job(uma, state=JobState.FAILED, cause="app-error"), days=3)
    _aged(make_job(uma, state=JobState.RUNNING), minutes=30)
    _aged(make_job(uma, state=JobState.SUCCEEDED), days=10)  # outside every window
    client = client_for(oncall_user[0])

    hour = page(client, "/?window=1h")
    assert (_count(hour, "state", "failed"), _count(hour, "state", "running")) == (1, 1)
    assert _count(hour, "cause", "oom") == 1 and 'data-cause="app-error"' not in hour

    day = page(client, "/")  # 24 h by default
    assert _count(day, "state", "failed") == 2 and _count(day, "cause", "app-error") == 1

    week = page(client, "/?window=7d")
    assert _count(week, "state", "failed") == 3 and _count(week, "cause", "app-error") == 2
    assert _count(week, "state", "succeeded") == 0
    # Each count links to the list filtered the same way.
    assert 'href="/jobs/?cause=app-error&amp;window=7d"' in week
    listed = page(client, "/jobs/?cause=app-error&window=7d")
    assert listed.count("data-job=") == 2


def test_a_plain_user_counts_only_their_own_jobs(plain_user: Any, make_user: Any) -> None:
    bob = make_user("bob", namespaces=("team-b",))[0]
    make_job(plain_user[0], state=JobState.FAILED, cause="oom")
    make_job(bob, namespace="team-b", state=JobState.FAILED, cause="oom")
    make_job(bob, namespace="team-b", state=JobState.FAILED, cause="oom")
    html = page(client_for(plain_user[0]), "/")
    assert _count(html, "state", "failed") == 1 and _count(html, "cause", "oom") == 1


def test_jobs_running_under_an_identity_warning_are_listed(oncall_user: Any, plain_user: Any) -> None:
    warned = make_job(plain_user[0], runtime=runtime_body(backoff_limit_per_index=2), allow_rank_restart=True)
    plain = make_job(plain_user[0])
    done = make_job(
        plain_user[0],
        state=JobState.SUCCEEDED,
        runtime=runtime_body(backoff_limit_per_index=2),
        allow_rank_restart=True,
    )
    html = page(client_for(oncall_user[0]), "/")
    section = html[html.index('id="identity-warned"') : html.index('id="verdict-changes"')]
    assert f'data-job="{warned.id}"' in section
    assert plain.id not in section and done.id not in section
    assert "a failed rank can rerun under the same DISPATCH_ATTEMPT" in section


def test_verdict_changes_show_the_verdict_before(oncall_user: Any) -> None:
    ref = {"kind": "ClusterTrainingRuntime", "namespace": "", "name": "torch-big"}
    body = {"metadata": {"name": "torch-big"}}  # the runtime exists (one that never did makes no change)
    RuntimeVerdict.objects.create(**ref, refused=False, verdict={"reasons": []}, runtime=body)
    RuntimeVerdict.objects.create(
        **ref,
        runtime=body,
        refused=True,
        verdict={"reasons": [{"code": "restart-policy", "message": "m", "waived": False}]},
    )
    html = page(client_for(oncall_user[0]), "/")
    section = html[html.index('id="verdict-changes"') :]
    assert "ClusterTrainingRuntime/torch-big" in section
    newest = section[section.index("ClusterTrainingRuntime/torch-big") :]
    assert re.search(r"accepted</span> →\s*<span class=\"badge refused\">refused", newest)
    assert "<code>restart-policy</code>" in newest


def test_supervisor_box_says_when_it_last_ran_and_whether_it_is_late(oncall_user: Any, settings: Any) -> None:
    client = client_for(oncall_user[0])
    assert "never ran" in page(client, "/")
    now = timezone.now()
    SupervisorCycle.objects.create(
        name="supervisor",
        started_at=now,
        finished_at=now - timedelta(seconds=2),
        duration_ms=40,
        api_requests=6,
    )
    html = page(client, "/")
    assert "on time" in html and "6 API requests" in html
    SupervisorCycle.objects.filter(name="supervisor").update(finished_at=now - timedelta(minutes=10))
    assert "late: more than 3" in page(client, "/")


def test_cluster_box_names_an_unreachable_api_server(oncall_user: Any, platform_user: Any) -> None:
    # tests/conftest.py points every non-cluster test at 127.0.0.1:1, where nothing listens. The API server's
    # own error text is the platform role's only (issue 22): on-call reads that it is unreachable.
    html = page(client_for(oncall_user[0]), "/overview/cluster/", **{"HX-Request": "true"})
    assert "unreachable" in html and "127.0.0.1:1" not in html
    html = page(client_for(platform_user[0]), "/overview/cluster/", **{"HX-Request": "true"})
    assert "unreachable" in html and "127.0.0.1:1" in html


def test_overview_needs_a_login() -> None:
    from django.test import Client

    response = Client().get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
