"""Reads follow the grants against the real API server: TrainingRuntimes only from granted namespaces
(platform: all), ClusterTrainingRuntimes for everyone, and dispatch's own per-job copies (made here by a real
start) never shown as runtimes or planned on; nobody else's job id appears in what a user reads."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from kubernetes import client
from rest_framework.test import APIClient

from dispatch_site import roles
from dispatch_site.services import user_create
from jobs.models import Job
from runtimes.models import AllowListEntry
from tests.support.dispatch import GROUP, VERSION, runtime_body

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


@pytest.fixture
def other_namespace(kube: Any, dispatch_on_cluster: str) -> Iterator[str]:
    """A second namespace with a TrainingRuntime `b-runtime` in it."""
    name = f"t-grants-b-{uuid.uuid4().hex[:6]}"
    kube.core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"dispatch.test/cluster": "true"}))
    )
    try:
        kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, name, "trainingruntimes", runtime_body("TrainingRuntime", "b-runtime", name)
        )
        AllowListEntry.objects.create(kind="TrainingRuntime", namespace=name, name="b-runtime")
        yield name
    finally:
        with contextlib.suppress(Exception):
            kube.core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def world(
    kube: Any,
    namespace: str,
    other_namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> dict[str, Any]:
    """sam (namespace A) started a real job, so A holds its runtime copy; amy shares A; pat is platform;
    olive is on-call with no namespace."""
    namespaced_runtime()
    AllowListEntry.objects.get_or_create(kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind")
    body = {
        "runtime": {"kind": "TrainingRuntime", "name": "team-runtime"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
        "env": {"KWOK_STAY_RUNNING": "1"},
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = _api(submitter[1]).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    copy_name = f"{job.id}-1"
    copy = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", copy_name)
    assert copy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "dispatch"  # a real copy exists
    suffix = namespace[-6:]
    tokens = {
        "sam": submitter[1],
        "amy": user_create(username=f"amy-{suffix}", role=roles.USER, namespaces=[namespace])[1],
        "pat": user_create(username=f"pat-{suffix}", role=roles.PLATFORM, namespaces=["*"])[1],
        "olive": user_create(username=f"olive-{suffix}", role=roles.ONCALL)[1],
    }
    return {"job": job.id, "copy": copy_name, "a": namespace, "b": other_namespace, "tokens": tokens}


def _rows(world: dict[str, Any], who: str) -> tuple[list[dict[str, Any]], str]:
    response = _api(world["tokens"][who]).get("/api/v1/runtimes")
    assert response.status_code == 200
    assert response.json()["cluster_error"] is None  # the live list
    return response.json()["results"], response.content.decode()


def test_each_role_lists_exactly_its_namespaces_and_never_a_copy(kube: Any, world: dict[str, Any]) -> None:
    a, b, job = world["a"], world["b"], world["job"]
    selector = "app.kubernetes.io/managed-by=dispatch"
    every_copy = kube.custom.list_cluster_custom_object(
        GROUP, VERSION, "trainingruntimes", label_selector=selector
    )
    copies = {(c["metadata"]["namespace"], c["metadata"]["name"]) for c in every_copy["items"]}
    assert (a, world["copy"]) in copies
    expected = {"sam": {a}, "amy": {a}, "olive": set(), "pat": {a, b}}
    for who, namespaces in expected.items():
        rows, text = _rows(world, who)
        refs = {r["ref"] for r in rows}
        namespaced = {r["namespace"] for r in rows if r["kind"] == "TrainingRuntime"}
        # Other tests share the cluster: only the platform role may see their namespaces.
        assert namespaced == namespaces if who != "pat" else namespaces <= namespaced, who
        assert "ClusterTrainingRuntime/dispatch-kind" in refs, who
        assert job not in text, who  # the copy (named and labelled with the job id) is not there
        shown = {(r["namespace"], r["name"]) for r in rows}
        assert not shown & copies, who
    assert f"TrainingRuntime/{a}/team-runtime" in {r["ref"] for r in _rows(world, "amy")[0]}
    assert f"TrainingRuntime/{b}/b-runtime" in {r["ref"] for r in _rows(world, "pat")[0]}


def test_details_of_a_copy_and_of_an_ungranted_namespace_are_404(world: dict[str, Any]) -> None:
    a, b, copy = world["a"], world["b"], world["copy"]
    for who in ("amy", "sam", "pat"):
        response = _api(world["tokens"][who]).get(f"/api/v1/runtimes/TrainingRuntime/{a}/{copy}")
        assert response.status_code == 404, who
        assert "managed-by" not in response.content.decode()
    assert (
        _api(world["tokens"]["amy"]).get(f"/api/v1/runtimes/TrainingRuntime/{b}/b-runtime").status_code == 404
    )
    assert (
        _api(world["tokens"]["pat"]).get(f"/api/v1/runtimes/TrainingRuntime/{b}/b-runtime").status_code == 200
    )
    assert (
        _api(world["tokens"]["amy"]).get(f"/api/v1/runtimes/TrainingRuntime/{a}/team-runtime").status_code
        == 200
    )


def test_runtime_pages_follow_the_grants(world: dict[str, Any]) -> None:
    a, b, copy, job = world["a"], world["b"], world["copy"], world["job"]
    page = Client()
    page.force_login(User.objects.get(username=f"amy-{a[-6:]}"))
    listing = page.get("/runtimes/").content.decode()
    assert f'data-ref="TrainingRuntime/{a}/team-runtime"' in listing
    assert job not in listing and b not in listing
    assert page.get(f"/runtimes/TrainingRuntime/{a}/{copy}/").status_code == 404
    assert page.get(f"/runtimes/TrainingRuntime/{b}/b-runtime/").status_code == 404


def test_a_copy_cannot_be_planned_or_started_on_and_its_content_is_not_shown(world: dict[str, Any]) -> None:
    a, copy = world["a"], world["copy"]
    amy = _api(world["tokens"]["amy"])
    body = {
        "runtime": {"kind": "TrainingRuntime", "name": copy},
        "namespace": a,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
    }
    plan = amy.post("/api/v1/plan", body, format="json")
    assert plan.status_code == 200
    assert "runtime-not-found" in [r["code"] for r in plan.json()["reasons"]]
    assert plan.json()["objects"] is None
    assert "managed-by" not in plan.content.decode() and "dispatch.dev/job" not in plan.content.decode()
    started = amy.post("/api/v1/jobs", body, format="json")
    assert started.status_code == 422
    assert "runtime-not-found" in [r["code"] for r in started.json()["reasons"]]
    assert "managed-by" not in started.content.decode()


def test_plan_in_an_ungranted_namespace_is_403_and_other_jobs_stay_hidden(world: dict[str, Any]) -> None:
    b, job = world["b"], world["job"]
    body = {
        "runtime": {"kind": "TrainingRuntime", "name": "b-runtime"},
        "namespace": b,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
    }
    response = _api(world["tokens"]["sam"]).post("/api/v1/plan", body, format="json")
    assert response.status_code == 403
    assert "b-runtime" not in response.content.decode()
    assert _api(world["tokens"]["pat"]).post("/api/v1/plan", body, format="json").status_code == 200
    amy = _api(world["tokens"]["amy"])
    assert job not in amy.get("/api/v1/jobs").content.decode()
    assert amy.get(f"/api/v1/jobs/{job}").status_code == 404
