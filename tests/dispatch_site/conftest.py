"""Fixtures of the dispatch_site tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.conftest import free_port
from tests.support.redis_server import RedisServer


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own on a free port (no persistence), which the test may stop and start;
    killed afterwards."""
    server = RedisServer(free_port(), tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)
