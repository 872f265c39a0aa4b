"""Throttles counted in Redis (the `throttle` cache's server): API requests per user, failed logins per
username, per client address and per (username, address) pair (LoginFailures). Rates are settings
(THROTTLE_RATES, from the environment); a throttled API request is a 429 with Retry-After (DRF), a throttled
login too (dispatch_site.views.LoginView).

When Redis does not answer, requests pass (and a warning is logged): throttling is a guard, and the service
should not turn a Redis outage into refusing every request.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from typing import Any

import redis
from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest
from rest_framework.throttling import SimpleRateThrottle

from dispatch_site.client_address import client_address
from dispatch_site.redisclient import client_for

logger = logging.getLogger(__name__)


class RedisRateThrottle(SimpleRateThrottle):
    """SimpleRateThrottle on the Redis-backed `throttle` cache, its rate read from settings per request."""

    def __init__(self) -> None:
        self.cache = caches["throttle"]
        super().__init__()

    def get_rate(self) -> str | None:
        rate: str | None = settings.THROTTLE_RATES.get(self.scope or "")
        return rate

    def allow_request(self, request: Any, view: Any) -> bool:
        try:
            return super().allow_request(request, view)
        except redis.RedisError as exc:
            logger.warning("throttle %s not applied, Redis did not answer: %s", self.scope, exc)
            return True

    def get_ident(self, request: Any) -> str:
        """The client's address, never one the client alone chose (request_address)."""
        return request_address(request)

    def retry_after(self) -> int:
        """Whole seconds until the next request may pass (at least 1)."""
        return max(1, math.ceil(self.wait() or 1))


class ApiUserThrottle(RedisRateThrottle):
    """API requests per user (unauthenticated ones per client address)."""

    scope = "api-user"

    def get_cache_key(self, request: Any, view: Any) -> str:
        if request.user and request.user.is_authenticated:
            return f"{self.scope}:user:{request.user.pk}"
        return f"{self.scope}:address:{self.get_ident(request)}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _username_key(username: str) -> str:
    return _digest(username.strip().lower())


# A successful login makes its (username, address) pair known for this long.
KNOWN_PAIR_SECONDS = 90 * 24 * 3600


# Checks and takes one login attempt's place on every counter in one step, or none: KEYS are sorted sets of
# attempt ids scored by their time; ARGV: now, the attempt's id, then per key its limit and window (seconds).
# A counter holding `limit` attempts within its window refuses: the reply is {seconds to wait, 0}. Otherwise
# the attempt is added to every counter and the reply is {0, bitmask of the counters it filled}. Atomic,
# so attempts sent at once can never pass a check that each alone would fail (a check, a read and a write,
# from many web threads, let every concurrent wrong password through).
_TAKE_ATTEMPT = """
local now = tonumber(ARGV[1])
local wait = 0
for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[1 + 2 * i])
  local window = tonumber(ARGV[2 + 2 * i])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  if redis.call('ZCARD', key) >= limit then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    local left = math.ceil(tonumber(oldest[2]) + window - now)
    if left < 1 then left = 1 end
    if left > wait then wait = left end
  end
end
if wait > 0 then return {wait, 0} end
local filled = 0
for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[1 + 2 * i])
  local window = tonumber(ARGV[2 + 2 * i])
  redis.call('ZADD', key, now, ARGV[2])
  redis.call('EXPIRE', key, window + 1)
  if redis.call('ZCARD', key) >= limit then filled = filled + 2 ^ (i - 1) end
end
return {0, filled}
"""


class LoginFailures:
    """Failed logins, counted in Redis over the login rates' windows: per username (THROTTLE_LOGIN_USER), per
    client address (THROTTLE_LOGIN_ADDRESS) and per (username, address) pair (the username rate). Only
    failures count: a right password gives its place back, so logging in does not use up anything.

    An attempt takes its place on its counters before the password is checked, atomically (one Lua script):
    however many wrong passwords arrive at once, no more than the limit are ever checked within a window; the
    rest are refused (429) without a check. A right password's place is given back.

    The lockout a stranger can cause never reaches the right password from a known address: a pair that
    logged in successfully before (within KNOWN_PAIR_SECONDS) is judged only by the failures of that same
    pair, which only someone sending from the user's own address can add. Any other login is refused while
    its username's or its address's failures are over the rate. The address is the client's own
    (dispatch_site.client_address: X-Forwarded-For only from TRUSTED_PROXIES).

    When Redis does not answer, logins pass (and a warning is logged), like the other throttles."""

    def __init__(self, request: HttpRequest) -> None:
        self.cache = caches["throttle"]
        username = str(request.POST.get("username", ""))
        self.user = _username_key(username) if username else ""
        self.client_address = request_address(request)
        self.address = _digest(self.client_address)
        self.attempt = uuid.uuid4().hex
        self.taken = False
        self.filled: list[str] = []  # the counters this attempt filled (a lockout starts if it fails)
        self.counters: list[tuple[str, str, str | None]] = [
            (
                "pair",
                f"login-failures:pair:{self.user}:{self.address}",
                settings.THROTTLE_RATES.get("login-user"),
            )
        ]
        if not self._known():
            self.counters += [
                ("username", f"login-failures:user:{self.user}", settings.THROTTLE_RATES.get("login-user")),
                (
                    "address",
                    f"login-failures:address:{self.address}",
                    settings.THROTTLE_RATES.get("login-address"),
                ),
            ]

    def _redis(self) -> redis.Redis:
        throttle: Any = settings.CACHES["throttle"]
        return client_for(str(throttle["LOCATION"]))

    def _known(self) -> bool:
        if not self.user:
            return False
        try:
            return bool(self.cache.get(f"login-known:{self.user}:{self.address}"))
        except redis.RedisError as exc:
            logger.warning("login throttle: Redis did not answer: %s", exc)
            return False

    def _rated(self) -> list[tuple[str, str, int, int]]:
        """(name, the counter's Redis key, limit, window) of each counter with a rate."""
        return [
            (name, self.cache.make_key(key), *_parse_rate(rate))
            for name, key, rate in self.counters
            if rate is not None
        ]

    def take(self) -> int | None:
        """Take this attempt's place on its counters before the password is checked: None when it may go on,
        else the seconds until it may (a counter is full; nothing was taken)."""
        rated = self._rated()
        if not rated:
            return None
        args: list[Any] = [time.time(), self.attempt]
        for _, _, limit, window in rated:
            args += [limit, window]
        try:
            wait, filled = self._redis().eval(_TAKE_ATTEMPT, len(rated), *(k for _, k, _, _ in rated), *args)
        except redis.RedisError as exc:
            logger.warning("login throttle not applied, Redis did not answer: %s", exc)
            return None
        if int(wait) > 0:
            return int(wait)
        self.taken = True
        self.filled = [name for i, (name, _, _, _) in enumerate(rated) if int(filled) & (1 << i)]
        return None

    def failed(self) -> list[str]:
        """The password was wrong: the attempt keeps its place. Returns the counters it filled (a lockout
        starts for them), empty when none."""
        return self.filled if self.taken else []

    def succeeded(self) -> None:
        """The password was right: the attempt gives its place back, and the pair is known from now on."""
        try:
            if self.taken:
                keys = [key for _, key, _, _ in self._rated()]
                pipe = self._redis().pipeline(transaction=False)
                for key in keys:
                    pipe.zrem(key, self.attempt)
                pipe.execute()
            self.cache.set(f"login-known:{self.user}:{self.address}", 1, KNOWN_PAIR_SECONDS)
        except redis.RedisError as exc:
            logger.warning("known login address not recorded, Redis did not answer: %s", exc)


def request_address(request: Any) -> str:
    """The client's address (dispatch_site.client_address): REMOTE_ADDR, or behind TRUSTED_PROXIES the first
    X-Forwarded-For entry from the right that is not one of them."""
    meta = request.META
    return client_address(
        str(meta.get("REMOTE_ADDR") or ""),
        meta.get("HTTP_X_FORWARDED_FOR"),
        tuple(getattr(settings, "TRUSTED_PROXIES", ()) or ()),
    )


def _parse_rate(rate: str) -> tuple[int, int]:
    limit, duration = SimpleRateThrottle.parse_rate(None, rate)  # type: ignore[arg-type]
    assert limit is not None and duration is not None
    return int(limit), int(duration)
