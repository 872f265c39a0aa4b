"""The rollup runs twice at once (two beats, a redelivered task) on the real PostgreSQL: every ended attempt
is counted exactly once, and the day's rows hold the sums. The attempts are rows this test writes (they stand
in for volume); the behaviour under test is the rollup's claim and its additions."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from prometheus_client import REGISTRY

from jobs.models import Execution
from jobs.usage import selectors, services
from jobs.usage.measure import wait_bucket
from jobs.usage.models import UsageDay, wait_column
from jobs.usage.selectors import UsageQuery
from tests.jobs.usage.rows import T0, ended_attempt

pytestmark = pytest.mark.django_db(transaction=True)

ATTEMPTS = 60


def _ended_attempts(owner: Any) -> None:
    for i in range(ATTEMPTS):
        ended_attempt(owner, failed=i % 3 == 0)


def test_two_rollups_at_once_count_every_attempt_once(make_user: Any) -> None:
    owner, _ = make_user("uma", namespaces=("team-a",))
    _ended_attempts(owner)
    labels = {"namespace": "team-a", "queue": "gpus", "outcome": "app-error"}
    before = REGISTRY.get_sample_value("dispatch_gpu_seconds_total", labels) or 0.0
    counted: list[int] = []
    start = threading.Barrier(4)

    def run() -> None:
        try:
            start.wait()
            counted.append(services.usage_rollup(limit=ATTEMPTS))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(counted) == ATTEMPTS, counted
    assert Execution.objects.filter(usage_rolled_at__isnull=True).count() == 0
    days = {r.outcome: r for r in UsageDay.objects.all()}
    assert set(days) == {"app-error", "succeeded"}
    failed, succeeded = ATTEMPTS // 3, ATTEMPTS - ATTEMPTS // 3
    # Each attempt: 2 pods x 2 GPUs x 60 s = 240 GPU-seconds; 2 x 4 cpus x 60 s = 480 CPU-seconds.
    assert days["succeeded"].gpu_seconds == pytest.approx(240 * succeeded)
    assert days["succeeded"].gpu_seconds_lost == 0
    assert days["app-error"].gpu_seconds_lost == pytest.approx(240 * failed)
    assert days["app-error"].cpu_seconds == pytest.approx(480 * failed)
    assert sum(d.attempts for d in days.values()) == ATTEMPTS
    assert sum(d.jobs for d in days.values()) == ATTEMPTS
    assert {d.queue for d in days.values()} == {"gpus"} and {d.day for d in days.values()} == {T0.date()}
    ten = wait_column(wait_bucket(10))  # one 10 s wait each
    assert sum(getattr(d, ten) for d in days.values()) == ATTEMPTS
    # Prometheus counts each attempt once too (after its commit): the failed attempts' 240 GPU-seconds each.
    after = REGISTRY.get_sample_value("dispatch_gpu_seconds_total", labels)
    assert after is not None and after - before == pytest.approx(240 * failed)
    assert services.usage_rollup() == 0


def test_the_answer_counts_each_attempt_once_while_the_rollup_runs(make_user: Any) -> None:
    """Ended attempts show in the usage answer before the rollup counts them, and while four rollups commit
    between the answer's two reads (the day rows, then the attempts not counted yet), every answer still
    holds each attempt exactly once: the reads share one snapshot."""
    owner, _ = make_user("uma", namespaces=("team-a",))
    _ended_attempts(owner)
    query = UsageQuery(group_by="namespace", since=T0.date(), until=T0.date())
    [before] = selectors.usage_rows(owner, query)
    assert (before["gpu_hours"], before["attempts"], before["jobs"]) == (
        240 * ATTEMPTS / 3600,
        ATTEMPTS,
        ATTEMPTS,
    )
    answers: list[tuple[float, int]] = []
    done = threading.Event()
    start = threading.Barrier(5)

    def roll() -> None:
        try:
            start.wait()
            for _ in range(ATTEMPTS):
                services.usage_rollup(limit=1)
        finally:
            connection.close()

    def read() -> None:
        try:
            start.wait()
            while not done.is_set():
                [row] = selectors.usage_rows(owner, query)
                answers.append((row["gpu_hours"], row["attempts"]))
        finally:
            connection.close()

    rollers = [threading.Thread(target=roll) for _ in range(4)]
    reader = threading.Thread(target=read)
    for t in (*rollers, reader):
        t.start()
    for t in rollers:
        t.join(120)
    done.set()
    reader.join(60)
    assert Execution.objects.filter(usage_rolled_at__isnull=True).count() == 0  # all counted meanwhile
    assert len(answers) >= 5, answers
    assert set(answers) == {(240 * ATTEMPTS / 3600, ATTEMPTS)}, sorted(set(answers))
