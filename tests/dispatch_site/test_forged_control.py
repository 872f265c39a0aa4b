"""Celery's remote control is a forged message too (issue 33: "say what else a forged message could do"):
broadcast commands travel over the broker and a worker that listens obeys them as they come, so anyone who
can write to Redis could send `shutdown` to every worker (or shrink its pool, revoke tasks, make it consume
other queues). Workers no longer listen (WORKER_REMOTE_CONTROL, off by default): a real worker started as
`make up` starts it (threads), an intruder's own Celery app broadcasting `shutdown`, the worker still there
and still doing its work."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery

from jobs import enqueue
from tests.client.conftest import BIN, REPO, database_url
from tests.support.redis_server import RedisServer, wait_for


def test_a_forged_shutdown_broadcast_does_not_stop_a_worker(
    own_redis: RedisServer, transactional_db: Any, tmp_path: Path
) -> None:
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": own_redis.url, "DEBUG": "true"}
    env.pop("WORKER_REMOTE_CONTROL", None)
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                str(BIN / "celery"),
                "-A",
                "dispatch_site",
                "worker",
                "--pool",
                "threads",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "INFO",
                "-n",
                f"control-{uuid.uuid4().hex[:6]}@%h",
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def tail() -> str:
        return f"worker exit code: {worker.poll()}\n{log.read_text(errors='replace')[-4000:]}"

    intruder = Celery("intruder", broker=own_redis.url, set_as_current=False)
    try:
        wait_for(lambda: "ready." in log.read_text(errors="replace"), 30, "the worker ready", tail)
        intruder.control.broadcast("shutdown")
        intruder.control.broadcast("pool_shrink", arguments={"n": 1})
        time.sleep(5)  # a listening worker shuts down within a second
        assert worker.poll() is None, f"a forged broadcast stopped the worker\n{tail()}"
        sent = intruder.send_task(enqueue.JOB_COUNTS_COMPACT).id
        wait_for(lambda: f"[{sent}] succeeded" in log.read_text(errors="replace"), 60, "the task ran", tail)
        assert worker.poll() is None, tail()
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=10)
