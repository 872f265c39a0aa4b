"""GET /metrics without a cluster: who may scrape, the figures read from the database at scrape time, and the
labels the gateway counts requests by. (The figures after real jobs, across gunicorn, Celery and the
supervisor in multiprocess mode: test_metrics_processes.py.)"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Count
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from cluster.gateway import request_labels
from dispatch_site import metrics
from jobs.models import Job, JobState, SupervisorCycle
from jobs.naming import new_job_id
from jobs.observability.collector import compact_job_counts
from jobs.observability.models import JobCount, JobCountDelta

pytestmark = pytest.mark.django_db


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted labels: value} of one sample in a Prometheus text exposition (the library's own parser)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def scrape(client: Client | None = None, **extra: Any) -> str:
    response = (client or Client()).get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return response.content.decode()


def test_without_a_token_only_this_host_may_scrape(settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    refused = Client().get("/metrics", REMOTE_ADDR="10.1.2.3")
    assert refused.status_code == 403 and b"METRICS_TOKEN" in refused.content


@pytest.mark.parametrize("header", ["HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP", "HTTP_FORWARDED"])
def test_behind_a_proxy_on_this_host_loopback_is_not_trusted(settings: Any, header: str) -> None:
    """A proxy on the same host (a sidecar, an ingress on the node) makes every caller's peer 127.0.0.1: a
    request that came through one is not this host's, as /readyz already judged (issue 33)."""
    settings.METRICS_TOKEN = ""
    meta: dict[str, Any] = {"REMOTE_ADDR": "127.0.0.1", header: "203.0.113.9"}
    refused = Client().get("/metrics", **meta)
    assert refused.status_code == 403 and b"not through a proxy" in refused.content


def test_with_a_token_a_scraper_anywhere_needs_it(settings: Any) -> None:
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    ok = Client().get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")
    assert ok.status_code == 200
    assert Client().post("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token").status_code == 405


def _job(owner: Any, state: str, cause: str, namespace: str) -> Job:
    return Job.objects.create(
        id=new_job_id(),
        owner=owner,
        namespace=namespace,
        runtime_kind="ClusterTrainingRuntime",
        runtime_name="dispatch-kind",
        spec={},
        state=state,
        cause=cause,
    )


def test_jobs_by_state_cause_and_namespace_match_the_database(make_user: Any) -> None:
    uma, _ = make_user("uma")
    for state, cause, namespace, n in (
        (JobState.SUCCEEDED, "", "team-a", 3),
        (JobState.FAILED, "app-error", "team-a", 2),
        (JobState.FAILED, "oom", "team-b", 1),
        (JobState.RUNNING, "", "team-b", 4),
        (JobState.UNKNOWN, "", "team-a", 1),
    ):
        for _ in range(n):
            _job(uma, state, cause, namespace)

    def expected() -> dict[tuple[tuple[str, str], ...], float]:
        rows = Job.objects.values("state", "cause", "namespace").annotate(n=Count("id"))
        return {
            (("cause", r["cause"] or "none"), ("namespace", r["namespace"]), ("state", r["state"])): r["n"]
            for r in rows
        }

    shown = samples(scrape(), "dispatch_jobs")
    assert shown == expected()
    assert shown[(("cause", "none"), ("namespace", "team-a"), ("state", "unknown"))] == 1
    assert samples(scrape(), "dispatch_scrape_error") == {(("source", "database"),): 0}
    # The way services change jobs: a compare-and-set update, a cause set later, deletes (a user removed).
    Job.objects.filter(state=JobState.RUNNING, namespace="team-b").update(
        state=JobState.FAILED, cause="preempted"
    )
    Job.objects.filter(state=JobState.UNKNOWN).update(state=JobState.RUNNING)
    Job.objects.filter(pk__in=Job.objects.filter(state=JobState.SUCCEEDED).values("pk")[:1]).delete()
    Job.objects.filter(cause="oom").update(updated_at=timezone.now())  # no count change: the trigger skips it
    assert samples(scrape(), "dispatch_jobs") == expected()
    assert JobCountDelta.objects.exists()
    folded = compact_job_counts()
    assert folded > 0 and not JobCountDelta.objects.exists()
    assert samples(scrape(), "dispatch_jobs") == expected()
    assert JobCount.objects.count() == len(expected())  # zero rows are dropped


def test_the_supervisor_lag_is_read_from_its_last_cycle() -> None:
    SupervisorCycle.objects.create(name="supervisor", finished_at=timezone.now() - timedelta(seconds=95))
    (lag,) = samples(scrape(), "dispatch_supervisor_lag_seconds").values()
    assert 95 <= lag < 95 + 60


class Broken:
    source = "broken"

    def collect(self) -> Iterable[Any]:
        raise RuntimeError("the database is away")


def test_a_source_that_cannot_be_read_is_reported_not_a_failed_scrape() -> None:
    guarded = metrics._Guarded([Broken()])
    families = {f.name: f for f in guarded.collect()}
    assert [(s.labels, s.value) for s in families["dispatch_scrape_error"].samples] == [
        ({"source": "broken"}, 1)
    ]


@pytest.mark.parametrize(
    ("method", "args", "expected"),
    [
        ("create_namespaced_custom_object", ("g", "v", "ns", "trainjobs", {}), ("create", "TrainJob")),
        (
            "get_namespaced_custom_object",
            ("g", "v", "ns", "trainingruntimes", "n"),
            ("get", "TrainingRuntime"),
        ),
        (
            "list_cluster_custom_object",
            ("g", "v", "clustertrainingruntimes"),
            ("list", "ClusterTrainingRuntime"),
        ),
        ("delete_namespaced_custom_object", ("g", "v", "ns", "trainjobs", "n"), ("delete", "TrainJob")),
        ("list_pod_for_all_namespaces", (), ("list", "Pod")),
        ("read_namespaced_pod", ("n", "ns"), ("get", "Pod")),
        ("list_namespaced_event", ("ns",), ("list", "Event")),
        ("list_job_for_all_namespaces", (), ("list", "Job")),
        ("list_node", (), ("list", "Node")),
        ("get_code", (), ("get", "version")),
        ("list_cluster_custom_object", ("g", "v", "somethingelse"), ("list", "custom")),
    ],
)
def test_requests_are_counted_by_a_few_fixed_verbs_and_kinds(
    method: str, args: tuple[Any, ...], expected: tuple[str, str]
) -> None:
    assert request_labels(method, args) == expected


def _process_metrics_port(monkeypatch: Any) -> int:
    from tests.client.conftest import free_port

    port = free_port()
    monkeypatch.setenv("METRICS_PORT", str(port))
    monkeypatch.setenv("METRICS_ADDR", "127.0.0.1")
    assert metrics.serve_process_metrics() == port
    return port


def test_a_worker_or_supervisor_pod_serves_its_processes_metrics_on_metrics_port(
    monkeypatch: Any, settings: Any
) -> None:
    import requests

    settings.METRICS_TOKEN = ""
    port = _process_metrics_port(monkeypatch)
    metrics.KUBERNETES_REQUESTS.labels("get", "Pod", "200").inc()
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert (
        samples(text, "dispatch_kubernetes_requests_total")[
            (("code", "200"), ("kind", "Pod"), ("verb", "get"))
        ]
        >= 1
    )
    assert "dispatch_jobs" not in text  # the database's figures are the web's
    # Through a proxy on this host, loopback is not this host's own scrape.
    proxied = requests.get(
        f"http://127.0.0.1:{port}/metrics", headers={"X-Forwarded-For": "1.2.3.4"}, timeout=5
    )
    assert proxied.status_code == 403 and "dispatch_" not in proxied.text
    monkeypatch.delenv("METRICS_PORT")
    assert metrics.serve_process_metrics() is None


def test_a_worker_or_supervisor_metrics_port_needs_the_scrape_token_when_one_is_set(
    monkeypatch: Any, settings: Any
) -> None:
    """The worker's and supervisor's port serves on every address of its pod: with METRICS_TOKEN set it asks
    for it as the web's /metrics does, so a training pod that can reach the port reads nothing (issue 33)."""
    import requests

    settings.METRICS_TOKEN = "s3cret-scrape-token"
    port = _process_metrics_port(monkeypatch)
    url = f"http://127.0.0.1:{port}/metrics"
    anonymous = requests.get(url, timeout=5)
    assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    assert "dispatch_" not in anonymous.text
    assert requests.get(url, headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 401
    scraped = requests.get(url, headers={"Authorization": "Bearer s3cret-scrape-token"}, timeout=5)
    assert scraped.status_code == 200 and "dispatch_kubernetes_requests" in scraped.text
