"""HISTORY_RETENTION_DAYS: old attempts' details go, their usage stays. The attempts are rows this test
writes (standing in for volume); the behaviour under test is the beat's prune and what the API then shows."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from dispatch_site import roles
from jobs.models import Execution, JobEvent
from jobs.usage import services
from jobs.usage.tasks import history_prune, usage_rollup
from tests.jobs.usage.rows import ended_attempt

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_prune_clears_old_details_keeps_usage_and_counts_each_attempt_once(
    make_user: Any, settings: Any
) -> None:
    uma, token = make_user("uma", roles.USER, ("team-a",))
    now = timezone.now()
    old = [ended_attempt(uma, failed=i == 0, at=now - timedelta(days=40)) for i in range(6)]
    new = ended_attempt(uma, at=now - timedelta(days=1))
    for e in [*old, new]:
        e.evidence = [{"object": "Pod x", "field": "status", "value": "v", "at": ""}]
        e.log_tail = {"lines": ["hello"]}
        e.save(update_fields=["evidence", "log_tail"])
        JobEvent.objects.create(job=e.job, attempt=1, kind="transition", to_state=e.state, message="m")
    JobEvent.objects.filter(job__in=[e.job for e in old]).update(at=now - timedelta(days=40))
    unrolled = ended_attempt(uma, at=now - timedelta(days=50))  # ended, but not counted yet: kept whole
    assert usage_rollup.apply().result == 8
    Execution.objects.filter(pk=unrolled.pk).update(usage_rolled_at=None)

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    window = {"since": str((now - timedelta(days=60)).date()), "until": str(now.date())}
    before = api.get("/api/v1/usage", window).json()["results"]

    settings.HISTORY_RETENTION_DAYS = 0
    assert history_prune.apply().result == 0  # 0: never
    settings.HISTORY_RETENTION_DAYS = 30
    counted: list[int] = []

    def run() -> None:
        try:
            counted.append(services.history_prune(retention_days=30))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(counted) == 6, counted  # each old attempt once, whichever run took it
    assert history_prune.apply().result == 0

    for e in old:
        e.refresh_from_db()
        assert (e.evidence, e.pods_seen, e.log_tail) == ([], {}, {}) and e.details_pruned_at is not None
        assert e.gpu_seconds == pytest.approx(240.0) and e.state in ("succeeded", "failed")  # usage stays
        assert not JobEvent.objects.filter(job=e.job).exists()
    new.refresh_from_db()
    assert new.log_tail == {"lines": ["hello"]} and JobEvent.objects.filter(job=new.job).exists()
    unrolled.refresh_from_db()
    assert unrolled.pods_seen and unrolled.details_pruned_at is None  # the rollup still needs its pods

    assert api.get("/api/v1/usage", window).json()["results"] == before  # the day rows are untouched
    page = api.get(f"/api/v1/jobs/{old[0].job_id}")
    assert page.status_code == 200 and page.json()["executions"][0]["gpu_hours"] == round(240 / 3600, 6)
