"""Sessions go through Kueue as jobs do (issue 33): a session's TrainJob carries its queue (its queue_name,
else the namespace's default queue), so Kueue admits it against the same quota as everyone's jobs. Against
the real Kueue of the local plane (the module's `kueue` fixture starts it), on a ClusterQueue of the test's
own whose cpu quota holds one session of `plain` (2 pods x 100m) and no more.

What is observed comes from the cluster (the TrainJob's labels and suspend, the pods that exist), not from
dispatch's rows alone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from rest_framework.test import APIClient

from jobs.sessions import services
from runtimes.models import SiteSettings
from tests.jobs.sessions.test_sessions import open_body, plain_runtime, pods_of
from tests.support.cluster import Kube, KueueQueue
from tests.support.dispatch import GROUP, VERSION, wait_for
from tests.support.kueue import KUEUE, QUEUE_LABEL

pytestmark = pytest.mark.cluster


@pytest.fixture
def session_queue(kube: Kube, namespace: str, kueue: None) -> Iterator[KueueQueue]:
    """LocalQueue `sessions` on a ClusterQueue of its own: cpu 200m, room for one 2-pod session of `plain`."""
    queue = KueueQueue(name="sessions", namespace=namespace, cluster_queue=f"{namespace}-sessions")
    kube.custom.create_cluster_custom_object(
        *KUEUE,
        "clusterqueues",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "ClusterQueue",
            "metadata": {"name": queue.cluster_queue, "labels": {"dispatch.test/cluster": "true"}},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": "dispatch-kwok",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "200m"},
                                    {"name": "memory", "nominalQuota": "1Gi"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    try:
        kube.custom.create_namespaced_custom_object(
            *KUEUE,
            namespace,
            "localqueues",
            {
                "apiVersion": "/".join(KUEUE),
                "kind": "LocalQueue",
                "metadata": {"name": queue.name},
                "spec": {"clusterQueue": queue.cluster_queue},
            },
        )
        yield queue
    finally:
        try:
            kube.custom.delete_cluster_custom_object(*KUEUE, "clusterqueues", queue.cluster_queue)
        except ApiException as exc:
            if exc.status != 404:
                raise


def _trainjob(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs", name
    )
    return found


def test_a_session_waits_for_the_queues_quota_and_runs_once_another_session_frees_it(
    kube: Kube, namespace: str, api: APIClient, session_queue: KueueQueue
) -> None:
    """Two sessions on one queue that holds one: the first runs; the second's TrainJob carries the queue
    label, stays suspended and makes no pod while the first holds the quota; closing the first lets Kueue
    admit the second, which then runs."""
    runtime = plain_runtime(kube, namespace)
    first = api.post(
        "/api/v1/sessions?wait=60",
        open_body(namespace, runtime, name="first", queue_name=session_queue.name),
        format="json",
    )
    assert first.status_code == 200, first.content
    assert first.json()["state"] == "running" and first.json()["queue"] == session_queue.name
    assert _trainjob(kube, namespace, "first")["metadata"]["labels"][QUEUE_LABEL] == session_queue.name

    second = api.post(
        "/api/v1/sessions?wait=8",
        open_body(namespace, runtime, name="second", queue_name=session_queue.name, timeout_seconds=120),
        format="json",
    )
    assert second.status_code in (200, 202), second.content
    assert second.json()["state"] == "starting", second.json()
    held = _trainjob(kube, namespace, "second")
    assert held["metadata"]["labels"][QUEUE_LABEL] == session_queue.name
    assert held["spec"].get("suspend") is True  # Kueue holds it: no quota left
    assert pods_of(kube, namespace, "second") == []

    closed = api.delete(f"/api/v1/sessions/{first.json()['id']}?wait=60")
    assert closed.status_code == 200 and closed.json()["state"] == "closed", closed.content

    def running() -> bool:
        # What the session's watcher task does each look; the answer is read through the API.
        services.session_observe(session_id=second.json()["id"])
        return bool(api.get(f"/api/v1/sessions/{second.json()['id']}").json()["state"] == "running")

    wait_for(running, timeout=90, what="the second session running once the first freed the quota")
    assert [p.status.phase for p in pods_of(kube, namespace, "second")].count("Running") == 2
    assert api.delete(f"/api/v1/sessions/{second.json()['id']}?wait=60").json()["state"] == "closed"


def test_a_session_takes_the_namespaces_default_queue_and_a_missing_queue_is_refused(
    kube: Kube, namespace: str, api: APIClient, session_queue: KueueQueue
) -> None:
    """No queue_name: the site's default queue for the namespace, as a job's. A queue that does not exist
    is refused before anything is created, with the plan's code."""
    runtime = plain_runtime(kube, namespace)
    site = SiteSettings.load()
    site.kueue_default_queues = {namespace: session_queue.name}
    site.save()
    opened = api.post("/api/v1/sessions?wait=60", open_body(namespace, runtime, name="dflt"), format="json")
    assert opened.status_code == 200, opened.content
    assert opened.json()["queue"] == session_queue.name and opened.json()["state"] == "running"
    assert _trainjob(kube, namespace, "dflt")["metadata"]["labels"][QUEUE_LABEL] == session_queue.name
    assert api.delete(f"/api/v1/sessions/{opened.json()['id']}?wait=60").json()["state"] == "closed"

    refused = api.post(
        "/api/v1/sessions", open_body(namespace, runtime, name="nowhere", queue_name="absent"), format="json"
    )
    assert refused.status_code == 422, refused.content
    assert [r["code"] for r in refused.json()["reasons"]] == ["queue-not-found"]
    assert "LocalQueue absent does not exist" in refused.json()["reasons"][0]["message"]
    listed = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"]
    assert [t["metadata"]["name"] for t in listed if t["metadata"]["name"] == "nowhere"] == []
