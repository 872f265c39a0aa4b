"""The dashboard in a real headless Chromium: what on-call and the platform team see and click.

The live tests (a job turning failed, cancel) drive real jobs: submitted through the API onto the local
control plane, moved by the supervisor loop (`manage.py supervise`'s run_forever) in a thread, while the
page in the browser polls. Rows written directly stand in only for volume and for layout/permission checks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import Count
from django.utils import timezone
from pytest_django.live_server_helper import LiveServer
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from dispatch_site import roles
from jobs.models import Execution, Job, JobState
from tests.browser.conftest import HEIGHT, WIDTH, LogIn, screenshot, submit_job
from tests.jobs.dashboard.test_job_pages import OOM_EVIDENCE, make_job, runtime_body
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("transactional_db")]

POLL_WAIT = 15  # the pages poll every 5 s


def text_of(browser: WebDriver, css: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, css).text)


@pytest.fixture
def team(make_user: Any) -> dict[str, User]:
    return {
        "pat": make_user("pat", roles.PLATFORM, ("*",))[0],
        "olive": make_user("olive", roles.ONCALL)[0],
        "uma": make_user("uma", roles.USER, ("team-a",))[0],
        "bob": make_user("bob", roles.USER, ("team-b",))[0],
    }


@contextlib.contextmanager
def narrow(browser: WebDriver, width: int = 390) -> Iterator[None]:
    browser.set_window_size(width, 844)
    try:
        yield
    finally:
        browser.set_window_size(WIDTH, HEIGHT)


WIDE_ELEMENTS = """
return [...document.querySelectorAll('body, body *')]
  .filter(e => e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX === 'visible')
  .filter(e => !(e.parentElement && e.parentElement.closest('.grid-scroll, .scroll-x, pre')))
  .slice(0, 8)
  .map(e => `${e.tagName}#${e.id}.${e.className} ${e.scrollWidth}/${e.clientWidth}`);
"""


def wide(browser: WebDriver) -> list[str]:
    """The elements whose content overflows them sideways (outside the parts that scroll on their own)."""
    return list(browser.execute_script(WIDE_ELEMENTS))


# ---------------------------------------------------------------- without a cluster


def test_login_lands_on_the_list_and_the_overview_counts_match_the_database(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    # Volume: a spread of jobs over the last week, as the site would have them.
    states = [
        (JobState.FAILED, "oom"),
        (JobState.FAILED, "app-error"),
        (JobState.FAILED, "app-error"),
        (JobState.SUCCEEDED, ""),
        (JobState.RUNNING, ""),
        (JobState.QUEUED, ""),
        (JobState.CANCELLED, "cancelled"),
    ]
    for index, (state, cause) in enumerate(states * 3):
        owner, namespace = (team["uma"], "team-a") if index % 2 else (team["bob"], "team-b")
        job = make_job(owner, namespace=namespace, state=state, cause=cause)
        Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(hours=index * 7))
    make_job(team["uma"], runtime=runtime_body(restart_policy="OnFailure"))

    logged_in("olive")
    assert browser.current_url == f"{live_server.url}/jobs/"
    browser.find_element(By.LINK_TEXT, "Overview").click()
    WebDriverWait(browser, 10).until(EC.presence_of_element_located((By.ID, "state-counts")))
    for window, hours in (("24h", 24), ("7d", 24 * 7)):
        browser.get(f"{live_server.url}/?window={window}")
        since = timezone.now() - timedelta(hours=hours)
        recent = Job.objects.filter(created_at__gte=since)
        expected_states = dict(recent.values_list("state").annotate(n=Count("id")))
        expected_causes = dict(recent.exclude(cause="").values_list("cause").annotate(n=Count("id")))
        for state_name in JobState.values:
            shown = text_of(browser, f"#state-counts li[data-state='{state_name}'] .n")
            assert int(shown) == expected_states.get(state_name, 0), (window, state_name)
        shown_causes = {
            li.get_attribute("data-cause"): int(li.find_element(By.CSS_SELECTOR, ".n").text)
            for li in browser.find_elements(By.CSS_SELECTOR, "#cause-counts li[data-cause]")
        }
        assert shown_causes == expected_causes, window
    # The cluster box loads after the page; the test settings point at nothing.
    WebDriverWait(browser, 10).until(EC.text_to_be_present_in_element((By.ID, "cluster-live"), "unreachable"))
    assert "restart-policy" in text_of(browser, "#top-refusals")
    screenshot(browser, "overview")

    # A count is a link to the list filtered the same way.
    browser.find_element(By.CSS_SELECTOR, "#cause-counts li[data-cause='app-error'] a").click()
    WebDriverWait(browser, 10).until(EC.url_contains("cause=app-error"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#job-rows tr[data-job]")
    assert len(rows) == Job.objects.filter(cause="app-error", created_at__gte=since).count()
    assert all(r.find_element(By.CSS_SELECTOR, ".badge.cause").text == "app-error" for r in rows)
    screenshot(browser, "jobs-list-filtered")


def test_refused_job_shows_every_reason_with_its_fix(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    job = make_job(team["uma"], runtime=runtime_body(restart_policy="OnFailure", backoff_limit_per_index=2))
    logged_in("uma")
    browser.find_element(By.LINK_TEXT, "Refusals").click()
    WebDriverWait(browser, 10).until(EC.url_contains("/refusals/"))
    assert "restartPolicy: Never" in text_of(browser, "#code-restart-policy .fix")
    browser.find_element(By.CSS_SELECTOR, f"#code-restart-policy tr[data-job='{job.id}'] a").click()
    WebDriverWait(browser, 10).until(EC.url_contains(f"/jobs/{job.id}/"))
    assert text_of(browser, "#job-state") == "refused"
    codes = [
        str(li.get_attribute("data-code")) for li in browser.find_elements(By.CSS_SELECTOR, "#reasons li")
    ]
    assert (
        sorted(codes)
        == sorted(r["code"] for r in job.reasons)
        == ["backoff-limit-per-index", "restart-policy"]
    )
    reasons = text_of(browser, "#reasons")
    assert "restartPolicy" in reasons and "backoffLimitPerIndex" in reasons and reasons.count("Fix:") == 2
    assert "None: a refused job creates nothing." in text_of(browser, "#job-status")
    screenshot(browser, "job-refused")


def test_plain_user_cannot_open_or_cancel_someone_elses_job(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    theirs = make_job(team["bob"], namespace="team-b", state=JobState.RUNNING)
    logged_in("uma")
    assert not browser.find_elements(By.CSS_SELECTOR, f"tr[data-job='{theirs.id}']")
    browser.get(f"{live_server.url}/jobs/{theirs.id}/")
    assert "Not Found" in text_of(browser, "body")
    assert not browser.find_elements(By.ID, "cancel-job")


def test_ended_session_sends_the_open_page_to_the_login_form(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    job = make_job(team["uma"], state=JobState.RUNNING)
    logged_in("uma")
    browser.get(f"{live_server.url}/jobs/{job.id}/")
    browser.delete_cookie("sessionid")
    # The next poll gets 401 + HX-Refresh: the page reloads onto the login form instead of going stale.
    WebDriverWait(browser, POLL_WAIT).until(EC.url_contains("/login/"))
    assert f"next=/jobs/{job.id}/" in browser.current_url


def test_job_page_at_390_pixels_scrolls_only_inside_the_grid(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, team: dict[str, User]
) -> None:
    """Layout only: a job with 64 ranks over 20 attempts (rows as supervision stores them)."""
    job = make_job(
        team["uma"], state=JobState.FAILED, cause="oom", evidence=OOM_EVIDENCE, display_name="a wide one"
    )
    Execution.objects.filter(job=job).delete()
    for attempt in range(1, 21):
        Execution.objects.create(
            job=job,
            attempt=attempt,
            trainjob_name=f"{job.id}-{attempt}",
            state=JobState.FAILED,
            cause="oom",
            ranks=[
                {
                    "rank": rank,
                    "attempt": attempt,
                    "restart_attempt": 0,
                    "pod": f"{job.id}-{attempt}-node-0-{rank}-abcde",
                    "phase": "Failed" if rank == 7 else "Succeeded",
                    "exit_code": 137 if rank == 7 else 0,
                    "restarts": 0,
                    "node": f"kwok-node-{rank % 4}",
                    "reason": "OOMKilled" if rank == 7 else "",
                    "first_failure": rank == 7,
                }
                for rank in range(64)
            ],
        )
    Job.objects.filter(pk=job.pk).update(current_attempt=20, failing_rank=7)
    logged_in("olive")
    with narrow(browser):
        browser.get(f"{live_server.url}/jobs/{job.id}/")
        # Measure once the parts loaded after the page (log lines, Events) are in.
        for loaded in ("log-error", "events-error"):
            WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, loaded)))
        page_width = browser.execute_script("return document.documentElement.scrollWidth")
        view_width = browser.execute_script("return document.documentElement.clientWidth")
        sideways = f"the page scrolls sideways: {page_width} > {view_width}: {wide(browser)}"
        assert page_width <= view_width, sideways
        grid = browser.find_element(By.ID, "rank-grid-wrap")
        assert browser.execute_script("return arguments[0].scrollWidth > arguments[0].clientWidth", grid)
        # The grid is reachable from the keyboard (it scrolls with the arrow keys once focused).
        assert grid.get_attribute("tabindex") == "0"
        assert len(browser.find_elements(By.CSS_SELECTOR, "#rank-grid td[data-first-failure]")) == 20
        screenshot(browser, "job-390px")
    screenshot(browser, "job-64-ranks-20-attempts")


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


# ---------------------------------------------------------------- live: the local control plane


@pytest.mark.cluster
def test_watch_a_real_job_turn_failed_with_its_cause_and_first_failing_rank(
    browser: WebDriver,
    live_server: LiveServer,
    logged_in: LogIn,
    team: dict[str, User],
    on_cluster: dict[str, Any],
    supervisor: Callable[[], None],
) -> None:
    env = {"KWOK_EXIT_CODE": "3", "KWOK_FAIL_RANK": "1", "KWOK_RUN_DURATION": "4s"}
    job_id = submit_job(on_cluster, env, display_name="live " + env.get("KWOK_EXIT_CODE", "run"))
    logged_in("olive")
    browser.get(f"{live_server.url}/jobs/{job_id}/")
    assert text_of(browser, "#job-state") in ("queued", "pending", "running")
    assert browser.find_element(By.ID, "job-status").get_attribute("hx-trigger") == "every 5s"
    browser.execute_script("window.notReloaded = true")  # a reload would drop it

    supervisor()
    WebDriverWait(browser, 120).until(EC.text_to_be_present_in_element((By.ID, "job-state"), "failed"))
    assert text_of(browser, "#job-cause") == "app-error"
    assert "rank 1 exited with code 3" in text_of(browser, "#job-message")
    first = browser.find_elements(By.CSS_SELECTOR, "#rank-grid td[data-first-failure]")
    assert len(first) == 1
    assert first[0].find_element(By.XPATH, "..").get_attribute("data-rank") == "1"
    assert first[0].text.startswith("★ fail 3")
    assert "running → failed" in text_of(browser, "#timeline") or "queued → failed" in text_of(
        browser, "#timeline"
    )
    assert browser.execute_script("return window.notReloaded") is True
    # Terminal now: the refreshed part stopped polling.
    assert browser.find_element(By.ID, "job-status").get_attribute("hx-trigger") is None
    assert not browser.find_elements(By.ID, "cancel-job")
    # The failing rank's log lines and the cluster's Events load into the page.
    WebDriverWait(browser, 20).until(EC.presence_of_element_located((By.ID, "log-lines")))
    assert "kwok" in text_of(browser, "#log-lines")
    assert "attempt=1&rank=1" in str(browser.find_element(By.ID, "full-log").get_attribute("href"))
    WebDriverWait(browser, 20).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#events tbody tr")))
    screenshot(browser, "job-live-failed")
    with narrow(browser):
        width = browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert width <= 0
        screenshot(browser, "job-live-failed-390px")


@pytest.mark.cluster
def test_cancel_a_real_running_job_from_its_page(
    browser: WebDriver,
    live_server: LiveServer,
    logged_in: LogIn,
    team: dict[str, User],
    on_cluster: dict[str, Any],
    supervisor: Callable[[], None],
    kube: Any,
) -> None:
    job_id = submit_job(on_cluster, {"KWOK_STAY_RUNNING": "1"}, display_name="live run")
    supervisor()
    logged_in("olive")
    browser.get(f"{live_server.url}/jobs/{job_id}/")
    WebDriverWait(browser, 90).until(EC.text_to_be_present_in_element((By.ID, "job-state"), "running"))
    screenshot(browser, "job-running")
    browser.find_element(By.ID, "cancel-job").click()
    WebDriverWait(browser, 5).until(EC.alert_is_present()).accept()  # "Cancel job ...?"
    WebDriverWait(browser, 10).until(EC.text_to_be_present_in_element((By.ID, "job-state"), "cancelled"))
    assert f"Job {job_id} is cancelled" in text_of(browser, ".messages")
    assert text_of(browser, "#job-cause") == "cancelled"
    assert "cancelled by olive" in text_of(browser, "#job-message")
    assert not browser.find_elements(By.ID, "cancel-job")
    screenshot(browser, "job-cancelled")
    # Audited, and the TrainJob is gone from the cluster.
    from dispatch_site.models import AuditEvent

    assert AuditEvent.objects.filter(action="job.cancel", object_id=job_id, actor_name="olive").exists()

    def gone() -> bool:
        items = kube.custom.list_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", on_cluster["namespace"], "trainjobs"
        )["items"]
        return not any(i["metadata"]["name"] == f"{job_id}-1" for i in items)

    wait_for(gone, timeout=60, what="TrainJob deleted")
