"""Site settings against Kueue v0.19.2 on the local control plane (issue 37): a default LocalQueue or a
priority class that does not exist is a 422 naming the namespace and the queue (the value an outside fuzzer
saved, after which every job was refused queue-not-found); a real LocalQueue and WorkloadPriorityClass are
accepted with no warning. Kueue runs for this module only (fixture `kueue`, tests/support/cluster.py); each
test's namespace has a LocalQueue `dispatch` (fixture `kueue_queue`) and is granted to a user, as a site's
namespaces are. Without Kueue: test_settings_kueue_absent.py."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from dispatch_site.models import AuditEvent
from jobs.models import Job, JobState
from jobs.naming import new_job_id
from runtimes.models import SiteSettings
from tests.support.cluster import KueueQueue

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]

FUZZED_QUEUE = "90e0n70b.o.327.s.i.7"  # what schemathesis saved as {"*": ...}


@pytest.fixture
def site_namespace(kueue_queue: KueueQueue, dispatch_on_cluster: str, make_user: Any) -> str:
    make_user("gina", namespaces=(kueue_queue.namespace,))
    return kueue_queue.namespace


def _refused(api: APIClient, body: dict[str, Any]) -> dict[str, Any]:
    before = SiteSettings.load().as_dict()
    response = api.patch("/api/v1/settings", body, format="json")
    assert response.status_code == 422, response.json()
    assert SiteSettings.load().as_dict() == before
    assert not AuditEvent.objects.filter(action="settings.update").exists()
    errors: dict[str, Any] = response.json()
    return errors


def test_the_fuzzed_default_queue_is_refused_naming_the_namespace_and_the_queue(
    platform_api: APIClient, site_namespace: str
) -> None:
    errors = _refused(platform_api, {"kueue_default_queues": {"*": FUZZED_QUEUE}})
    (message,) = errors["kueue_default_queues"]["*"]
    assert f"LocalQueue '{FUZZED_QUEUE}' does not exist in namespace {site_namespace}" in message
    assert "queue-not-found" in message
    errors = _refused(platform_api, {"kueue_default_queues": {site_namespace: "no-such-queue"}})
    assert (
        f"does not exist in namespace {site_namespace}" in errors["kueue_default_queues"][site_namespace][0]
    )


def test_a_priority_class_that_does_not_exist_is_refused(
    platform_api: APIClient, site_namespace: str
) -> None:
    body = {"kueue_priority_classes": {site_namespace: ["dispatch-high", "no-such-class"]}}
    errors = _refused(platform_api, body)
    (message,) = errors["kueue_priority_classes"][site_namespace]
    assert "WorkloadPriorityClass 'no-such-class' does not exist" in message
    assert "dispatch-high" not in message


def test_a_real_local_queue_and_priority_class_are_accepted_without_a_warning(
    platform_api: APIClient, site_namespace: str, kueue_queue: KueueQueue
) -> None:
    body = {
        "kueue_default_queues": {"*": kueue_queue.name},  # read in the granted namespace
        "kueue_priority_classes": {site_namespace: ["dispatch-low", "dispatch-high"]},
    }
    response = platform_api.patch("/api/v1/settings", body, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["warnings"] == []
    assert SiteSettings.load().kueue_default_queues == body["kueue_default_queues"]
    event = AuditEvent.objects.get(action="settings.update")
    assert "warnings" not in event.details
    assert event.details["kueue_default_queues"]["to"] == body["kueue_default_queues"]
    # The namespace's own entry naming the real queue is accepted too; an unchanged entry is not read again,
    # a new one is.
    own = {"*": kueue_queue.name, site_namespace: kueue_queue.name}
    response = platform_api.patch("/api/v1/settings", {"kueue_default_queues": own}, format="json")
    assert response.status_code == 200 and response.json()["warnings"] == []
    again = platform_api.patch(
        "/api/v1/settings", {"kueue_default_queues": {**own, "team-x": "gone"}}, format="json"
    )
    assert again.status_code == 422 and list(again.json()["kueue_default_queues"]) == ["team-x"]


def test_the_star_queue_is_read_where_jobs_wait_even_without_a_grant_by_name(
    platform_api: APIClient, platform_user: tuple[Any, str], kueue_queue: KueueQueue, dispatch_on_cluster: str
) -> None:
    """A site that grants every namespace ("*") names none; the namespaces with waiting jobs are known."""
    namespace = kueue_queue.namespace
    Job.objects.create(
        id=new_job_id(),
        owner=platform_user[0],
        namespace=namespace,
        runtime_kind="ClusterTrainingRuntime",
        runtime_name="dispatch-kind",
        spec={},
        state=JobState.QUEUED,
    )
    errors = _refused(platform_api, {"kueue_default_queues": {"*": FUZZED_QUEUE}})
    assert f"does not exist in namespace {namespace}" in errors["kueue_default_queues"]["*"][0]
    ok = platform_api.patch(
        "/api/v1/settings", {"kueue_default_queues": {"*": kueue_queue.name}}, format="json"
    )
    assert ok.status_code == 200 and ok.json()["warnings"] == [], ok.json()
