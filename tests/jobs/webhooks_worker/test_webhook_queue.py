"""Webhook deliveries travel on their own queue, through a real Redis (a redis-server this test starts): a
process sends them the way dispatch does (jobs.enqueue, the app's routing), the message is read where it
landed, and real workers started with the commands of deploy/base (worker.yaml: the default queue; and
webhooks.yaml: the webhooks queue) show which of them takes it. scripts/up starts the same two.

These tests live outside tests/jobs/observability on purpose: that package's stack (a worker and a beat that
sweep due deliveries every second) runs on the same test database for the whole package, and in a full run
it sent this module's deliveries itself, with its own 5 s deadline, before the worker under test got them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.db import connection

from dispatch_site import roles
from jobs import enqueue
from jobs.observability.models import WebhookAttempt, WebhookDelivery
from jobs.observability.webhooks import INTERRUPTED
from tests.client.conftest import BIN, Process, free_port, start_process
from tests.jobs.observability.conftest import wait_until
from tests.jobs.observability.hostile import RawReceiver, drip_body, drip_headers, gzip_bomb, pending_delivery
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.django_db(transaction=True)
REPO = Path(__file__).resolve().parents[3]
BASE = REPO / "deploy" / "base"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _env(redis_url: str) -> dict[str, str]:
    db = connection.settings_dict
    return os.environ | {
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": redis_url,
        "KUBECONFIG": settings.KUBECONFIG,  # unreachable: these tasks never call the API server
        "DEBUG": "true",
    }


def _send(env: dict[str, str], *sends: tuple[str, Any]) -> None:
    """Another process sends (as the web and the workers do: jobs.enqueue.send, no eager mode there)."""
    calls = "; ".join(f"enqueue.send({name!r}{'' if arg is None else f', {arg}'})" for name, arg in sends)
    code = f"import django; django.setup(); from jobs import enqueue; {calls}"
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env | {"DJANGO_SETTINGS_MODULE": "dispatch_site.settings"},
        check=True,
        timeout=60,
    )


def _tasks_in(server: RedisServer, queue: str) -> list[str]:
    """The task names of the messages waiting in a queue (kombu's Redis transport: a list per queue)."""
    return [json.loads(raw)["headers"]["task"] for raw in server.client().lrange(queue, 0, -1)]


def _deployed_worker(file: str, name: str, env: dict[str, str], logs: Path) -> Process:
    container = yaml.safe_load((BASE / file).read_text())["spec"]["template"]["spec"]["containers"][0]
    command = [str(BIN / "celery"), *container["command"][1:], "-n", f"{name}@%h"]
    worker_env = env | {e["name"]: e["value"] for e in container.get("env", [])}
    return start_process(name, command, worker_env, logs)


def test_a_delivery_lands_on_the_webhooks_queue_which_only_the_webhooks_worker_consumes(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    env = _env(redis_server.url)
    _send(env, (enqueue.WEBHOOK_DELIVER, 0), (enqueue.JOB_COUNTS_COMPACT, None))
    assert _tasks_in(redis_server, "webhooks") == [enqueue.WEBHOOK_DELIVER]
    assert _tasks_in(redis_server, "celery") == [enqueue.JOB_COUNTS_COMPACT]

    # The worker that starts TrainJobs takes the default queue's message, and leaves the delivery alone.
    worker = _deployed_worker("worker.yaml", "worker", env, tmp_path)
    try:
        wait_until(lambda: "ready" in worker.tail(), 60, f"the worker ready: {worker.tail()}")
        wait_until(lambda: _tasks_in(redis_server, "celery") == [], 30, "the default queue consumed")
        time.sleep(3)  # several of its polls of every queue it consumes
        assert _tasks_in(redis_server, "webhooks") == [enqueue.WEBHOOK_DELIVER], worker.tail()
        assert "webhook_deliver[" not in worker.tail()  # never received (the banner lists it as known)
    finally:
        worker.stop()

    # The webhooks worker takes it (delivery 0 does not exist: its claim finds nothing and it returns).
    webhooks = _deployed_worker("webhooks.yaml", "webhooks", env, tmp_path)
    try:
        wait_until(lambda: _tasks_in(redis_server, "webhooks") == [], 60, f"taken: {webhooks.tail()}")
        wait_until(
            lambda: re.search(r"webhook_deliver\[[^\]]+\] succeeded", webhooks.tail()),
            30,
            f"the delivery task ran: {webhooks.tail()}",
        )
    finally:
        webhooks.stop()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_the_webhooks_worker_survives_a_gzip_bomb_and_drips_within_its_deadline(
    redis_server: RedisServer, tmp_path: Path, make_user: Any, settings: Any
) -> None:
    """The deployed webhooks worker (webhooks.yaml's command, 4 threads) gets a gzip bomb (1 GiB inflated)
    and two receivers that drip a byte a second for ever (headers, body): its memory stays flat, every
    attempt is recorded within the deadline, and it is still up and taking work afterwards."""
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    env = _env(redis_server.url) | {
        "WEBHOOK_ALLOW_HTTP": "true",
        "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
        "WEBHOOK_TIMEOUT_SECONDS": "2",
        "WEBHOOK_RETRY_SCHEDULE": "600,600",
    }
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    bomb, drips = RawReceiver(gzip_bomb), [RawReceiver(drip_headers), RawReceiver(drip_body)]
    worker = _deployed_worker("webhooks.yaml", "webhooks", env, tmp_path)
    try:
        deliveries = [pending_delivery(uma, r.url) for r in (bomb, *drips)]
        wait_until(lambda: "ready" in worker.tail(), 60, f"the worker ready: {worker.tail()}")
        time.sleep(1)
        before = _rss_kib(worker.popen.pid)
        _send(env, *((enqueue.WEBHOOK_DELIVER, d.pk) for d in deliveries))

        def recorded() -> bool:
            return (
                WebhookAttempt.objects.filter(delivery__in=deliveries).exclude(error=INTERRUPTED).count() == 3
            )

        try:
            wait_until(recorded, 60, "three attempts recorded")
        except AssertionError as exc:  # what the database holds says why (failed once in a full CI run)
            raise AssertionError(f"{exc}\n{_rows(deliveries)}\n{worker.tail()}") from None
        grown = _rss_kib(worker.popen.pid) - before
        assert worker.popen.poll() is None, worker.tail()
        assert grown < 64 * 1024, f"the worker grew by {grown // 1024} MiB"
        attempts = {a.delivery_id: a for a in WebhookAttempt.objects.filter(delivery__in=deliveries)}
        assert (attempts[deliveries[0].pk].status_code, attempts[deliveries[0].pk].error) == (500, "")
        # The header drip was cut off at the 2 s deadline (the attempt's own clock: this machine may be busy);
        # the body drip's status was the answer, its body never waited for.
        headers, body = (attempts[d.pk] for d in deliveries[1:])
        assert "timeout" in headers.error and headers.latency_ms < 3500, headers
        assert (body.status_code, body.error) == (500, "") and body.latency_ms < 2000, body
        # Still taking work.
        _send(env, (enqueue.WEBHOOK_DELIVER, 0))
        wait_until(lambda: _tasks_in(redis_server, "webhooks") == [], 30, "the next message taken")
    finally:
        worker.stop()
        for receiver in (bomb, *drips):
            receiver.close()


def _rows(deliveries: list[Any]) -> str:
    """The deliveries and their attempts as the database holds them, for a failure's message."""
    found = WebhookDelivery.objects.filter(pk__in=[d.pk for d in deliveries]).select_related("endpoint")
    rows = [
        (d.pk, d.state, d.attempts, d.next_attempt_at, d.claim_until, d.endpoint.active, d.last_error[:120])
        for d in found
    ]
    attempts = list(
        WebhookAttempt.objects.filter(delivery__in=deliveries).values_list(
            "delivery_id", "number", "status_code", "latency_ms", "error"
        )
    )
    columns = "id, state, attempts, due, claim, endpoint active, last error"
    return f"deliveries ({columns}): {rows}; attempts: {attempts}"


def test_make_up_starts_the_same_two_workers() -> None:
    """scripts/up (what `make up` runs): the default worker consumes the default queue only, and a worker of
    its own, with a few threads, the webhooks queue."""
    text = (REPO / "scripts" / "up").read_text().replace("\\\n", " ")
    starts: dict[str, Any] = {}
    for line in text.splitlines():
        match = re.match(r"start (\w+) (.*)", line.strip())
        if match:
            starts[match.group(1)] = match.group(2)
    assert re.search(r"\s-Q celery(\s|$)", starts["worker"])
    assert re.search(r"\s-Q webhooks(\s|$)", starts["webhooks"])
    assert re.search(r'--concurrency "\$\{WEBHOOK_WORKER_CONCURRENCY:-4\}"', starts["webhooks"])
    assert "webhooks" in (REPO / "scripts" / "down").read_text()
