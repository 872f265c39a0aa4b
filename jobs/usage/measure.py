"""The usage figures of one attempt, from the pods supervision remembered (Execution.pods_seen), and the
queue-wait histogram the rollup keeps. Each figure is defined once, here, in DESIGN.md's terms ("Usage").
Pure: plain data in, plain data out.

- A pod **ran** from its first container's start to its last container's finish; a container still running
  when the pod was last seen ran until the pod vanished (`gone`) or, failing that, until the attempt ended.
- **GPU-seconds** of an attempt: the sum over its pods of (seconds ran) x (the pod's GPUs: each GPU
  resource's limit, else its request). **CPU-seconds**: the same with the pod's cpu requests.
- **Lost**: the GPU-seconds of an attempt that ended `failed` (any cause: app error, OOM, preempted, evicted,
  node lost, timeout, identity violation), or `cancelled` after it had run.
- **Queue wait**: from the TrainJob's creation (Execution.submitted_at) to all ranks running
  (Execution.started_at); an attempt that never ran has none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from jobs.waits import parse_time

# Upper bounds (seconds) of the queue-wait histogram's buckets; the last is open. A percentile is estimated
# inside its bucket by linear interpolation (as Prometheus' histogram_quantile does).
WAIT_BOUNDS: Final = (
    1, 2, 5, 10, 15, 30, 45, 60, 90, 120, 180, 300, 450, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200,
    10800, 14400, 21600, 28800, 43200, 86400,
)  # fmt: skip
LOST_STATES: Final = frozenset({"failed"})


@dataclass(frozen=True)
class AttemptUsage:
    gpu_seconds: float
    cpu_seconds: float
    lost: bool
    queue_wait_seconds: float | None


def _seconds(start: datetime | None, end: datetime | None) -> float:
    if start is None or end is None:
        return 0.0
    return max(0.0, (end - start).total_seconds())


def pod_ran(pod: Mapping[str, Any], ended_at: datetime | None) -> tuple[datetime | None, datetime | None]:
    """When a remembered pod ran: (first container start, last container finish, else when it vanished, else
    ended_at). (None, None) when no container of it ever started."""
    rows = [r for r in pod.get("containers") or () if isinstance(r, Mapping)]
    rows += [r for r in pod.get("init_containers") or () if isinstance(r, Mapping) and r.get("sidecar")]
    starts = [t for t in (parse_time(r.get("started_at")) for r in rows) if t is not None]
    if not starts:
        return None, None
    started = min(starts)
    finishes = [parse_time(r.get("finished_at")) for r in rows if parse_time(r.get("started_at"))]
    if finishes and all(f is not None for f in finishes):
        return started, max(f for f in finishes if f is not None)
    end = parse_time(pod.get("gone")) or ended_at
    return started, end


def attempt_usage(
    pods: Mapping[str, Mapping[str, Any]],
    *,
    state: str,
    started_at: datetime | None,
    submitted_at: datetime | None,
    ended_at: datetime | None,
) -> AttemptUsage:
    gpu = cpu = 0.0
    for pod in pods.values():
        start, end = pod_ran(pod, ended_at)
        ran = _seconds(start, end)
        gpu += ran * float(pod.get("gpus") or 0)
        cpu += ran * float(pod.get("cpus") or 0)
    lost = state in LOST_STATES or (state == "cancelled" and started_at is not None)
    wait = _seconds(submitted_at, started_at) if submitted_at and started_at else None
    return AttemptUsage(gpu_seconds=gpu, cpu_seconds=cpu, lost=lost, queue_wait_seconds=wait)


def wait_bucket(seconds: float) -> int:
    """The histogram bucket of a queue wait: the index of the first bound at or above it."""
    for index, bound in enumerate(WAIT_BOUNDS):
        if seconds <= bound:
            return index
    return len(WAIT_BOUNDS)


def percentile(counts: Mapping[int, int], q: float) -> float | None:
    """The q-quantile (0 < q <= 1) of the waits counted per bucket, interpolated inside its bucket; None
    when nothing was counted. The open last bucket answers its lower bound."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for index in sorted(counts):
        n = counts[index]
        if n <= 0:
            continue
        if seen + n >= rank:
            lower = 0.0 if index == 0 else float(WAIT_BOUNDS[index - 1])
            if index >= len(WAIT_BOUNDS):
                return lower
            upper = float(WAIT_BOUNDS[index])
            return lower + (upper - lower) * max(0.0, rank - seen) / n
        seen += n
    return float(WAIT_BOUNDS[-1])


def outcome(state: str, cause: str) -> str:
    """The rollup's outcome key: the attempt's cause, or its state when it has none (succeeded, and
    `running` for an attempt not ended yet)."""
    return cause or state


def runtime_key(kind: str, namespace: str, name: str) -> str:
    """The rollup's runtime key: kind/name, or kind/namespace/name for a namespaced runtime."""
    return "/".join(p for p in (kind, namespace, name) if p)


def queue_key(plan: Mapping[str, Any] | None) -> str:
    """The rollup's queue key: the Kueue LocalQueue the job's plan chose; "" without Kueue."""
    queue = (plan or {}).get("queue") or {}
    return str(queue.get("local_queue") or "") if isinstance(queue, Mapping) else ""


def hours(seconds: float) -> float:
    return round(seconds / 3600, 6)


def hours_text(value: float) -> str:
    """Hours as people read them: two decimals from 0.1 up (and for 0), else two significant digits (a short
    job's 0.014 GPU-h is not "0.00"), never more than the six decimals `hours` keeps."""
    if value == 0 or abs(value) >= 0.1:
        return f"{value:.2f}"
    decimals = min(6, 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"
