"""How long dispatch waits on what the cluster reports before it calls it a failure, and how it reads a
Kubernetes timestamp. Pure; shared by supervision (jobs.supervision.status) and sessions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class Thresholds:
    """How long a waiting cause may last before the execution fails with it (seconds)."""

    no_capacity_after: float = 300.0
    stuck_after: float = 300.0  # image pull and container config errors
    resources_failed_after: float = 15.0  # TrainJobResourcesCreationFailed other than a missing runtime
    inadmissible_after: float = 300.0  # a Kueue Workload QuotaReserved=False Inadmissible


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    text = value.replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
