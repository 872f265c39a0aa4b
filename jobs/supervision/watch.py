"""The supervisor process (`manage.py supervise`): a cycle every SUPERVISOR_INTERVAL_SECONDS, and a pod watch
in between.

The beat task alone keeps every job correct within one interval. This process adds what polling cannot see: a
pod that is preempted, evicted or loses its node is often deleted within a second, and its last state (the
DisruptionTarget condition) is the evidence. The watch keeps each deleted pod's last state (a tombstone) and
runs a cycle at once, so the state changes within about a second and the evidence is kept. Both share the
cycle lease, so they never run a cycle at the same time.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings

from cluster import gateway
from cluster.errors import ClusterError
from jobs.supervision import cycle
from runtimes.models import SiteSettings

logger = logging.getLogger(__name__)


def _interesting(kind: str, pod: dict[str, Any]) -> bool:
    """A pod change that may change a job's state: deleted, failed, a disruption, a container ending."""
    if kind == "DELETED":
        return True
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    if any(c.get("type") == "DisruptionTarget" for c in status.get("conditions") or []):
        return True
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def run_forever(stopped: Any, *, interval: float | None = None) -> None:
    """Cycles, with a pod watch in between. `stopped()` is checked at least every few seconds."""
    period = float(interval or settings.SUPERVISOR_INTERVAL_SECONDS)
    tombstones: dict[str, dict[str, Any]] = {}
    resource_version = ""
    while not stopped():
        try:
            cycle.supervise(tombstones=list(tombstones.values()))
            tombstones.clear()
        except Exception:
            logger.exception("supervision cycle failed")
        deadline = time.monotonic() + period
        label_key = f"{SiteSettings.load().label_domain}/job"
        wake = False
        while not wake and not stopped() and time.monotonic() < deadline:
            remaining = max(1, min(5, int(deadline - time.monotonic())))
            try:
                for kind, pod in gateway.watch_pods(
                    label_key, timeout_seconds=remaining, resource_version=resource_version
                ):
                    meta = pod.get("metadata") or {}
                    resource_version = str(meta.get("resourceVersion") or resource_version)
                    if kind == "DELETED":
                        tombstones[str(meta.get("uid", ""))] = pod
                    # ADDED is a new pod (or the watch's initial listing): nothing to act on at once.
                    if kind in ("MODIFIED", "DELETED") and _interesting(kind, pod):
                        wake = True
                        break
            except ClusterError as exc:
                # 410 Gone (the resource version expired) or the API server is away: start the watch afresh.
                logger.info("pod watch: %s", exc)
                resource_version = ""
                time.sleep(1)
