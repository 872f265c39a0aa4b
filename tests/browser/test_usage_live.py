"""The usage page with real jobs (issue 36's "done when"): two 2-node jobs with one GPU per node run on the
local control plane, one 20 s (succeeds) and one 10 s (fails with exit 3), submitted through the API and
moved by the supervisor loop in a thread. While one runs, the page already shows its GPU-hours so far; after
the beat's rollup, the chart, legend, lost share and table at 390 px show the GPU-hours this test computes
itself from the pods' container start and finish times, read from the cluster (within 25 %)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from pytest_django.live_server_helper import LiveServer
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from jobs.models import Job, JobState
from jobs.usage.tasks import usage_rollup
from tests.browser.conftest import HEIGHT, WIDTH, LogIn, screenshot, submit_job
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.usefixtures("transactional_db")]

GPU = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
ENDED = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}


def _seconds(start: datetime | None, end: datetime | None) -> float:
    return (end - start).total_seconds() if start and end else 0.0


def _number(text: str) -> float:
    return float(text.split()[-1])


def test_the_usage_page_shows_the_gpu_hours_the_pods_ran(
    browser: WebDriver,
    live_server: LiveServer,
    logged_in: LogIn,
    on_cluster: dict[str, Any],
    supervisor: Callable[[], None],
    kube: Any,
) -> None:
    namespace = on_cluster["namespace"]
    ok = submit_job(on_cluster, {"KWOK_RUN_DURATION": "20s"}, resources_per_node=GPU)
    bad = submit_job(on_cluster, {"KWOK_RUN_DURATION": "10s", "KWOK_EXIT_CODE": "3"}, resources_per_node=GPU)
    supervisor()
    logged_in(on_cluster["user"].get_username())
    page = f"{live_server.url}/usage/?namespace={namespace}"

    # The pods as the cluster reports them, read by this test (never through dispatch): uid -> (job, GPUs,
    # container start, container finish or, for a pod deleted while running (the failed job's other rank,
    # stopped by its JobSet), the last time this test saw it running).
    seen: dict[str, tuple[str, float, datetime, datetime]] = {}
    running_hours: list[float] = []

    def read_pods() -> None:
        now = datetime.now(UTC)
        for pod in kube.core.list_namespaced_pod(namespace).items:
            job = (pod.metadata.labels or {}).get("dispatch.dev/job")
            node = next((s for s in pod.status.container_statuses or () if s.name == "node"), None)
            if job is None or node is None:
                continue
            limits = next(c for c in pod.spec.containers if c.name == "node").resources.limits
            if node.state.terminated and node.state.terminated.started_at:
                done = node.state.terminated
                seen[pod.metadata.uid] = (
                    job,
                    float(limits["nvidia.com/gpu"]),
                    done.started_at,
                    done.finished_at,
                )
            elif node.state.running and node.state.running.started_at:
                seen[pod.metadata.uid] = (
                    job,
                    float(limits["nvidia.com/gpu"]),
                    node.state.running.started_at,
                    now,
                )

    def ended() -> bool:
        read_pods()
        if Job.objects.get(pk=ok).state == JobState.RUNNING and len(running_hours) < 3:
            browser.get(page)  # while it runs, the page shows what it used so far
            legend = browser.find_elements(By.CSS_SELECTOR, f"#gpu-hours li[data-series='{namespace}']")
            if legend:
                running_hours.append(_number(legend[0].text))
        return {Job.objects.get(pk=j).state for j in (ok, bad)} <= ENDED

    wait_for(ended, timeout=150, interval=1, what="both jobs ended, as supervision sees them")
    assert Job.objects.get(pk=ok).state == JobState.SUCCEEDED
    assert Job.objects.get(pk=bad).state == JobState.FAILED and Job.objects.get(pk=bad).cause == "app-error"
    expected = {j: sum(g * _seconds(a, b) for job, g, a, b in seen.values() if job == j) for j in (ok, bad)}
    assert expected[ok] >= 2 * 18 and expected[bad] >= 8, seen  # every rank pod's run was read
    assert running_hours and max(running_hours) > 0, running_hours
    total_hours, lost_hours = (expected[ok] + expected[bad]) / 3600, expected[bad] / 3600
    assert max(running_hours) <= total_hours * 1.25

    assert usage_rollup.apply().result == 2  # the beat's rollup counts both attempts, once each
    browser.set_window_size(390, 900)
    try:
        browser.get(page)
        bars = browser.find_elements(By.CSS_SELECTOR, "#gpu-hours svg.chart rect")
        assert len(bars) == 1  # today, one namespace
        legend = browser.find_element(By.CSS_SELECTOR, f"#gpu-hours li[data-series='{namespace}']").text
        assert _number(legend) == pytest.approx(total_hours, rel=0.25, abs=0.005)
        assert f"{legend.split()[-1]}" in str(bars[0].get_attribute("innerHTML"))  # the bar's own label
        lost = browser.find_element(By.CSS_SELECTOR, "#lost li[data-cause='app-error']").text
        assert float(lost.split(" GPU-h")[0].split()[-1]) == pytest.approx(lost_hours, rel=0.25, abs=0.005)
        row = browser.find_element(By.CSS_SELECTOR, f"tr[data-namespace='{namespace}']")
        assert row.find_element(By.CSS_SELECTOR, "td.gpu").text == legend.split()[-1]
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= browser.execute_script("return document.documentElement.clientWidth")
        screenshot(browser, "usage-live-390")
    finally:
        browser.set_window_size(WIDTH, HEIGHT)
