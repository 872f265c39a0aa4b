"""Every dashboard page at 390, 768 and 1360 px in headless Chromium, with long names and long messages in the
data: no page is wider than the viewport (the parts that scroll on their own, the rank grid and code blocks,
may scroll inside). The widths measured are written to var/screenshots/widths.md."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from pytest_django.live_server_helper import LiveServer
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from dispatch_site import roles
from dispatch_site.audit import audit_record
from dispatch_site.models import ApiToken
from jobs.models import Execution, Job, JobEvent, JobState, Session
from jobs.observability import signing
from jobs.observability.models import Change, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from jobs.usage.tasks import usage_rollup
from runtimes.models import AllowListEntry, RuntimeVerdict
from tests.browser.conftest import HEIGHT, SCREENSHOTS, WIDTH, LogIn, screenshot
from tests.browser.test_dashboard import WIDE_ELEMENTS
from tests.jobs.dashboard.test_job_pages import make_job, runtime_body
from tests.jobs.usage.rows import ended_attempt

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("transactional_db")]

WIDTHS = (390, 768, 1360)
LONG_RUNTIME = "a-runtime-with-a-name-long-enough-to-push-every-column-off-the-screen-" * 3 + "end"
LONG_NAMESPACE = "team-with-a-namespace-name-as-long-as-kubernetes-allows-it-xyz"  # 63 characters
LONG_TOKEN = "unbroken" * 40  # one "word" of 320 characters: nothing to wrap at
LONG_MESSAGE = (
    "rank 17 exited with code 3 after the launcher reported " + LONG_TOKEN + " and then a long explanation "
) * 2
LONG_EVIDENCE = [
    {
        "object": f"Pod {LONG_NAMESPACE}/{{job}}-1-node-0-17-" + "x" * 40,
        "field": "status.containerStatuses[node].lastState.terminated.message",
        "value": LONG_MESSAGE,
        "at": "2026-12-01T08:00:00Z",
    },
    {"object": "Node kwok-node-0", "field": "status.conditions[Ready]", "value": LONG_TOKEN, "at": ""},
]


@pytest.fixture
def site(make_user: Any) -> dict[str, Any]:
    """A site whose data has the longest names and messages the fields allow."""
    pat = make_user("pat", roles.PLATFORM, ("*",))[0]
    uma = make_user("uma", roles.USER, (LONG_NAMESPACE,))[0]
    failed = make_job(
        uma,
        namespace=LONG_NAMESPACE,
        state=JobState.FAILED,
        cause="app-error",
        message=LONG_MESSAGE,
        evidence=LONG_EVIDENCE,
        runtime_name=LONG_RUNTIME,
        display_name="a display name that goes on " * 6,
    )
    Execution.objects.filter(job=failed).update(
        message=LONG_MESSAGE, cause="app-error", state=JobState.FAILED
    )
    JobEvent.objects.create(
        job=failed,
        attempt=1,
        kind="transition",
        from_state="running",
        to_state="failed",
        cause="app-error",
        message=LONG_MESSAGE,
    )
    refused = make_job(
        uma,
        namespace=LONG_NAMESPACE,
        runtime=runtime_body(restart_policy="OnFailure", backoff_limit_per_index=2),
        runtime_name=LONG_RUNTIME,
    )
    Job.objects.filter(pk=refused.pk).update(
        reasons=[{**r, "message": r["message"] + " " + LONG_TOKEN} for r in refused.reasons]
    )
    for _ in range(3):
        make_job(uma, namespace=LONG_NAMESPACE, state=JobState.RUNNING, runtime_name=LONG_RUNTIME)
    session = Session.objects.create(
        owner=uma,
        namespace=LONG_NAMESPACE,
        name="s" + "a" * 62,
        runtime_kind="ClusterTrainingRuntime",
        runtime_name=LONG_RUNTIME,
        image="registry.example.com/" + LONG_TOKEN + ":v1",
        timeout_seconds=300,
        trainer_replicated_job="node",
        state="failed",
        message=LONG_MESSAGE,
        warning=LONG_MESSAGE,
        pod="s" + "a" * 62 + "-node-0-0-abcde",
    )
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name=LONG_RUNTIME, for_jobs=True)
    RuntimeVerdict.objects.create(
        kind="ClusterTrainingRuntime",
        name=LONG_RUNTIME,
        refused=True,
        verdict={
            "refused": True,
            "reasons": [{"code": "restart-policy", "message": LONG_MESSAGE, "path": "spec", "waived": False}],
        },
    )
    audit_record(
        actor=pat,
        action="runtime.allow",
        object_type="runtime",
        object_id=LONG_RUNTIME,
        details={"message": LONG_MESSAGE},
    )
    ApiToken.objects.filter(user=pat).update(name="a token name that is quite long " * 3)
    endpoint = WebhookEndpoint.objects.create(
        owner=pat,
        url="https://hooks.example.com/" + LONG_TOKEN,
        description=LONG_MESSAGE[:200],
        secret=signing.new_secret(),
        active=False,
        disabled_at=timezone.now(),
        disabled_reason="disabled: message msg_1_1 failed 8 attempts; the last one: HTTP 500: " + LONG_TOKEN,
    )
    change = Change.objects.filter(job=failed).order_by("id").first()
    assert change is not None
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint,
        change=change,
        job_id=failed.pk,
        seq=1,
        msg_id="msg_1_1",
        event_type="job.state_changed",
        payload={},
        state="failed",
        attempts=2,
        next_attempt_at=timezone.now(),
        last_status=500,
        last_latency_ms=12,
        last_error=LONG_MESSAGE,
    )
    for number in (1, 2):
        WebhookAttempt.objects.create(
            delivery=delivery,
            number=number,
            at=timezone.now(),
            status_code=500,
            latency_ms=12,
            error=LONG_MESSAGE,
        )
    # The usage page's chart, legend and table with the longest namespace (rolled up by the beat's task).
    ended_attempt(uma, namespace=LONG_NAMESPACE, failed=True, at=timezone.now() - timedelta(hours=2))
    rolled = usage_rollup.apply().result
    assert isinstance(rolled, int) and rolled >= 1
    return {"failed": failed, "refused": refused, "session": session, "endpoint": endpoint, "pat": pat}


def _pages(site: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        ("overview", "/"),
        ("jobs", "/jobs/"),
        ("job-failed", f"/jobs/{site['failed'].pk}/"),
        ("job-refused", f"/jobs/{site['refused'].pk}/"),
        ("refusals", "/refusals/"),
        ("sessions", "/sessions/"),
        ("session", f"/sessions/{site['session'].pk}/"),
        ("runtimes", "/runtimes/"),
        ("runtime", f"/runtimes/ClusterTrainingRuntime/_/{LONG_RUNTIME}/"),
        ("settings", "/settings/"),
        ("audit", "/audit/"),
        ("tokens", "/tokens/"),
        ("webhooks", "/webhooks/"),
        ("webhook", f"/webhooks/{site['endpoint'].pk}/"),
        ("usage", "/usage/"),
    ]


def _settled(browser: WebDriver) -> None:
    """The page loaded, and the parts htmx loads after it (Events, log lines, the cluster box) answered."""
    WebDriverWait(browser, 20).until(
        lambda b: b.execute_script(
            "return document.readyState === 'complete'"
            " && !/Reading (Events|the log)|Asking the API server/.test(document.body.innerText)"
        )
    )


def measure(browser: WebDriver) -> tuple[int, int, list[str]]:
    page = int(browser.execute_script("return document.documentElement.scrollWidth"))
    view = int(browser.execute_script("return document.documentElement.clientWidth"))
    return page, view, list(browser.execute_script(WIDE_ELEMENTS))


@pytest.fixture
def widths_report() -> Iterator[list[str]]:
    rows: list[str] = []
    yield rows
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    out: Path = SCREENSHOTS / "widths.md"
    out.write_text("| page | viewport px | page px |\n|---|---|---|\n" + "\n".join(rows) + "\n")


def test_no_page_is_wider_than_the_viewport_at_any_width(
    browser: WebDriver,
    live_server: LiveServer,
    logged_in: LogIn,
    site: dict[str, Any],
    widths_report: list[str],
) -> None:
    logged_in("pat")
    too_wide = []
    try:
        for width in WIDTHS:
            browser.set_window_size(width, 900)
            for name, path in _pages(site):
                browser.get(f"{live_server.url}{path}")
                _settled(browser)
                page, view, wide = measure(browser)
                widths_report.append(f"| {name} | {view} | {page} |")
                if page > view:
                    too_wide.append(f"{name} at {width}: {page} > {view}: {wide}")
                if width == 390:
                    screenshot(browser, f"width-390-{name}")
        # Logged out: the login form.
        browser.delete_all_cookies()
        for width in WIDTHS:
            browser.set_window_size(width, 900)
            browser.get(f"{live_server.url}/login/")
            page, view, wide = measure(browser)
            widths_report.append(f"| login | {view} | {page} |")
            if page > view:
                too_wide.append(f"login at {width}: {page} > {view}: {wide}")
    finally:
        browser.set_window_size(WIDTH, HEIGHT)
    assert not too_wide, "\n".join(too_wide)


def test_narrow_tables_become_stacked_rows_that_name_their_columns(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, site: dict[str, Any]
) -> None:
    """At 390 px the evidence table reads as rows of label + value, not columns one word wide."""
    logged_in("pat")
    try:
        browser.set_window_size(390, 900)
        browser.get(f"{live_server.url}/jobs/{site['failed'].pk}/")
        _settled(browser)
        cells = browser.find_elements(By.CSS_SELECTOR, "#evidence tbody tr:first-child td")
        labels = [c.get_attribute("data-label") for c in cells]
        assert labels == ["Object", "Field", "Value", "At"]
        widths = [c.rect["width"] for c in cells]
        table = browser.find_element(By.ID, "evidence").rect["width"]
        assert min(widths) > 0.8 * table, (widths, table)  # each cell takes the row's width
        screenshot(browser, "job-evidence-390px")
    finally:
        browser.set_window_size(WIDTH, HEIGHT)
