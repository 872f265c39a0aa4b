"""The dashboard's job pages through the Django test client: the list, the status page on-call reads, cancel.

Jobs are built from real plans (jobs.plan.build_plan over the spec's example runtime), so the pages render
the reasons, identity warnings, images and objects the service would have stored.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from jobs.models import Execution, Job, JobEvent, JobState
from jobs.naming import new_job_id
from jobs.plan import build_plan
from jobs.spec import JobSpec
from runtimes.reasons import SiteRules

pytestmark = pytest.mark.django_db

RUNTIME_FIXTURE = Path(__file__).parents[2] / "fixtures" / "dispatch-kind.yaml"
HTMX = {"HX-Request": "true"}
# Evidence as supervision stores it: a list of {object, field, value, at}.
OOM_EVIDENCE = [
    {
        "object": "Pod team-a/{job}-1-node-0-1-x7k2p",
        "field": "status.containerStatuses[node].lastState.terminated.reason",
        "value": "OOMKilled",
        "at": "2026-01-05T12:04:31Z",
    }
]


def runtime_body(
    *, restart_policy: str = "Never", backoff_limit_per_index: int | None = None
) -> dict[str, Any]:
    """The spec's example runtime, optionally broken in the ways the rules refuse or waive."""
    body: dict[str, Any] = yaml.safe_load(RUNTIME_FIXTURE.read_text())
    trainer = body["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    trainer["template"]["spec"]["restartPolicy"] = restart_policy
    if backoff_limit_per_index is not None:
        trainer["backoffLimitPerIndex"] = backoff_limit_per_index
    return body


def make_job(
    owner: User,
    *,
    state: str = JobState.RUNNING,
    cause: str = "",
    message: str = "",
    evidence: list[dict[str, Any]] | None = None,
    runtime: dict[str, Any] | None = None,
    allow_rank_restart: bool = False,
    namespace: str = "team-a",
    runtime_name: str = "dispatch-kind",
    display_name: str = "",
) -> Job:
    """A job as job_submit would record it (refused when the plan is), then moved to `state`."""
    job_id = new_job_id()
    spec = JobSpec.from_dict(
        {
            "runtime": {"kind": "ClusterTrainingRuntime", "name": runtime_name},
            "namespace": namespace,
            "image": "registry.example.com/team-a/train:1",
            "num_nodes": 2,
            **({"display_name": display_name} if display_name else {}),
        }
    )
    body = runtime if runtime is not None else runtime_body()
    plan = build_plan(
        spec=spec,
        runtime=body,
        rules=SiteRules(allow_rank_restart=allow_rank_restart),
        allow_listed=True,
        namespace_granted=True,
        job_id=job_id,
        attempt=1,
        label_domain="dispatch.example.com",
        trainer_version="v2.3.0",
    )
    data = plan.to_dict()
    refused = plan.refused
    job = Job.objects.create(
        id=job_id,
        owner=owner,
        namespace=namespace,
        display_name=display_name,
        runtime_kind="ClusterTrainingRuntime",
        runtime_name=runtime_name,
        spec=spec.to_dict(),
        plan=data,
        runtime_snapshot=copy.deepcopy(body),
        reasons=[r for r in data["reasons"] if not r["waived"]] if refused else [],
        identity_warnings=data["identity_warnings"],
        state=JobState.REFUSED if refused else state,
        cause=cause,
        message=("refused: " + ", ".join(plan.codes)) if refused else message,
        evidence=[{k: v.format(job=job_id) for k, v in item.items()} for item in evidence or []],
        current_attempt=0 if refused else 1,
    )
    if refused:
        JobEvent.objects.create(job=job, kind="refused", message=job.message)
        return job
    now = timezone.now()
    Execution.objects.create(
        job=job,
        attempt=1,
        trainjob_name=plan.names.train_job,
        state=state,
        cause=cause,
        submitted_at=None if state == JobState.PENDING else now,
        finished_at=now if job.is_terminal else None,
    )
    JobEvent.objects.create(job=job, kind="accepted", message="accepted; starting execution 1")
    JobEvent.objects.create(
        job=job, attempt=1, kind="created", message=f"created TrainJob {plan.names.train_job}"
    )
    return job


@pytest.fixture
def other_user(make_user: Callable[..., tuple[User, str]]) -> User:
    return make_user("bob", namespaces=("team-b",))[0]


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page(client: Client, url: str, **headers: str) -> str:
    response = client.get(url, headers=headers)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


# --- the list ---------------------------------------------------------------------------------------------


def test_plain_user_lists_only_their_own_jobs(plain_user: Any, other_user: User) -> None:
    mine = make_job(plain_user[0], display_name="my sweep")
    theirs = make_job(other_user, namespace="team-b")
    html = page(client_for(plain_user[0]), "/jobs/")
    assert mine.id in html and "my sweep" in html
    assert theirs.id not in html
    # Owner is a filter only for those who read everybody's jobs.
    assert 'name="owner"' not in html


@pytest.mark.parametrize("reader", ["oncall_user", "platform_user"])
def test_oncall_and_platform_list_every_job(
    reader: str, request: pytest.FixtureRequest, plain_user: Any, other_user: User
) -> None:
    jobs = [make_job(plain_user[0]), make_job(other_user, namespace="team-b")]
    html = page(client_for(request.getfixturevalue(reader)[0]), "/jobs/")
    assert all(job.id in html for job in jobs)
    assert 'name="owner"' in html


def test_list_shows_state_typed_cause_and_refusal_codes(oncall_user: Any, plain_user: Any) -> None:
    failed = make_job(plain_user[0], state=JobState.FAILED, cause="oom", evidence=OOM_EVIDENCE)
    refused = make_job(plain_user[0], runtime=runtime_body(restart_policy="OnFailure"))
    html = page(client_for(oncall_user[0]), "/jobs/")
    assert f'data-job="{failed.id}"' in html
    assert '<span class="badge failed" data-state="failed">failed</span>' in html
    assert 'data-cause="oom">oom</span>' in html
    assert refused.state == JobState.REFUSED
    assert '<span class="badge refused" data-state="refused">refused</span>' in html
    assert ">restart-policy</code>" in html


def test_list_is_newest_first(plain_user: Any) -> None:
    older = make_job(plain_user[0])
    newer = make_job(plain_user[0])
    html = page(client_for(plain_user[0]), "/jobs/")
    assert html.index(newer.id) < html.index(older.id)


def test_filters_narrow_the_list(oncall_user: Any, plain_user: Any, other_user: User) -> None:
    running = make_job(plain_user[0], state=JobState.RUNNING)
    failed = make_job(plain_user[0], state=JobState.FAILED, cause="app-error")
    elsewhere = make_job(other_user, namespace="team-b", runtime_name="torch-big")
    client = client_for(oncall_user[0])

    def listed(query: str) -> set[str]:
        html = page(client, f"/jobs/?{query}")
        return {job.id for job in (running, failed, elsewhere) if f'data-job="{job.id}"' in html}

    assert listed("state=failed") == {failed.id}
    assert listed("namespace=team-b") == {elsewhere.id}
    assert listed("runtime=torch-big") == {elsewhere.id}
    assert listed("owner=uma") == {running.id, failed.id}
    assert listed("owner=uma&state=running") == {running.id}
    assert listed("state=no-such-state") == {running.id, failed.id, elsewhere.id}
    assert "No job matches these filters." in page(client, "/jobs/?owner=nobody")


def test_list_pages_by_50_with_cursors_keeping_the_filters(plain_user: Any) -> None:
    jobs = [make_job(plain_user[0], state=JobState.QUEUED) for _ in range(51)]
    make_job(plain_user[0], state=JobState.RUNNING)  # filtered out on every page
    client = client_for(plain_user[0])
    html = page(client, "/jobs/?state=queued")
    assert html.count("data-job=") == 50
    assert "51 matching jobs" in html
    older = re.search(r'href="(\?state=queued&amp;after=[^"]+)" id="older"', html)
    assert older is not None and 'id="newer"' not in html
    second = page(client, "/jobs/" + older.group(1).replace("&amp;", "&"))
    # The oldest job is alone on page 2; page 1 had the 50 newer ones.
    assert second.count("data-job=") == 1 and f'data-job="{jobs[0].id}"' in second
    assert 'id="older"' not in second
    newer = re.search(r'href="(\?state=queued&amp;before=[^"]+)" id="newer"', second)
    assert newer is not None
    back = page(client, "/jobs/" + newer.group(1).replace("&amp;", "&"))
    assert back.count("data-job=") == 50 and f'data-job="{jobs[0].id}"' not in back
    assert f'data-job="{jobs[1].id}"' in back and f'data-job="{jobs[-1].id}"' in back


def test_a_cursor_that_is_not_one_shows_the_first_page(plain_user: Any) -> None:
    job = make_job(plain_user[0])
    html = page(client_for(plain_user[0]), "/jobs/?after=not-a-cursor&before=%%%")
    assert f'data-job="{job.id}"' in html


def test_htmx_poll_of_the_list_returns_only_the_rows(plain_user: Any) -> None:
    job = make_job(plain_user[0])
    client = client_for(plain_user[0])
    response = client.get("/jobs/?state=running", headers=HTMX)
    html = response.content.decode()
    assert html.lstrip().startswith('<tbody id="job-rows"')
    assert "<html" not in html and "job-filters" not in html
    assert f'data-job="{job.id}"' in html
    # The rows keep polling the same filtered URL.
    assert 'hx-get="/jobs/?state=running"' in html and 'hx-trigger="every 5s"' in html
    assert "HX-Request" in response["Vary"]


# --- the status page --------------------------------------------------------------------------------------


def test_status_page_shows_cause_with_its_evidence(plain_user: Any) -> None:
    job = make_job(
        plain_user[0],
        state=JobState.FAILED,
        cause="oom",
        evidence=OOM_EVIDENCE,
        message="rank 1 was OOMKilled",
    )
    html = page(client_for(plain_user[0]), f"/jobs/{job.id}/")
    assert 'id="job-state" data-state="failed">failed</span>' in html
    assert 'data-cause="oom">oom</span>' in html
    assert "rank 1 was OOMKilled" in html
    assert f"Pod team-a/{job.id}-1-node-0-1-x7k2p" in html
    assert "status.containerStatuses[node].lastState.terminated.reason" in html
    assert "<code>OOMKilled</code>" in html
    # Executions, timeline, image placement and the objects as YAML.
    assert f"<code>{job.id}-1</code>" in html
    assert "created TrainJob" in html
    assert "<code>registry.example.com/team-a/train:1</code>" in html
    assert "kind: TrainJob" in html and "kind: TrainingRuntime" in html
    assert "<details" in html


def test_status_page_of_a_refused_job_names_every_reason(plain_user: Any) -> None:
    job = make_job(plain_user[0], runtime=runtime_body(restart_policy="OnFailure", backoff_limit_per_index=2))
    html = page(client_for(plain_user[0]), f"/jobs/{job.id}/")
    assert "Why it was refused" in html
    for reason in job.reasons:
        assert f'<code class="code">{reason["code"]}</code>' in html
        assert f"<code>{reason['path']}</code>" in html
    assert {r["code"] for r in job.reasons} == {"restart-policy", "backoff-limit-per-index"}
    assert "None: a refused job creates nothing." in html


def test_status_page_shows_identity_warning_and_the_waived_reason(plain_user: Any) -> None:
    job = make_job(plain_user[0], runtime=runtime_body(backoff_limit_per_index=2), allow_rank_restart=True)
    assert job.state == JobState.RUNNING and job.identity_warnings
    html = page(client_for(plain_user[0]), f"/jobs/{job.id}/")
    assert 'class="warning identity" id="identity-warning"' in html
    assert "a failed rank can rerun under the same DISPATCH_ATTEMPT" in html
    assert '<code class="code">backoff-limit-per-index</code> <span class="badge warn">waived</span>' in html


def test_active_job_page_polls_and_the_poll_returns_only_the_status(plain_user: Any) -> None:
    job = make_job(plain_user[0], state=JobState.RUNNING)
    client = client_for(plain_user[0])
    html = page(client, f"/jobs/{job.id}/")
    assert f'hx-get="/jobs/{job.id}/" hx-trigger="every 5s"' in html
    Job.objects.filter(pk=job.pk).update(state=JobState.FAILED, cause="preempted")
    partial = page(client, f"/jobs/{job.id}/", **HTMX)
    assert "<html" not in partial and 'id="plan"' not in partial and "Images per container" not in partial
    assert 'data-cause="preempted">preempted</span>' in partial
    # The job became terminal: the fresh partial no longer polls.
    assert 'hx-trigger="every' not in partial
    assert "this page no longer refreshes" in partial


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REFUSED])
def test_terminal_job_page_does_not_poll_and_has_no_cancel(plain_user: Any, state: str) -> None:
    job = make_job(plain_user[0], state=state, cause="cancelled" if state == JobState.CANCELLED else "")
    html = page(client_for(plain_user[0]), f"/jobs/{job.id}/")
    assert 'hx-trigger="every' not in html
    assert "cancel-job" not in html


def test_someone_elses_job_is_404_for_a_plain_user(plain_user: Any, other_user: User) -> None:
    job = make_job(other_user, namespace="team-b")
    assert client_for(plain_user[0]).get(f"/jobs/{job.id}/").status_code == 404
    assert client_for(plain_user[0]).get("/jobs/jnosuchjob22/").status_code == 404


def test_anonymous_is_sent_to_login_but_an_htmx_poll_gets_401(plain_user: Any) -> None:
    job = make_job(plain_user[0])
    anonymous = Client()
    for url in ("/jobs/", f"/jobs/{job.id}/"):
        response = anonymous.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/?next=")
        polled = anonymous.get(url, headers=HTMX)
        assert polled.status_code == 401
        # htmx reloads the page on HX-Refresh, which then lands on the login form.
        assert polled["HX-Refresh"] == "true"
    assert anonymous.post(f"/jobs/{job.id}/cancel/").status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


# --- cancel -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("canceller", ["plain_user", "oncall_user"])
def test_owner_and_oncall_cancel_through_the_page(
    canceller: str, request: pytest.FixtureRequest, plain_user: Any
) -> None:
    job = make_job(plain_user[0], state=JobState.RUNNING)
    user = request.getfixturevalue(canceller)[0]
    client = client_for(user)
    assert 'id="cancel-job"' in page(client, f"/jobs/{job.id}/")
    response = client.post(f"/jobs/{job.id}/cancel/", follow=True)
    assert response.redirect_chain == [(f"/jobs/{job.id}/", 302)]
    html = response.content.decode()
    assert f"Job {job.id} is cancelled" in html
    assert 'id="job-state" data-state="cancelled">cancelled</span>' in html
    assert f"cancelled by {user.username}" in html
    assert "cancel-job" not in html
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and job.cause == "cancelled"


def test_cancel_of_someone_elses_job_is_404(plain_user: Any, other_user: User) -> None:
    job = make_job(other_user, namespace="team-b")
    assert client_for(plain_user[0]).post(f"/jobs/{job.id}/cancel/").status_code == 404
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_cancel_by_get_is_405(plain_user: Any) -> None:
    job = make_job(plain_user[0])
    assert client_for(plain_user[0]).get(f"/jobs/{job.id}/cancel/").status_code == 405
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_cancel_of_a_finished_job_is_refused_with_a_message(plain_user: Any) -> None:
    job = make_job(plain_user[0], state=JobState.SUCCEEDED)
    response = client_for(plain_user[0]).post(f"/jobs/{job.id}/cancel/", follow=True)
    html = response.content.decode()
    assert response.redirect_chain == [(f"/jobs/{job.id}/", 302)]
    assert '<li class="msg-error">' in html
    assert f"job {job.id} is succeeded; only a job that has not finished can be cancelled" in html
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
