"""The refusals page: every refused job and refused allow-listed runtime, grouped by code, with the meaning
and the fix of each code, filterable; and the one table of fixes covers every code."""

from __future__ import annotations

from typing import Any

import pytest

from jobs import plan
from runtimes import reasons
from runtimes.fixes import FIXES
from runtimes.models import AllowListEntry, RuntimeVerdict
from tests.jobs.dashboard.test_job_pages import client_for, make_job, page, runtime_body

pytestmark = pytest.mark.django_db


def test_every_reason_code_has_a_meaning_and_a_fix() -> None:
    codes = [*reasons.REASON_CODES, *plan.START_ONLY_CODES]
    assert {plan.NAME_TOO_LONG, plan.QUEUE_NOT_FOUND, plan.PRIORITY_CLASS_NOT_ALLOWED} <= set(codes)
    assert sorted(FIXES) == sorted(codes)
    for code in codes:
        assert FIXES[code].meaning and FIXES[code].fix


def _section(html: str, code: str) -> str:
    start = html.index(f'id="code-{code}"')
    end = html.find("</section>", start)
    return html[start:end]


def test_refused_jobs_and_runtimes_are_grouped_by_code_with_the_fix(
    oncall_user: Any, plain_user: Any
) -> None:
    both = make_job(
        plain_user[0], runtime=runtime_body(restart_policy="OnFailure", backoff_limit_per_index=2)
    )
    one = make_job(plain_user[0], runtime=runtime_body(restart_policy="OnFailure"), runtime_name="torch-a100")
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="mpi-big", for_jobs=True)
    RuntimeVerdict.objects.create(
        kind="ClusterTrainingRuntime",
        name="mpi-big",
        refused=True,
        verdict={
            "reasons": [{"code": "restart-policy", "message": "restartPolicy is OnFailure", "waived": False}]
        },
    )
    html = page(client_for(oncall_user[0]), "/refusals/")
    restart = _section(html, "restart-policy")
    assert f'data-job="{both.id}"' in restart and f'data-job="{one.id}"' in restart
    assert "2 jobs, 1 runtime" in restart
    assert "ClusterTrainingRuntime/mpi-big" in restart and "restartPolicy is OnFailure" in restart
    assert FIXES["restart-policy"].fix in restart.replace("&#x27;", "'")
    per_index = _section(html, "backoff-limit-per-index")
    assert f'data-job="{both.id}"' in per_index and one.id not in per_index
    # The most frequent code comes first.
    assert html.index('id="code-restart-policy"') < html.index('id="code-backoff-limit-per-index"')


def test_filters_narrow_the_refusals(oncall_user: Any, plain_user: Any, make_user: Any) -> None:
    bob = make_user("bob", namespaces=("team-b",))[0]
    mine = make_job(
        plain_user[0], runtime=runtime_body(restart_policy="OnFailure", backoff_limit_per_index=2)
    )
    theirs = make_job(bob, namespace="team-b", runtime=runtime_body(restart_policy="OnFailure"))
    client = client_for(oncall_user[0])
    by_code = page(client, "/refusals/?code=backoff-limit-per-index")
    assert mine.id in by_code and theirs.id not in by_code and 'id="code-restart-policy"' not in by_code
    by_namespace = page(client, "/refusals/?namespace=team-b")
    assert theirs.id in by_namespace and mine.id not in by_namespace
    by_owner = page(client, "/refusals/?owner=uma")
    assert mine.id in by_owner and theirs.id not in by_owner
    assert "Nothing refused matches these filters." in page(client, "/refusals/?runtime=nothing-like-it")


def test_a_plain_user_sees_only_their_own_refused_jobs(plain_user: Any, make_user: Any) -> None:
    bob = make_user("bob", namespaces=("team-b",))[0]
    mine = make_job(plain_user[0], runtime=runtime_body(restart_policy="OnFailure"))
    theirs = make_job(bob, namespace="team-b", runtime=runtime_body(restart_policy="OnFailure"))
    html = page(client_for(plain_user[0]), "/refusals/?owner=bob")  # owner is not a filter for them
    assert mine.id in html and theirs.id not in html
