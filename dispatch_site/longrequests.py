"""Long requests (exec, `?wait=` on session open and close, `logs?follow=true`) never hold all of a web
process's threads.

The web server runs gunicorn's threaded workers (dispatch_site/gunicorn.conf.py: WEB_WORKERS processes of
WEB_THREADS threads). A long request takes a slot first:

- of its process, at most LONG_REQUESTS_PER_PROCESS at once (fewer than WEB_THREADS), so threads are always
  left for everything else, the probes included; none free: 503 + Retry-After;
- of its user, at most LONG_REQUESTS_PER_USER at once across every web process and pod (counted in Redis,
  each slot expiring on its own should a process die holding it); over: 429 + Retry-After.

When Redis does not answer, the per-user cap is not applied (a warning is logged), like the throttles; the
per-process cap always is.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, Throttled

from dispatch_site.redisclient import client_for

logger = logging.getLogger(__name__)

# A slot held longer than this is taken for a dead holder's: the longest long request (exec: 600 s) + margin.
SLOT_SECONDS = 900
RETRY_AFTER_SECONDS = 5

_process_lock = threading.Lock()
_process_slots: threading.BoundedSemaphore | None = None
_process_size = 0


class ServerBusy(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "this web process is serving as many long requests as it may; try again shortly"
    default_code = "busy"

    def __init__(self, detail: str, wait: int) -> None:
        super().__init__(detail)
        self.wait = wait  # DRF's exception handler sends it as Retry-After


def _process_semaphore() -> threading.BoundedSemaphore:
    global _process_slots, _process_size
    size = int(settings.LONG_REQUESTS_PER_PROCESS)
    with _process_lock:
        if _process_slots is None or _process_size != size:
            _process_slots, _process_size = threading.BoundedSemaphore(size), size
        return _process_slots


# Takes a slot when the user holds fewer than ARGV[1] unexpired ones: KEYS[1] a sorted set of slot ids scored
# by their expiry; ARGV: limit, now, expiry, slot id. Returns 1 when taken.
_TAKE = f"""
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], {SLOT_SECONDS * 2})
return 1
"""


def _redis() -> redis.Redis:
    """The process's client for REDIS_URL (dispatch_site.redisclient)."""
    return client_for(settings.REDIS_URL)


def _user_key(user: Any) -> str:
    return f"dispatch-long:{settings.LONG_REQUESTS_KEY_PREFIX}:user:{user.pk}"


class Slot:
    """A long request's slots; release() gives them back (once)."""

    def __init__(self, user_key: str | None, slot_id: str, semaphore: threading.BoundedSemaphore) -> None:
        self.user_key, self.slot_id, self.semaphore = user_key, slot_id, semaphore
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.semaphore.release()
        if self.user_key is None:
            return
        try:
            _redis().zrem(self.user_key, self.slot_id)
        except redis.RedisError as exc:  # the slot expires on its own
            logger.warning("long request slot not given back, Redis did not answer: %s", exc)


def take_slot(user: Any) -> Slot:
    """The slots of one long request of `user`: ServerBusy (503) or Throttled (429), both with Retry-After."""
    semaphore = _process_semaphore()
    if not semaphore.acquire(blocking=False):
        raise ServerBusy(
            f"this web process serves at most {settings.LONG_REQUESTS_PER_PROCESS} long requests (exec, "
            "?wait=, logs?follow=true) at once; try again shortly",
            RETRY_AFTER_SECONDS,
        )
    slot_id, key = uuid.uuid4().hex, _user_key(user)
    limit = int(settings.LONG_REQUESTS_PER_USER)
    try:
        now = time.time()
        taken = _redis().eval(_TAKE, 1, key, limit, now, now + SLOT_SECONDS, slot_id)
    except redis.RedisError as exc:
        logger.warning("per-user cap on long requests not applied, Redis did not answer: %s", exc)
        return Slot(None, slot_id, semaphore)
    if not taken:
        semaphore.release()
        raise Throttled(
            wait=RETRY_AFTER_SECONDS,
            detail=(
                f"you already have {limit} long requests (exec, ?wait=, logs?follow=true) running, the most "
                "one user may; try again when one has ended"
            ),
        )
    return Slot(key, slot_id, semaphore)


@contextmanager
def long_request(user: Any) -> Iterator[None]:
    """Hold a long request's slots for the block (take_slot's errors)."""
    slot = take_slot(user)
    try:
        yield
    finally:
        slot.release()


def released_after(chunks: Iterator[Any], slot: Slot) -> Iterator[Any]:
    """A streaming body that gives its slot back when it ends or the client goes (the server closes it)."""
    try:
        yield from chunks
    finally:
        slot.release()
