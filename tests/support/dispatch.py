"""Fixtures that point dispatch itself (the gateway, services, tasks) at the real local control plane."""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from dispatch_site import roles
from dispatch_site.services import user_create
from runtimes.models import AllowListEntry
from tests.support.deploy import (  # noqa: F401 (fixtures)
    component_serviceaccount,
    dispatch_serviceaccount,
    example_manifests,
)

REPO = Path(__file__).resolve().parents[2]
DISPATCH_KIND = yaml.safe_load((REPO / "scripts" / "k8s" / "dispatch-kind.yaml").read_text())
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


@pytest.fixture
def dispatch_on_cluster(kubeconfig: str, settings: Any, db: None, request: pytest.FixtureRequest) -> str:
    """dispatch's settings now name the real API server: as admin, or with DISPATCH_TEST_AS_SERVICEACCOUNT=1
    with a kubeconfig holding only the token of deploy's ServiceAccount (its RBAC applied, the test's
    namespace granted as an installation grants it); the tests' own ``kube`` stays admin."""
    settings.KUBECONFIG = kubeconfig
    if os.environ.get("DISPATCH_TEST_AS_SERVICEACCOUNT") == "1":
        account = request.getfixturevalue("dispatch_serviceaccount")
        if "namespace" in request.fixturenames:
            account.grant(request.getfixturevalue("namespace"))
        settings.KUBECONFIG = account.kubeconfig
    settings.KUBE_TIMEOUT_SECONDS = 20
    return str(settings.KUBECONFIG)


@pytest.fixture
def submitter(dispatch_on_cluster: str, namespace: str) -> tuple[User, str]:
    """A plain user granted the test's namespace."""
    return user_create(
        username=f"sam-{namespace[-6:]}", role=roles.USER, namespaces=[namespace], password="pw"
    )


def runtime_body(kind: str, name: str, namespace: str | None = None, **changes: Any) -> dict[str, Any]:
    """dispatch-kind under another name and kind."""
    body = copy.deepcopy(DISPATCH_KIND)
    body["kind"] = kind
    body["metadata"] = {"name": name} | ({"namespace": namespace} if namespace else {})
    return body


def trainer_job(body: dict[str, Any]) -> dict[str, Any]:
    job: dict[str, Any] = body["spec"]["template"]["spec"]["replicatedJobs"][0]
    return job


@pytest.fixture
def namespaced_runtime(kube: Any, namespace: str, dispatch_on_cluster: str) -> Callable[..., dict[str, Any]]:
    """Creates a TrainingRuntime in the test namespace (allow-listed unless told otherwise)."""

    def create(
        name: str = "team-runtime",
        *,
        allow: bool = True,
        mutate: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        body = runtime_body("TrainingRuntime", name, namespace)
        if mutate:
            mutate(body)
        created: dict[str, Any] = kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingruntimes", body
        )
        if allow:
            AllowListEntry.objects.create(
                kind="TrainingRuntime", namespace=namespace, name=name, for_jobs=True
            )
        return created

    return create


def wait_for(
    predicate: Callable[[], Any], timeout: float = 60, interval: float = 0.25, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def trainjob_exists(kube: Any, namespace: str, name: str) -> bool:
    from kubernetes.client.rest import ApiException

    try:
        kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def trainjob_made_again(
    kube: Any, namespace: str, ours: dict[str, Any], runtime: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Deletes the TrainJob `ours` outside dispatch and makes another under its name, with its labels and
    annotations (dispatch's body hash too): somebody's copy. It runs on `runtime` (the runtime copy went with
    `ours`, its owner); `env` replaces its trainer's environment. Returns the new TrainJob."""
    name = ours["metadata"]["name"]
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
    wait_for(
        lambda: not trainjob_exists(kube, namespace, name),
        timeout=30,
        what=f"TrainJob {namespace}/{name} deleted",
    )
    spec = {**ours["spec"], "runtimeRef": {**ours["spec"]["runtimeRef"], "name": runtime}}
    if env is not None:
        spec["trainer"] = {**spec["trainer"], "env": [{"name": k, "value": v} for k, v in env.items()]}
    made: dict[str, Any] = kube.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "trainjobs",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainJob",
            "metadata": {
                "name": name,
                "labels": ours["metadata"]["labels"],
                "annotations": ours["metadata"].get("annotations") or {},
            },
            "spec": spec,
        },
    )
    return made


@pytest.fixture
def cleanup_cluster_objects(kube: Any) -> Iterator[list[tuple[str, str]]]:
    """Cluster-scoped objects a test made, deleted afterwards: (plural, name)."""
    made: list[tuple[str, str]] = []
    yield made
    for plural, name in made:
        with contextlib.suppress(Exception):
            kube.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)


# ---------------------------------------------------------------- dispatch's REST API, as a test user


def api_as(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


def job_body(namespace: str, **extra: Any) -> dict[str, Any]:
    """A POST /api/v1/jobs body on dispatch-kind, with `extra` fields."""
    return {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
    } | extra


def submit_job(token: str, body: dict[str, Any], capture: Any) -> str:
    """POST /api/v1/jobs with its on-commit work run (`capture`: django_capture_on_commit_callbacks); it must
    answer 202: the job's id."""
    with capture(execute=True):
        response = api_as(token).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.json()
    job_id: str = response.json()["id"]
    return job_id


def get_job(token: str, job_id: str) -> dict[str, Any]:
    response = api_as(token).get(f"/api/v1/jobs/{job_id}")
    assert response.status_code == 200
    data: dict[str, Any] = response.json()
    return data


@pytest.fixture
def dispatch_kind_allowed(db: None) -> None:
    """dispatch-kind on the allow-list for jobs (use with pytest.mark.usefixtures)."""
    AllowListEntry.objects.get_or_create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
