"""Two reads by name for a delete (jobs.stopping): the Trainer controller manager's leader-election Lease
(coordination.k8s.io/v1), to tell whether the Trainer is running, and the Trainer's runtime snapshot of a
TrainJob (ConfigMap `<trainjob>-runtime-snapshot`), to restore a runtime copy that went first. Through
cluster.calls: the gateway's timeout, typed errors naming "Lease namespace/name" or "ConfigMap ..."."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cluster.calls import call_json, target
from cluster.errors import NotFound


@dataclass(frozen=True)
class Lease:
    """What a Lease says about its holder: who holds it, when the holder last renewed it, and how long a
    renewal holds (spec.holderIdentity, spec.renewTime, spec.leaseDurationSeconds; each None when unset)."""

    namespace: str
    name: str
    holder: str | None
    renew_time: datetime | None
    duration_seconds: int | None


def _micro_time(raw: Any) -> datetime | None:
    """A MicroTime ("2026-08-01T10:00:00.123456Z") as an aware datetime; None when unset or unreadable."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def get_lease(namespace: str, name: str) -> Lease | None:
    """The Lease, or None when it does not exist. Any other failure raises the gateway's typed errors."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
    try:
        body = call_json(target("Lease", namespace, name), ("get", "Lease"), "GET", path)
    except NotFound:
        return None
    spec = (body or {}).get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    return Lease(
        namespace=namespace,
        name=name,
        holder=spec.get("holderIdentity") or None,
        renew_time=_micro_time(spec.get("renewTime")),
        duration_seconds=int(duration) if isinstance(duration, int) else None,
    )


def get_config_map(namespace: str, name: str) -> dict[str, Any] | None:
    """The ConfigMap as plain data, or None when it does not exist."""
    path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
    try:
        body: dict[str, Any] = call_json(
            target("ConfigMap", namespace, name), ("get", "ConfigMap"), "GET", path
        )
    except NotFound:
        return None
    return body
