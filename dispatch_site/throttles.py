"""Throttles counted in Redis (the `throttle` cache): API requests per user, login attempts per username and
per client address. Rates are settings (THROTTLE_RATES, from the environment); a throttled API request is a
429 with Retry-After (DRF), a throttled login too (dispatch_site.views.LoginView).

When Redis does not answer, requests pass (and a warning is logged): throttling is a guard, and the service
should not turn a Redis outage into refusing every request.
"""

from __future__ import annotations

import hashlib
import logging
import math
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


def _username_key(username: str) -> str:
    return hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]


class LoginUserThrottle(RedisRateThrottle):
    """Login attempts per username (whoever makes them)."""

    scope = "login-user"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        username = request.POST.get("username", "")
        return f"{self.scope}:{_username_key(username)}" if username else None


class LoginAddressThrottle(RedisRateThrottle):
    """Login attempts per client address (whichever usernames they try)."""

    scope = "login-address"

    def get_cache_key(self, request: Any, view: Any) -> str:
        return f"{self.scope}:{self.get_ident(request)}"


def login_retry_after(request: HttpRequest) -> int | None:
    """Counts one login attempt against both login throttles; the seconds to wait when either refuses it."""
    waits = []
    for throttle in (LoginAddressThrottle(), LoginUserThrottle()):
        if not throttle.allow_request(request, None):
            waits.append(throttle.retry_after())
    return max(waits) if waits else None
