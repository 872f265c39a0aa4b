"""The Python client and the CLI against a real dispatch: a gunicorn server process and a Celery worker
process on the test database, the test Redis and the real local control plane; the client talks HTTP to
127.0.0.1.

The processes live for the whole run (starting them costs seconds). They read the database the tests write,
so tests here use ``django_db(transaction=True)``: only committed rows are visible to another process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings

from dispatch_site import roles
from dispatch_site.services import user_create
from runtimes.models import AllowListEntry

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def database_url() -> str:
    """The test database (pytest-django's test_<name>), as a URL another process can use."""
    from django.db import connection

    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to the whole process group: a gunicorn worker still streaming a followed log
        would otherwise outlive its killed master (an orphan holding the test database open)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # whatever it started and left behind


def start_process(name: str, argv: list[str], env: dict[str, str], logs: Path) -> Process:
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends the children too
        )
    return Process(name=name, popen=popen, log=log)


def service_env(kubeconfig_path: str) -> dict[str, str]:
    return os.environ | {
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "KUBECONFIG": kubeconfig_path,
        "KUBE_TIMEOUT_SECONDS": "20",
        "DEBUG": "true",
        "LOG_LEVEL": "INFO",
    }


def start_web(env: dict[str, str], logs: Path, name: str = "web") -> tuple[str, Process]:
    """gunicorn on a free 127.0.0.1 port; returns its URL once /healthz answers."""
    port = free_port()
    web = start_process(
        name,
        [
            str(BIN / "gunicorn"),
            "dispatch_site.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--worker-class",
            "gthread",
            "--workers",
            "1",
            "--threads",
            "8",
            "--timeout",
            "330",
            "--access-logfile",
            "-",
        ],
        env,
        logs,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if web.popen.poll() is not None:
            pytest.fail(f"{name} exited ({web.popen.returncode}):\n{web.tail()}", pytrace=False)
        try:
            if requests.get(f"{url}/healthz", timeout=2).status_code == 200:
                return url, web
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            web.stop()
            pytest.fail(f"{name} did not answer /healthz within 60s:\n{web.tail()}", pytrace=False)
        time.sleep(0.2)


@dataclass(frozen=True)
class Dispatch:
    url: str
    logs: Path


@pytest.fixture(scope="package")
def dispatch_server(
    kubeconfig: str,
    django_db_setup: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Dispatch]:
    """A real dispatch (web + worker) on the test database, the test Redis and the local control plane, for
    the tests of this package only: both are stopped by their pid when the package's tests end (a worker left
    running would take later tests' messages off the test Redis)."""
    logs = tmp_path_factory.mktemp("dispatch-server")
    env = service_env(kubeconfig)
    url, web = start_web(env, logs)
    worker = start_process(
        "worker",
        [
            str(BIN / "celery"),
            "-A",
            "dispatch_site",
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            "4",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel",
            "INFO",
        ],
        env,
        logs,
    )
    try:
        yield Dispatch(url=url, logs=logs)
    finally:
        worker.stop()
        web.stop()


@pytest.fixture
def server_logs(dispatch_server: Dispatch) -> Callable[[], str]:
    """The server's and the worker's log tails, for assertion messages."""

    def tails() -> str:
        out = []
        for name in ("web", "worker"):
            path = dispatch_server.logs / f"{name}.log"
            if path.exists():
                out.append(f"--- {name} ---\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    return tails


# ---------------------------------------------------------------- the `dispatch` command line

DISPATCH = Path(sys.executable).parent / "dispatch"
IMAGE = "localhost/trainer:v1"


@pytest.fixture
def run(dispatch_server: Dispatch, namespace: str) -> Any:
    """`dispatch ARGS...` as a subprocess, as a plain user granted the test's namespace."""
    AllowListEntry.objects.get_or_create(
        kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind", defaults={"for_jobs": True}
    )
    _, token = user_create(username=f"cli-{uuid.uuid4().hex[:8]}", role=roles.USER, namespaces=[namespace])
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")} | {
        "DISPATCH_URL": dispatch_server.url,
        "DISPATCH_TOKEN": token,
        "DISPATCH_NAMESPACE": namespace,
    }

    def dispatch(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(DISPATCH), *args],
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    return dispatch
