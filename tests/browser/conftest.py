"""A real headless Chromium (Debian's chromium + chromium-driver; scripts/browser-deps installs them) driven
by Selenium against pytest-django's live server. One browser for the session; each test logs in through the
real login form, so the form, the session cookie and CSRF are exercised every time."""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from pytest_django.live_server_helper import LiveServer
from rest_framework.test import APIClient
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from dispatch_site import roles
from dispatch_site.services import user_create
from runtimes.models import AllowListEntry

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"
WIDTH, HEIGHT = 1360, 900

LogIn = Callable[[str], None]


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail(
            f"{CHROMIUM} or {CHROMEDRIVER} is missing: run scripts/browser-deps "
            "(or leave the browser tests out: -m 'not browser')"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container: Chromium's sandbox needs user namespaces we may not have
        "--disable-gpu",
        "--disable-dev-shm-usage",  # a small /dev/shm crashes tabs
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--window-size={WIDTH},{HEIGHT}",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def log_in(browser: WebDriver, live_server: LiveServer, username: str) -> None:
    """Log in through the login form with the persona's password ("pw-<name>", tests/conftest.py)."""
    browser.delete_all_cookies()  # the browser outlives each test: start from no session
    browser.get(f"{live_server.url}/login/")
    browser.find_element(By.ID, "id_username").send_keys(username)
    browser.find_element(By.ID, "id_password").send_keys(f"pw-{username}")
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    # A good login lands on the jobs list, whose top bar names the user.
    WebDriverWait(browser, 10).until(EC.url_contains("/jobs/"))
    assert username in browser.find_element(By.CSS_SELECTOR, ".topbar .who").text


@pytest.fixture
def logged_in(browser: WebDriver, live_server: LiveServer) -> LogIn:
    return lambda username: log_in(browser, live_server, username)


def screenshot(browser: WebDriver, name: str) -> Path:
    """The whole page, top to bottom, as var/screenshots/<name>.png (Chromium's DevTools capture)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = browser.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path = SCREENSHOTS / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


@pytest.fixture(autouse=True)
def _task_errors_stay_in_the_task() -> Iterator[None]:
    """tests/conftest.py runs Celery tasks in-process and re-raises their errors. The live server commits for
    real, so a task enqueued on commit runs inside the request: cancel's TrainJob delete, failing against the
    unreachable test cluster, would turn the page into a 500. A worker would retry it instead; here the
    error stays in the task's result, as it would on a worker."""
    from dispatch_site.celery import app

    app.conf.task_eager_propagates = False
    try:
        yield
    finally:
        app.conf.task_eager_propagates = True


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> None:
    """These tests use transactional_db (the live server commits for real), so Django flushes the tables
    after each test. knox's own migration creates knox_authtoken, a table no model uses once KNOX_TOKEN_MODEL
    swaps in dispatch_site.ApiToken; flush leaves swapped-out tables alone, and PostgreSQL then refuses to
    TRUNCATE auth_user, which that table still references. The test database drops the unused table."""
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS knox_authtoken")


@pytest.fixture
def on_cluster(kubeconfig: str, namespace: str, settings: Any) -> dict[str, Any]:
    """dispatch pointed at the local control plane; dispatch-kind allow-listed; a user granted the test's
    namespace (who is also the one on-call watches)."""
    settings.KUBECONFIG = kubeconfig
    settings.KUBE_TIMEOUT_SECONDS = 20
    AllowListEntry.objects.get_or_create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    name = f"sam-{uuid.uuid4().hex[:6]}"
    user, token = user_create(username=name, role=roles.USER, namespaces=[namespace], password=f"pw-{name}")
    return {"user": user, "token": token, "namespace": namespace}


@pytest.fixture
def supervisor() -> Iterator[Callable[[], None]]:
    """The `manage.py supervise` loop (cycles plus the pod watch) in a thread, started on demand."""
    from jobs.supervision.watch import run_forever

    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start() -> None:
        def run() -> None:
            try:
                run_forever(stop.is_set, interval=2)
            finally:
                connection.close()

        thread = threading.Thread(target=run, daemon=True, name="supervisor")
        thread.start()
        threads.append(thread)

    yield start
    stop.set()
    for thread in threads:
        thread.join(timeout=15)


def submit_job(on_cluster: dict[str, Any], env: dict[str, str], **fields: Any) -> str:
    """A 2-node job on dispatch-kind in the on_cluster namespace, through the API as its user; its id."""
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {on_cluster['token']}")
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": on_cluster["namespace"],
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "env": env,
    } | fields
    response = api.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.json()
    job_id: str = response.json()["id"]
    return job_id
