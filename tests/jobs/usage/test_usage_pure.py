"""The usage figures' definitions (jobs.usage.measure, jobs.podresources.pod_compute): pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.podresources import pod_compute
from jobs.usage.measure import WAIT_BOUNDS, attempt_usage, hours_text, percentile, pod_ran, wait_bucket

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def _pod(
    start: float | None, finish: float | None, *, gpus: float = 1, cpus: float = 2, gone: float | None = None
):
    row = {"name": "node", "started_at": _iso(start) if start is not None else None}
    row["finished_at"] = _iso(finish) if finish is not None else None
    return {"containers": [row], "gpus": gpus, "cpus": cpus, "gone": _iso(gone) if gone is not None else None}


def test_a_pod_holds_its_gpu_limits_and_cpu_requests_sidecars_included() -> None:
    spec = {
        "containers": [
            {
                "name": "node",
                "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "8"}, "requests": {"cpu": "4"}},
            },
            {"name": "helper", "resources": {"requests": {"cpu": "500m", "amd.com/gpu": "1"}}},
        ],
        "initContainers": [
            {"name": "setup", "resources": {"requests": {"cpu": "16", "nvidia.com/gpu": "8"}}},  # runs before
            {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"cpu": "1"}}},  # beside
        ],
    }
    assert pod_compute(spec) == {"gpus": 3.0, "cpus": 5.5}
    assert pod_compute({}) == {"gpus": 0.0, "cpus": 0.0}


def test_a_pod_ran_from_its_first_start_to_its_last_finish_or_until_it_vanished_or_the_attempt_ended() -> (
    None
):
    assert pod_ran(_pod(5, 25), None) == (T0 + timedelta(seconds=5), T0 + timedelta(seconds=25))
    # Still running when last seen: it ran until it vanished, else until the attempt ended.
    assert pod_ran(_pod(5, None, gone=40), T0 + timedelta(seconds=60))[1] == T0 + timedelta(seconds=40)
    assert pod_ran(_pod(5, None), T0 + timedelta(seconds=60))[1] == T0 + timedelta(seconds=60)
    assert pod_ran(_pod(None, None), T0) == (None, None)  # never started: ran for no time


def test_an_attempt_counts_gpu_and_cpu_seconds_and_its_queue_wait() -> None:
    pods = {"a": _pod(10, 30, gpus=1, cpus=2), "b": _pod(12, 30, gpus=1, cpus=2), "c": _pod(None, None)}
    usage = attempt_usage(
        pods,
        state="succeeded",
        started_at=T0 + timedelta(seconds=12),
        submitted_at=T0 + timedelta(seconds=2),
        ended_at=T0 + timedelta(seconds=31),
    )
    assert usage.gpu_seconds == pytest.approx(38.0)
    assert usage.cpu_seconds == pytest.approx(76.0)
    assert usage.queue_wait_seconds == pytest.approx(10.0)
    assert usage.lost is False


@pytest.mark.parametrize(
    ("state", "started", "lost"),
    [("failed", True, True), ("failed", False, True), ("cancelled", True, True), ("cancelled", False, False),
     ("succeeded", True, False)],
)  # fmt: skip
def test_lost_is_a_failed_attempt_or_one_cancelled_after_it_ran(
    state: str, started: bool, lost: bool
) -> None:
    usage = attempt_usage(
        {"a": _pod(0, 10)}, state=state, started_at=T0 if started else None, submitted_at=T0, ended_at=T0
    )
    assert usage.lost is lost
    assert usage.queue_wait_seconds == (0.0 if started else None)  # no wait for an attempt that never ran


def test_queue_wait_percentiles_come_from_the_histogram_within_one_bucket() -> None:
    assert wait_bucket(0) == 0 and wait_bucket(1) == 0 and wait_bucket(1.5) == 1
    assert wait_bucket(10**6) == len(WAIT_BOUNDS)
    waits = [3.0] * 50 + [40.0] * 45 + [500.0] * 5
    counts: dict[int, int] = {}
    for w in waits:
        counts[wait_bucket(w)] = counts.get(wait_bucket(w), 0) + 1
    p50, p95 = percentile(counts, 0.5), percentile(counts, 0.95)
    assert p50 is not None and 2 <= p50 <= 5  # the bucket (2, 5] holds the true 3 s
    assert p95 is not None and 30 <= p95 <= 45  # the bucket (30, 45] holds the true 40 s
    assert percentile({}, 0.5) is None
    assert percentile({len(WAIT_BOUNDS): 3}, 0.5) == WAIT_BOUNDS[-1]  # the open bucket: its lower bound


def test_stacked_bars_stack_each_days_groups_and_fold_the_smallest_into_others() -> None:
    from jobs.usage.charts import HEIGHT, MAX_SERIES, OTHERS, shares, stacked_bars

    days = [T0.date() + timedelta(days=i) for i in range(3)]
    rows = [
        {"period": days[0], "namespace": "a", "gpu_hours": 3.0},
        {"period": days[0], "namespace": "b", "gpu_hours": 1.0},
    ]
    rows += [{"period": days[2], "namespace": f"n{i}", "gpu_hours": 0.1} for i in range(MAX_SERIES + 2)]
    bars = stacked_bars(rows, key="namespace", value="gpu_hours", periods=days)
    assert bars.top == 5.0  # the tallest bar (4 GPU-hours) under a round scale
    first = [
        s
        for s in bars.segments
        if s.title.endswith(f"{days[0]}: 3.00") or s.title.endswith(f"{days[0]}: 1.00")
    ]
    assert sum(s.height for s in first) == pytest.approx(HEIGHT * 4 / 5)  # stacked: 3 + 1 of 5
    assert not any(str(days[1]) in s.title for s in bars.segments)  # a day with nothing has no bar
    names = [item.name for item in bars.legend]
    assert names[:2] == ["a", "b"] and names[-1] == OTHERS and len(names) == MAX_SERIES + 1
    assert sum(item.total for item in bars.legend) == pytest.approx(4 + 0.1 * (MAX_SERIES + 2))
    assert stacked_bars([], key="namespace", value="gpu_hours", periods=days).empty

    lost = shares({"preempted": 3.0, "app-error": 1.0, "succeeded": 0.0})
    assert [(p.name, p.percent, p.x) for p in lost.parts] == [
        ("preempted", 75.0, 0.0),
        ("app-error", 25.0, 75.0),
    ]


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0.00"), (12.345, "12.35"), (0.2, "0.20"), (0.1, "0.10"), (0.0139, "0.014"), (0.0667, "0.067"),
     (0.00001, "0.000010"), (0.0000001, "0.000000")],
)  # fmt: skip
def test_hours_read_as_two_decimals_or_two_significant_digits(value: float, text: str) -> None:
    assert hours_text(value) == text
