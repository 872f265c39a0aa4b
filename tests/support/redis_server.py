"""A redis-server a test starts itself (its pid is the test's), on a free port, with nothing kept on disk: a
restart loses every queued message, as a Redis restart does. Used where a test restarts Redis under real
processes (the webhook outbox, the broker transport)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis


class RedisServer:
    """A redis-server this test started (its pid is ours), nothing kept on disk."""

    def __init__(self, port: int, logs: Path) -> None:
        self.port, self.logs = port, logs
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=2)

    def start(self) -> None:
        with (self.logs / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_for(self._answers, 20, f"redis-server on {self.port}")

    def _answers(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=20)
        self.process = None


def wait_for(condition: Callable[[], Any], seconds: float, what: str, tail: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}\n{tail()}")
        time.sleep(0.2)
