"""A whole dispatch in processes, as `make up` runs it, for the metrics and webhook tests that need one:
gunicorn (two workers), a Celery worker (prefork, two children), Celery beat and the supervisor (`manage.py
supervise`), on the test database, the local control plane and a Redis of their own (a real redis-server on
a free port, without persistence, so a test can restart it and lose every queued message, as a Redis
restart does).

Metrics run in multiprocess mode (PROMETHEUS_MULTIPROC_DIR shared by all of them); webhooks may go to plain
http on 127.0.0.1 (WEBHOOK_ALLOW_HTTP, WEBHOOK_ALLOW_PRIVATE_ADDRESSES) and retry every second."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from dispatch_site.worker_command import worker_command
from tests.client.conftest import BIN, Process, free_port, service_env, start_process
from tests.support.redis_server import RedisServer

METRICS_TOKEN = "test-scrape-token"
RETRY_SCHEDULE = "1,1,1,1"  # five attempts, a second apart


@dataclass
class Stack:
    url: str
    logs: Path
    metrics_dir: Path
    redis: RedisServer
    processes: dict[str, Process] = field(default_factory=dict)

    def get(self, path: str, token: str, **params: Any) -> Any:
        response = requests.get(
            f"{self.url}{path}", params=params, headers={"Authorization": f"Token {token}"}, timeout=30
        )
        assert response.status_code == 200, (response.status_code, response.text)
        return response.json()

    def post(self, path: str, token: str, body: Any = None, expect: tuple[int, ...] = (200, 201, 202)) -> Any:
        response = requests.post(
            f"{self.url}{path}", json=body, headers={"Authorization": f"Token {token}"}, timeout=60
        )
        assert response.status_code in expect, (response.status_code, response.text)
        return response.json() if response.content else None

    def patch(self, path: str, token: str, body: Any) -> Any:
        response = requests.patch(
            f"{self.url}{path}", json=body, headers={"Authorization": f"Token {token}"}, timeout=30
        )
        assert response.status_code == 200, (response.status_code, response.text)
        return response.json()

    def scrape(self) -> str:
        response = requests.get(
            f"{self.url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=30
        )
        assert response.status_code == 200, response.text
        return response.text

    def tails(self) -> str:
        return "\n".join(f"--- {name} ---\n{p.tail(3000)}" for name, p in self.processes.items())


def _start_web(env: dict[str, str], logs: Path) -> tuple[str, Process]:
    """gunicorn with two workers (its config file, gunicorn.conf.py, marks an exited worker dead)."""
    port = free_port()
    web = start_process(
        "web",
        [
            str(BIN / "gunicorn"),
            "dispatch_site.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "--timeout",
            "120",
            "--access-logfile",
            "-",
        ],
        env,
        logs,
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _answers(f"{url}/healthz"), 60, f"gunicorn: {web.tail()}")
    return url, web


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


# Module-scoped: its worker, supervisor and beat act on the test database, so they stop with the module that
# asked for them. A session-scoped stack went on supervising the jobs of every later test module; a
# package-scoped one raced test_webhook_attacks.py, which sends its deliveries by hand: the stack's beat
# (a webhook sweep every second) enqueued the same due delivery, its worker claimed it first, and the test
# read an attempt still in flight (CI at 65a0be8).
@pytest.fixture(scope="module")
def stack(kubeconfig: str, django_db_setup: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("observability-stack")
    metrics_dir = logs / "metrics"
    metrics_dir.mkdir()
    redis_server = RedisServer(free_port(), logs)
    redis_server.start()
    env = service_env(kubeconfig) | {
        "REDIS_URL": redis_server.url,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "METRICS_TOKEN": METRICS_TOKEN,
        "WEBHOOK_ALLOW_HTTP": "true",
        "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
        "WEBHOOK_RETRY_SCHEDULE": RETRY_SCHEDULE,
        "WEBHOOK_TIMEOUT_SECONDS": "5",
        "WEBHOOK_SWEEP_SECONDS": "1",
        "SUPERVISOR_INTERVAL_SECONDS": "2",
    }
    processes: dict[str, Process] = {}
    try:
        processes["worker"] = start_process(
            "worker",
            worker_command(pool="prefork", concurrency=2, extra=["--without-heartbeat"]),
            env,
            logs,
        )
        processes["beat"] = start_process(
            "beat",
            [
                str(BIN / "celery"),
                "-A",
                "dispatch_site",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(logs / "beat-schedule"),
            ],
            env,
            logs,
        )
        processes["supervisor"] = start_process(
            "supervisor", [str(BIN / "python"), "manage.py", "supervise"], env, logs
        )
        url, processes["web"] = _start_web(env, logs)
        yield Stack(url=url, logs=logs, metrics_dir=metrics_dir, redis=redis_server, processes=processes)
    finally:
        for process in processes.values():
            process.stop()
        redis_server.stop()


# ---------------------------------------------------------------- a webhook receiver


@dataclass
class Received:
    headers: dict[str, str]
    body: str
    status: int
    at: float


class Receiver:
    """A real HTTP server on 127.0.0.1 that answers webhook POSTs: `plan` decides each answer's status (by
    the number of the request), and every request is kept."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.plan: Callable[[int, dict[str, str]], int] = lambda n, headers: 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.lock:
                    status = receiver.plan(len(receiver.received), headers)
                    receiver.received.append(Received(headers, body, status, time.monotonic()))
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok" if status < 300 else b"receiver says no")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/dispatch"

    def accepted(self) -> list[Received]:
        with self.lock:
            return [r for r in self.received if 200 <= r.status < 300]

    def payloads(self) -> list[dict[str, Any]]:
        return [json.loads(r.body) for r in self.accepted()]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, stack: Stack | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s: {what}\n{stack.tails() if stack else ''}")
        time.sleep(0.25)
