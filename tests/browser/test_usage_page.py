"""The usage page in headless Chromium at 390 px: the attempts that ended are rolled up by the beat's task
(jobs.usage.services, the code path the beat runs), and the page's chart, legend, lost share and table show
their numbers, never wider than the phone's screen; a user granted another namespace sees none of them."""

from __future__ import annotations

from typing import Any

import pytest
from pytest_django.live_server_helper import LiveServer
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from dispatch_site import roles
from jobs.usage.tasks import usage_rollup
from tests.browser.conftest import HEIGHT, WIDTH, LogIn, screenshot
from tests.jobs.usage.rows import PODS, RAN_SECONDS, T0, ended_attempt

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("transactional_db")]


def test_the_usage_page_draws_gpu_hours_and_the_lost_share_at_390_px(
    browser: WebDriver, live_server: LiveServer, logged_in: LogIn, make_user: Any
) -> None:
    uma = make_user("uma", roles.USER, ("team-a",))[0]
    make_user("eve", roles.USER, ("team-b",))
    attempts = [ended_attempt(uma, namespace="team-a", failed=f, gpus=2) for f in (False, False, True)]
    assert usage_rollup.apply().result == 3
    gpu_hours = 3 * PODS * 2 * RAN_SECONDS / 3600  # 0.2: three attempts, two pods of two GPUs, 60 s
    lost_hours = PODS * 2 * RAN_SECONDS / 3600  # 0.0667: under 0.1, shown with two significant digits
    assert round(lost_hours, 3) == 0.067

    logged_in("uma")
    browser.set_window_size(390, 900)
    try:
        browser.get(f"{live_server.url}/usage/?since={T0.date()}&until={T0.date()}")
        bars = browser.find_elements(By.CSS_SELECTOR, "#gpu-hours svg.chart rect")
        assert len(bars) == 1  # one day, one namespace
        assert f"team-a, {T0.date()}: {gpu_hours:.2f}" in str(bars[0].get_attribute("innerHTML"))
        legend = browser.find_element(By.CSS_SELECTOR, "#gpu-hours li[data-series='team-a']").text
        assert legend.split() == ["team-a", f"{gpu_hours:.2f}"]
        lost = browser.find_element(By.CSS_SELECTOR, "#lost li[data-cause='app-error']").text
        assert "0.067 GPU-h" in lost and "(100.0 %)" in lost
        row = browser.find_element(By.CSS_SELECTOR, "tr[data-namespace='team-a']")
        assert row.find_element(By.CSS_SELECTOR, "td.gpu").text == f"{gpu_hours:.2f}"
        p50 = browser.find_element(By.CSS_SELECTOR, "#waits tr[data-queue='gpus'] td.p50").text
        assert p50.startswith("≈") and 5 <= int(p50.strip("≈ s")) <= 10  # 10 s waits, in the (5, 10] bucket
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= browser.execute_script("return document.documentElement.clientWidth")
        chart = browser.find_element(By.CSS_SELECTOR, "#gpu-hours svg.chart").size
        assert 0 < chart["width"] <= 390 and chart["height"] > 60  # scaled to the screen, still readable
        screenshot(browser, "usage-390")

        # The job's page shows its attempt's GPU-hours and queue wait.
        browser.get(f"{live_server.url}/jobs/{attempts[2].job_id}/")
        attempt = browser.find_element(By.CSS_SELECTOR, "#executions tr[data-attempt='1']")
        assert attempt.find_element(By.CSS_SELECTOR, "td.gpu-hours").text == "0.067"
        assert attempt.find_element(By.CSS_SELECTOR, "td.queue-wait").text == "10 s"

        logged_in("eve")
        browser.get(f"{live_server.url}/usage/?since={T0.date()}&until={T0.date()}")
        assert browser.find_element(By.ID, "no-usage").is_displayed()
        assert not browser.find_elements(By.CSS_SELECTOR, "tr[data-namespace='team-a']")
    finally:
        browser.set_window_size(WIDTH, HEIGHT)
