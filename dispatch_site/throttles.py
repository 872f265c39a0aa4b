"""Throttles counted in Redis (the `throttle` cache): API requests per user, failed logins per username, per
client address and per (username, address) pair (LoginFailures). Rates are settings (THROTTLE_RATES, from the
environment); a throttled API request is a 429 with Retry-After (DRF), a throttled login too
(dispatch_site.views.LoginView).

When Redis does not answer, requests pass (and a warning is logged): throttling is a guard, and the service
should not turn a Redis outage into refusing every request.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from typing import Any

import redis
from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest
from rest_framework.throttling import SimpleRateThrottle

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


class LoginFailures:
    """Failed logins, counted in Redis (the `throttle` cache) over the login rates' windows: per username
    (THROTTLE_LOGIN_USER), per client address (THROTTLE_LOGIN_ADDRESS) and per (username, address) pair (the
    username rate). Only failures count: a right password is never counted, so logging in does not use up
    anything.

    The lockout a stranger can cause never reaches the right password from a known address: a pair that
    logged in successfully before (within KNOWN_PAIR_SECONDS) is judged only by the failures of that same
    pair, which only someone sending from the user's own address can add. Any other login is refused while
    its username's or its address's failures are over the rate.

    When Redis does not answer, logins pass (and a warning is logged), like the other throttles."""

    def __init__(self, request: HttpRequest) -> None:
        self.cache = caches["throttle"]
        username = str(request.POST.get("username", ""))
        self.user = _username_key(username) if username else ""
        self.address = _digest(ApiUserThrottle().get_ident(request) or "")  # type: ignore[arg-type]
        self.counters: list[tuple[str, str | None]] = [
            (f"login-failures:pair:{self.user}:{self.address}", settings.THROTTLE_RATES.get("login-user"))
        ]
        if not self._known():
            self.counters += [
                (f"login-failures:user:{self.user}", settings.THROTTLE_RATES.get("login-user")),
                (f"login-failures:address:{self.address}", settings.THROTTLE_RATES.get("login-address")),
            ]

    def _known(self) -> bool:
        if not self.user:
            return False
        try:
            return bool(self.cache.get(f"login-known:{self.user}:{self.address}"))
        except redis.RedisError as exc:
            logger.warning("login throttle: Redis did not answer: %s", exc)
            return False

    def _history(self, key: str, duration: int, now: float) -> list[float]:
        return [t for t in self.cache.get(key, []) if t > now - duration]

    def retry_after(self) -> int | None:
        """Seconds to wait when one of this login's counters is over its rate, else None."""
        now = time.time()
        waits = []
        try:
            for key, rate in self.counters:
                if rate is None:
                    continue
                limit, duration = _parse_rate(rate)
                history = self._history(key, duration, now)
                if len(history) >= limit:
                    waits.append(max(1, math.ceil(duration - (now - min(history)))))
        except redis.RedisError as exc:
            logger.warning("login throttle not applied, Redis did not answer: %s", exc)
            return None
        return max(waits) if waits else None

    def failed(self) -> None:
        now = time.time()
        try:
            for key, rate in self.counters:
                if rate is None:
                    continue
                _, duration = _parse_rate(rate)
                self.cache.set(key, [*self._history(key, duration, now), now], duration)
        except redis.RedisError as exc:
            logger.warning("login failure not counted, Redis did not answer: %s", exc)

    def succeeded(self) -> None:
        try:
            self.cache.set(f"login-known:{self.user}:{self.address}", 1, KNOWN_PAIR_SECONDS)
        except redis.RedisError as exc:
            logger.warning("known login address not recorded, Redis did not answer: %s", exc)


def _parse_rate(rate: str) -> tuple[int, int]:
    limit, duration = SimpleRateThrottle.parse_rate(None, rate)  # type: ignore[arg-type]
    assert limit is not None and duration is not None
    return int(limit), int(duration)
