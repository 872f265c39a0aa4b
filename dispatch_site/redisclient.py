"""One Redis client per URL per process, for the code that talks to Redis itself (Lua scripts: the
long-request slots, the login counters). Its pool keeps the connections: a new client per call made two
connections per request (TCP, then the HELLO handshake and health check), 8 of an execute's 27 ms.
redis-py's pool is thread-safe, reconnects after a Redis restart, and starts afresh in a forked child."""

from __future__ import annotations

import threading

import redis

_lock = threading.Lock()
_clients: dict[str, redis.Redis] = {}


def client_for(url: str) -> redis.Redis:
    """The process's client for `url` (1 s connect and read timeouts: Redis answers in well under that, and
    a caller that finds it down carries on without it)."""
    client = _clients.get(url)
    if client is None:
        with _lock:
            client = _clients.get(url)
            if client is None:
                client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
                _clients[url] = client
    return client
