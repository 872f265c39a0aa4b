"""/healthz says the process is up; /readyz checks each dependency and names its error."""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET


def _one_line(exc: Exception) -> str:
    """The error as one line (driver messages often carry a newline and a hint)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def check_database() -> dict[str, Any]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"ok": True, "vendor": connection.vendor}
    except Exception as exc:
        return {"ok": False, "error": _one_line(exc)}


def check_redis() -> dict[str, Any]:
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
        try:
            client.ping()
        finally:
            client.close()
        return {"ok": True}
    except Exception as exc:
        return {"ok": False, "error": _one_line(exc)}


def check_kubernetes() -> dict[str, Any]:
    from cluster import gateway

    try:
        version = gateway.server_version()
        return {"ok": True, "version": version}
    except Exception as exc:
        return {"ok": False, "error": str(exc)}


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks = {"database": check_database(), "redis": check_redis(), "kubernetes": check_kubernetes()}
    ready = all(c["ok"] for c in checks.values())
    return JsonResponse(
        {"status": "ready" if ready else "not ready", "checks": checks}, status=200 if ready else 503
    )
