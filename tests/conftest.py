"""Shared fixtures: three personas (platform, on-call, a plain user) and API clients for each.

Like healthchecks' Alice/Bob/Charlie: a permission test only has to pick who calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management.base import CommandError
from django.db import DatabaseError
from django.test import TransactionTestCase
from rest_framework.test import APIClient

from dispatch_site import roles
from dispatch_site.services import user_create

# The control plane fixtures (kubeconfig, kube, namespace: tests/support/cluster.py), the
# dispatch-on-the-cluster fixtures built on them (tests/support/dispatch.py) and the admission guard's
# (tests/support/guard.py).
pytest_plugins = ["tests.support.cluster", "tests.support.dispatch", "tests.support.guard"]


@pytest.fixture
def make_user(db: None) -> Callable[..., tuple[User, str]]:
    def make(username: str, role: str = roles.USER, namespaces: tuple[str, ...] = ()) -> tuple[User, str]:
        return user_create(username=username, role=role, namespaces=namespaces, password="pw-" + username)

    return make


def _client_for(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def platform_user(make_user: Callable[..., tuple[User, str]]) -> tuple[User, str]:
    return make_user("pat", roles.PLATFORM, ("*",))


@pytest.fixture
def oncall_user(make_user: Callable[..., tuple[User, str]]) -> tuple[User, str]:
    return make_user("olive", roles.ONCALL)


@pytest.fixture
def plain_user(make_user: Callable[..., tuple[User, str]]) -> tuple[User, str]:
    return make_user("uma", roles.USER, ("team-a",))


@pytest.fixture
def platform_api(platform_user: tuple[User, str]) -> APIClient:
    return _client_for(platform_user[1])


@pytest.fixture
def oncall_api(oncall_user: tuple[User, str]) -> APIClient:
    return _client_for(oncall_user[1])


@pytest.fixture
def user_api(plain_user: tuple[User, str]) -> APIClient:
    return _client_for(plain_user[1])


@pytest.fixture
def anon_api() -> APIClient:
    return APIClient()


UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: nowhere, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: nobody, user: {token: none}}]
contexts: [{name: nowhere, context: {cluster: nowhere, user: nobody}}]
current-context: nowhere
"""


@pytest.fixture(autouse=True)
def _database_is_postgresql(request: pytest.FixtureRequest) -> None:
    """Tests that touch the database are written for PostgreSQL (row locks, skip_locked, JSON queries, the
    errors it raises): without DATABASE_URL the settings fall back to SQLite, and there they fail loudly here
    instead of passing or failing for the wrong reason. `make test` always sets a PostgreSQL DATABASE_URL."""
    uses_db = request.node.get_closest_marker("django_db") is not None or bool(
        {"db", "transactional_db", "django_db_setup"} & set(request.fixturenames)
    )
    if not uses_db:
        return
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.fail(
            f"this test needs PostgreSQL, but the database is {connection.vendor}: set DATABASE_URL="
            "postgres://dispatch:dispatch@127.0.0.1:25432/dispatch_<tag> (scripts/services up)",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _no_cluster_unless_asked(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests see an unreachable API server (nothing listens on port 1), never whatever local cluster happens
    to run, unless they ask for the real one (tests/support/dispatch.py: dispatch_on_cluster)."""
    path = tmp_path_factory.getbasetemp() / "unreachable.kubeconfig"
    if not path.exists():
        path.write_text(UNREACHABLE_KUBECONFIG)
    settings.KUBECONFIG = str(path)
    settings.KUBE_TIMEOUT_SECONDS = 2


@pytest.fixture(autouse=True, scope="session")
def _celery_runs_tasks_in_process() -> None:
    """Tasks run in the test process when their on_commit hook fires (django_capture_on_commit_callbacks):
    the same task code a worker runs, without a worker. tests/tasks/ runs a real worker against Redis."""
    from dispatch_site.celery import app

    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    # Register every task as a worker does at start (services send work by name: jobs.enqueue).
    app.loader.import_default_modules()


@pytest.fixture(autouse=True)
def _fresh_read_caches() -> None:
    """The short-lived plan caches (site settings, allow-list, runtime reads) start empty in every test,
    since tests write those rows directly and each test has its own database state."""
    from cluster import gateway
    from runtimes.selectors import forget_cached_reads

    forget_cached_reads()
    gateway.forget_cached_runtimes()


@pytest.fixture(autouse=True)
def _throttle_counts_per_test(settings: Any) -> None:
    """Each test counts throttled requests under its own key prefix in Redis (the counters outlive a test),
    so no test is throttled by requests another test made; a throttle test sets its own small rate."""
    import uuid

    caches = {**settings.CACHES}
    caches["throttle"] = {**caches["throttle"], "KEY_PREFIX": f"test-throttle-{uuid.uuid4().hex}"}
    settings.CACHES = caches


# A test that runs a real dispatch (tests/client: gunicorn and a Celery worker on the test database) can end
# while the worker still holds row locks on a job it is starting. The transactional test's teardown then
# TRUNCATEs every table, and PostgreSQL may pick the TRUNCATE as the deadlock victim (seen once in CI:
# "Process A waits for AccessExclusiveLock ...; Process B waits for RowShareLock ..."). The worker's
# transaction ends a moment later, so the flush is tried again; no product code is involved.
_FLUSH_TRIES = 5
_real_fixture_teardown = getattr(TransactionTestCase, "_fixture_teardown")  # noqa: B009 - not in the stubs


def _fixture_teardown_past_deadlocks(self: TransactionTestCase) -> None:
    for attempt in range(1, _FLUSH_TRIES + 1):
        try:
            _real_fixture_teardown(self)
            return
        except CommandError as exc:
            if attempt == _FLUSH_TRIES or not isinstance(exc.__cause__, DatabaseError):
                raise
            if "deadlock detected" not in str(exc.__cause__):
                raise
            time.sleep(0.5 * attempt)


setattr(TransactionTestCase, "_fixture_teardown", _fixture_teardown_past_deadlocks)  # noqa: B010
