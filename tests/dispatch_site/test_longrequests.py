"""The per-user cap on long requests (dispatch_site.longrequests) against a real Redis of the test's own: each
slot costs commands on kept connections, not new connections, and the cap still holds across a Redis
restart."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from django.test import override_settings
from rest_framework.exceptions import Throttled

from dispatch_site import longrequests
from tests.support.redis_server import RedisServer


@pytest.fixture(autouse=True)
def _slots_in_own_redis(own_redis: RedisServer) -> Iterator[None]:
    with override_settings(REDIS_URL=own_redis.url, LONG_REQUESTS_PER_USER=2, LONG_REQUESTS_PER_PROCESS=8):
        yield


def _connections(server: RedisServer) -> int:
    return int(server.client().info("stats")["total_connections_received"])


def test_long_requests_reuse_the_processes_redis_connections(own_redis: RedisServer) -> None:
    user = SimpleNamespace(pk=7)
    longrequests.take_slot(user).release()  # the process's first: its pool opens a connection
    before = _connections(own_redis)
    for _ in range(30):
        with longrequests.long_request(user):
            pass
    # The 1 is this second count's own connection: the long requests opened none (a new one per take and per
    # release was 60, and 8 of an execute's 27 ms).
    assert _connections(own_redis) - before <= 1
    assert own_redis.client().zcard(longrequests._user_key(user)) == 0  # every slot given back


def test_the_per_user_cap_holds_across_a_redis_restart(own_redis: RedisServer) -> None:
    user = SimpleNamespace(pk=8)
    held = [longrequests.take_slot(user), longrequests.take_slot(user)]
    with pytest.raises(Throttled):
        longrequests.take_slot(user)
    for slot in held:
        slot.release()
    own_redis.stop(signal.SIGKILL)  # the kept connections are dead now; Redis comes back empty
    own_redis.start()
    held = [longrequests.take_slot(user), longrequests.take_slot(user)]
    assert own_redis.client().zcard(longrequests._user_key(user)) == 2  # counted, not waved through
    with pytest.raises(Throttled):
        longrequests.take_slot(user)
    for slot in held:
        slot.release()
