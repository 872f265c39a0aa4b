"""The readiness check of the Kubernetes API (settings.READINESS_CHECKS names it for /readyz and
preflight)."""

from __future__ import annotations

from typing import Any

from cluster import gateway
from cluster.where import on_cluster


def check_kubernetes() -> dict[str, Any]:
    try:
        version = gateway.server_version()
        return {"ok": True, "version": version}
    except Exception as exc:
        return {"ok": False, "error": str(exc)}


def check_worker(name: str) -> dict[str, Any]:
    """The same check on a MultiKueue worker, through dispatch's own credentials for it."""
    with on_cluster(name):
        return check_kubernetes()
