"""GET /metrics of a whole dispatch in processes (gunicorn workers, Celery worker children, beat, the
supervisor: tests/jobs/observability/conftest.py) after real jobs on the local control plane: one succeeds,
one fails with app-error (KWOK_EXIT_CODE), one is refused. Prometheus's own text parser reads the scrape;
every figure is checked against the database."""

from __future__ import annotations

import collections
import uuid
from typing import Any

import pytest
from django.db.models import Count
from prometheus_client.parser import text_string_to_metric_families

from dispatch_site import roles
from dispatch_site.services import user_create
from jobs.models import Job, JobState
from jobs.observability.models import Change
from runtimes.models import AllowListEntry
from tests.jobs.observability.conftest import Stack, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(series: Series, name: str, **labels: str) -> float:
    return series.get((name, tuple(sorted(labels.items()))), 0.0)


def total(series: Series, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    return sum(v for (n, have), v in series.items() if n == name and set(labels.items()) <= set(have))


def _job(namespace: str, env: dict[str, str], runtime: str = "dispatch-kind") -> dict[str, Any]:
    return {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": runtime},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "env": env,
    }


def test_the_figures_of_three_real_jobs_across_every_process(stack: Stack, namespace: str) -> None:
    AllowListEntry.objects.get_or_create(
        kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind", defaults={"for_jobs": True}
    )
    _, token = user_create(username=f"m-{uuid.uuid4().hex[:6]}", role=roles.USER, namespaces=[namespace])
    before = parse(stack.scrape())

    ok = stack.post("/api/v1/jobs", token, _job(namespace, {"KWOK_RUN_DURATION": "1s"}))["id"]
    failed = stack.post(
        "/api/v1/jobs", token, _job(namespace, {"KWOK_EXIT_CODE": "3", "KWOK_FAIL_RANK": "1"})
    )["id"]
    refused = stack.post(
        "/api/v1/jobs", token, _job(namespace, {}, runtime="nobody-allowed-this"), expect=(422,)
    )
    jobs = [ok, failed, refused["id"]]

    def settled() -> bool:
        states = dict(Job.objects.filter(pk__in=jobs).values_list("pk", "state"))
        return states == {ok: JobState.SUCCEEDED, failed: JobState.FAILED, refused["id"]: JobState.REFUSED}

    wait_until(settled, 180, "the three jobs end succeeded, failed and refused", stack)
    assert Job.objects.get(pk=failed).cause == "app-error"
    after = parse(stack.scrape())

    # dispatch_jobs: read from the database at scrape time, the same numbers as a query of the jobs.
    shown = {
        (dict(labels)["state"], dict(labels)["cause"]): v
        for (name, labels), v in after.items()
        if name == "dispatch_jobs" and dict(labels)["namespace"] == namespace
    }
    in_db = {
        (r["state"], r["cause"] or "none"): r["n"]
        for r in Job.objects.filter(namespace=namespace).values("state", "cause").annotate(n=Count("id"))
    }
    assert shown == in_db == {("succeeded", "none"): 1, ("failed", "app-error"): 1, ("refused", "none"): 1}

    # Counters (kept by whichever process saw the change): the scrape's increase equals the outbox's rows.
    changes = list(Change.objects.filter(job_id__in=jobs).exclude(to_state=""))
    expected = collections.Counter((c.from_state or "new", c.to_state, c.cause or "none") for c in changes)
    grown = {
        key: after_v - value(before, "dispatch_job_transitions_total", **dict(key_labels))
        for (name, key_labels), after_v in after.items()
        if name == "dispatch_job_transitions_total"
        for key in [(dict(key_labels)["from"], dict(key_labels)["to"], dict(key_labels)["cause"])]
    }
    assert {k: v for k, v in grown.items() if v} == dict(expected)
    assert expected[("new", "pending", "none")] == 2 and expected[("new", "refused", "none")] == 1
    assert any(to == "failed" and cause == "app-error" for _, to, cause in expected)
    assert any(to == "succeeded" for _, to, _ in expected)
    codes = [r["code"] for r in refused["reasons"]]
    assert codes and all(
        value(after, "dispatch_refusals_total", code=c) - value(before, "dispatch_refusals_total", code=c)
        == codes.count(c)
        for c in codes
    )
    started = total(after, "dispatch_submission_to_trainjob_seconds_count") - total(
        before, "dispatch_submission_to_trainjob_seconds_count"
    )
    assert started == 2
    created = value(after, "dispatch_kubernetes_requests_total", verb="create", kind="TrainJob", code="201")
    assert (
        created
        - value(before, "dispatch_kubernetes_requests_total", verb="create", kind="TrainJob", code="201")
        == 2
    )
    assert total(after, "dispatch_kubernetes_requests_total", verb="list", kind="Pod") > 0  # the supervisor's
    assert total(after, "dispatch_supervisor_cycle_seconds_count") > total(
        before, "dispatch_supervisor_cycle_seconds_count"
    )
    (lag,) = [v for (n, labels), v in after.items() if n == "dispatch_supervisor_lag_seconds"]
    assert 0 <= lag < 30
    # Multiprocess mode: the web workers, the Celery worker's children and the supervisor each wrote files.
    pids = {p.stem.rsplit("_", 1)[-1] for p in stack.metrics_dir.glob("counter_*.db")}
    assert len(pids) >= 3, sorted(p.name for p in stack.metrics_dir.iterdir())
