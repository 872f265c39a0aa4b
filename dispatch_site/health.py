"""/healthz says the process is up; /readyz checks each dependency.

/readyz answers 200 or 503 to anyone (probes need no credentials), but names each dependency and its error
only to the platform role (API token or session), or, as an explicit opt-in, to a direct caller from an
address on READYZ_DETAIL_ADDRESSES (empty by default). A request that came through a proxy (it carries
X-Forwarded-For, X-Real-IP or Forwarded) never counts as a direct caller: a proxy in the same pod connects
from 127.0.0.1 on behalf of anyone. Errors are always logged. Those who see the details also see the
advisories, which do not count toward readiness: whether dispatch's admission guard is in the cluster
(cluster.guard; a missing guard is a warning to act on, not a reason to stop serving).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.utils.module_loading import import_string
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from rest_framework.exceptions import AuthenticationFailed

from dispatch_site import roles
from dispatch_site.client_address import proxied

logger = logging.getLogger(__name__)


def one_line(exc: Exception) -> str:
    """The error as one line (driver messages often carry a newline and a hint)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def check_database() -> dict[str, Any]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"ok": True, "vendor": connection.vendor}
    except Exception as exc:
        return {"ok": False, "error": one_line(exc)}


def check_redis() -> dict[str, Any]:
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
        try:
            client.ping()
        finally:
            client.close()
        return {"ok": True}
    except Exception as exc:
        return {"ok": False, "error": one_line(exc)}


def readiness_checks() -> dict[str, Callable[[], dict[str, Any]]]:
    """The dependencies /readyz and `manage.py preflight` check, by name: settings.READINESS_CHECKS maps each
    to the dotted path of its check (the Kubernetes one lives in the gateway, cluster.health, one layer
    above)."""
    return {name: import_string(path) for name, path in settings.READINESS_CHECKS.items()}


def readiness_advisories() -> dict[str, Callable[[], dict[str, Any]]]:
    """What /readyz reports beside the checks, to those who see its details, without counting toward
    readiness (settings.READINESS_ADVISORIES: the admission guard, cluster.guard)."""
    return {name: import_string(path) for name, path in settings.READINESS_ADVISORIES.items()}


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _direct_caller_on_the_list(request: HttpRequest) -> bool:
    if proxied(request.META):
        return False
    return request.META.get("REMOTE_ADDR", "") in settings.READYZ_DETAIL_ADDRESSES


def _may_see_details(request: HttpRequest) -> bool:
    if _direct_caller_on_the_list(request):
        return True
    from dispatch_site.auth import TokenAuthentication

    try:
        if roles.is_platform(request.user):
            return True
        authenticated = TokenAuthentication().authenticate(request)  # type: ignore[arg-type]
    except AuthenticationFailed:
        return False
    except Exception:  # the database is down: nobody can be recognised, so no details
        logger.exception("readyz: could not tell who is asking")
        return False
    return authenticated is not None and roles.is_platform(authenticated[0])


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks = {name: check() for name, check in readiness_checks().items()}
    ready = all(c["ok"] for c in checks.values())
    for name, check in checks.items():
        if not check["ok"]:
            logger.error("readyz: %s is down: %s", name, check["error"])
    body: dict[str, Any] = {"status": "ready" if ready else "not ready"}
    if _may_see_details(request):
        body["checks"] = checks
        advisories = {name: check() for name, check in readiness_advisories().items()}
        for name, advisory in advisories.items():
            if not advisory["ok"]:
                logger.warning("readyz: %s: %s", name, advisory.get("error") or advisory.get("warnings"))
        body["advisories"] = advisories
    return JsonResponse(body, status=200 if ready else 503)
