"""The readiness check of the Kubernetes API (settings.READINESS_CHECKS names it for /readyz and
preflight)."""

from __future__ import annotations

from typing import Any

from cluster import gateway


def check_kubernetes() -> dict[str, Any]:
    try:
        version = gateway.server_version()
        return {"ok": True, "version": version}
    except Exception as exc:
        return {"ok": False, "error": str(exc)}
