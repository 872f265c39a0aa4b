"""The dashboard in a real headless Chromium: what on-call and the platform team see and click."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from pytest_django.live_server_helper import LiveServer
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from dispatch_site import roles
from jobs.models import Execution, Job, JobEvent, JobState
from tests.api.test_job_pages import OOM_EVIDENCE, make_job, runtime_body
from tests.browser.conftest import LogIn, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("transactional_db")]

POLL_WAIT = 15  # the pages poll every 5 s


def text_of(browser: WebDriver, css: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, css).text)


def failed_on_second_attempt(owner: User) -> Job:
    """A job on-call would open: attempt 1 was preempted, attempt 2 ran out of memory; its runtime waives
    backoffLimitPerIndex, so a rank may have rerun under one identity (the identity warning)."""
    job = make_job(
        owner,
        state=JobState.FAILED,
        cause="oom",
        evidence=OOM_EVIDENCE,
        message="rank 1 (node-0-1) was OOMKilled: exit code 137",
        runtime=runtime_body(backoff_limit_per_index=2),
        allow_rank_restart=True,
        display_name="resnet50 lr sweep",
    )
    first = job.executions.get()
    Execution.objects.filter(pk=first.pk).update(state=JobState.FAILED, cause="preempted")
    Execution.objects.create(
        job=job,
        attempt=2,
        trainjob_name=f"{job.id}-2",
        state=JobState.FAILED,
        cause="oom",
        message="node-0-1 OOMKilled (exit code 137)",
        submitted_at=timezone.now(),
        finished_at=timezone.now() + timedelta(minutes=41),
    )
    for attempt, kind, message in (
        (1, "preempted", "pod node-0-0 was preempted by a higher-priority workload"),
        (1, "retry", "policy: retry preempted (1 of 3); starting execution 2"),
        (2, "created", f"created TrainJob team-a/{job.id}-2"),
        (2, "failed", "rank 1 was OOMKilled (exit code 137); app failures are not retried"),
    ):
        JobEvent.objects.create(job=job, attempt=attempt, kind=kind, message=message)
    Job.objects.filter(pk=job.pk).update(current_attempt=2)
    return job


@pytest.fixture
def team(make_user: Any) -> dict[str, User]:
    return {
        "pat": make_user("pat", roles.PLATFORM, ("*",))[0],
        "olive": make_user("olive", roles.ONCALL)[0],
        "uma": make_user("uma", roles.USER, ("team-a",))[0],
        "bob": make_user("bob", roles.USER, ("team-b",))[0],
    }


def test_login_form_leads_to_the_jobs_list_with_state_and_cause(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    failed = failed_on_second_attempt(team["uma"])
    running = make_job(team["bob"], namespace="team-b", display_name="bert finetune")
    refused = make_job(
        team["uma"], runtime=runtime_body(restart_policy="OnFailure"), display_name="quick test"
    )
    make_job(team["bob"], namespace="team-b", state=JobState.QUEUED, runtime_name="torch-a100")
    make_job(team["uma"], state=JobState.SUCCEEDED, display_name="eval")
    make_job(team["bob"], namespace="team-b", state=JobState.CANCELLED, cause="cancelled")
    make_job(team["uma"], state=JobState.UNKNOWN, message="could not reach the cluster")
    # Spread the submissions over the last day, as a real list would be.
    for minutes, job in enumerate(Job.objects.order_by("created_at")[::-1]):
        Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(minutes=7 + minutes * 173))

    logged_in("olive")
    assert browser.current_url == f"{live_server.url}/jobs/"
    row = f"tr[data-job='{failed.id}']"
    assert text_of(browser, f"{row} .badge[data-state]") == "failed"
    assert text_of(browser, f"{row} .badge.cause") == "oom"
    assert text_of(browser, f"tr[data-job='{running.id}'] .badge[data-state]") == "running"
    assert text_of(browser, f"tr[data-job='{refused.id}'] code.reason") == "restart-policy"
    assert text_of(browser, "#job-count") == "7 jobs"
    screenshot(browser, "jobs-list")

    # The filter form narrows the list.
    browser.find_element(By.ID, "id_namespace").send_keys("team-b")
    browser.find_element(By.CSS_SELECTOR, "#job-filters button[type=submit]").click()
    WebDriverWait(browser, 10).until(
        EC.text_to_be_present_in_element((By.ID, "job-count"), "3 matching jobs")
    )
    assert not browser.find_elements(By.CSS_SELECTOR, f"tr[data-job='{failed.id}']")

    # A job's link opens its status page.
    browser.get(f"{live_server.url}/jobs/")
    browser.find_element(By.CSS_SELECTOR, f"{row} a").click()
    WebDriverWait(browser, 10).until(EC.url_contains(f"/jobs/{failed.id}/"))
    assert text_of(browser, "h1").startswith("resnet50 lr sweep")


def test_status_page_shows_cause_evidence_identity_warning_and_executions(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    job = failed_on_second_attempt(team["uma"])
    logged_in("olive")
    browser.get(f"{live_server.url}/jobs/{job.id}/")
    assert text_of(browser, "#job-state") == "failed"
    assert text_of(browser, "#job-cause") == "oom"
    assert "OOMKilled" in text_of(browser, "#evidence")
    assert "a failed rank can rerun under the same DISPATCH_ATTEMPT" in text_of(browser, "#identity-warning")
    assert "backoff-limit-per-index" in text_of(browser, "#reasons")
    attempts = browser.find_elements(By.CSS_SELECTOR, "#executions tbody tr")
    assert [a.get_attribute("data-attempt") for a in attempts] == ["1", "2"]
    assert "preempted" in attempts[0].text and "oom" in attempts[1].text
    # Terminal: no polling, no Cancel button.
    assert browser.find_element(By.ID, "job-status").get_attribute("hx-trigger") is None
    assert not browser.find_elements(By.ID, "cancel-job")
    # The objects are collapsed until asked for.
    train_job = browser.find_element(By.CSS_SELECTOR, "#object-train-job pre")
    assert not train_job.is_displayed()
    browser.find_element(By.CSS_SELECTOR, "#object-train-job summary").click()
    assert "kind: TrainJob" in train_job.text
    screenshot(browser, "job-status")


def test_refused_job_page_names_every_reason_and_the_identity_warning(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    job = make_job(
        team["uma"],
        runtime=runtime_body(restart_policy="OnFailure", backoff_limit_per_index=2),
        allow_rank_restart=True,
    )
    logged_in("uma")
    browser.get(f"{live_server.url}/jobs/{job.id}/")
    assert text_of(browser, "#job-state") == "refused"
    assert browser.find_element(By.ID, "identity-warning").is_displayed()
    reasons = text_of(browser, "#reasons")
    assert "restart-policy" in reasons and "restartPolicy" in reasons
    assert "backoff-limit-per-index" in reasons and "waived" in reasons
    screenshot(browser, "job-refused")


def test_state_change_appears_on_the_open_page_without_reload(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    job = make_job(team["uma"], state=JobState.RUNNING)
    logged_in("uma")
    browser.get(f"{live_server.url}/jobs/{job.id}/")
    assert text_of(browser, "#job-state") == "running"
    browser.execute_script("window.notReloaded = true")  # a reload would drop it

    Job.objects.filter(pk=job.pk).update(
        state=JobState.FAILED, cause="preempted", message="node-0-0 was preempted", evidence=OOM_EVIDENCE
    )
    Execution.objects.filter(job=job).update(state=JobState.FAILED, cause="preempted")
    WebDriverWait(browser, POLL_WAIT).until(EC.text_to_be_present_in_element((By.ID, "job-state"), "failed"))
    assert text_of(browser, "#job-cause") == "preempted"
    assert "node-0-0 was preempted" in text_of(browser, "#job-message")
    assert "preempted" in text_of(browser, "#executions")
    assert browser.execute_script("return window.notReloaded") is True
    # Terminal now: the refreshed part stopped polling and the Cancel button is gone.
    assert browser.find_element(By.ID, "job-status").get_attribute("hx-trigger") is None
    assert not browser.find_elements(By.ID, "cancel-job")


def test_jobs_list_refreshes_without_reload(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    job = make_job(team["uma"], state=JobState.QUEUED)
    logged_in("uma")
    browser.execute_script("window.notReloaded = true")
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    WebDriverWait(browser, POLL_WAIT).until(
        EC.text_to_be_present_in_element((By.CSS_SELECTOR, f"tr[data-job='{job.id}'] .badge"), "running")
    )
    assert browser.execute_script("return window.notReloaded") is True


def test_cancel_button_cancels_the_job(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    job = make_job(team["uma"], state=JobState.RUNNING)
    logged_in("olive")
    browser.get(f"{live_server.url}/jobs/{job.id}/")
    assert "refreshed every 5 s" in text_of(browser, "#live-note")
    screenshot(browser, "job-running")
    browser.find_element(By.ID, "cancel-job").click()
    WebDriverWait(browser, 5).until(EC.alert_is_present()).accept()  # "Cancel job ...?"
    WebDriverWait(browser, 10).until(EC.text_to_be_present_in_element((By.ID, "job-state"), "cancelled"))
    assert f"Job {job.id} is cancelled" in text_of(browser, ".messages")
    assert text_of(browser, "#job-cause") == "cancelled"
    assert "cancelled by olive" in text_of(browser, "#job-message")
    assert not browser.find_elements(By.ID, "cancel-job")
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_plain_user_cannot_open_or_cancel_someone_elses_job(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    theirs = make_job(team["bob"], namespace="team-b", state=JobState.RUNNING)
    logged_in("uma")
    assert not browser.find_elements(By.CSS_SELECTOR, f"tr[data-job='{theirs.id}']")
    browser.get(f"{live_server.url}/jobs/{theirs.id}/")
    assert "Not Found" in text_of(browser, "body")
    assert not browser.find_elements(By.ID, "cancel-job")
    theirs.refresh_from_db()
    assert theirs.state == JobState.RUNNING


def test_ended_session_sends_the_open_page_to_the_login_form(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    job = make_job(team["uma"], state=JobState.RUNNING)
    logged_in("uma")
    browser.get(f"{live_server.url}/jobs/{job.id}/")
    browser.delete_cookie("sessionid")
    # The next poll gets 401 + HX-Refresh: the page reloads onto the login form instead of going stale.
    WebDriverWait(browser, POLL_WAIT).until(EC.url_contains("/login/"))
    assert browser.find_element(By.ID, "id_username").is_displayed()
    assert f"next=/jobs/{job.id}/" in browser.current_url


@pytest.mark.parametrize(("username", "may_allow"), [("pat", True), ("uma", False)])
def test_runtimes_page_offers_the_allow_form_to_the_platform_role_only(
    browser: WebDriver,
    live_server: LiveServer,
    logged_in: LogIn,
    team: dict[str, User],
    username: str,
    may_allow: bool,
) -> None:
    logged_in(username)
    browser.find_element(By.LINK_TEXT, "Runtimes").click()
    WebDriverWait(browser, 10).until(EC.url_contains("/runtimes/"))
    assert text_of(browser, "h1") == "Runtimes"
    assert browser.find_element(By.ID, "runtimes").is_displayed()
    headings = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "h2")]
    assert ("Allow a runtime" in headings) is may_allow
    assert bool(browser.find_elements(By.ID, "allow-form")) is may_allow
