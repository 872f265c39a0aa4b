"""The allow-list and the periodic re-check against real runtimes: edits and deletions show up as reasons."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from dispatch_site import roles
from dispatch_site.services import user_create
from runtimes.models import RuntimeVerdict
from runtimes.tasks import runtimes_recheck
from tests.support.dispatch import GROUP, VERSION, runtime_body, trainer_job

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]


@pytest.fixture
def platform(dispatch_on_cluster: str) -> tuple[User, APIClient]:
    user, token = user_create(username="plat", role=roles.PLATFORM, namespaces=["*"])
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return user, api


def _codes(kind: str, name: str, namespace: str = "") -> list[str]:
    latest = RuntimeVerdict.objects.filter(kind=kind, namespace=namespace, name=name).first()
    assert latest is not None
    return latest.codes


def test_recheck_records_an_edit_that_breaks_a_rule_and_a_deletion(
    kube: Any, platform: tuple[User, APIClient], cleanup_cluster_objects: list[tuple[str, str]]
) -> None:
    _, api = platform
    name = f"rt-{uuid.uuid4().hex[:8]}"
    kube.custom.create_cluster_custom_object(
        GROUP, VERSION, "clustertrainingruntimes", runtime_body("ClusterTrainingRuntime", name)
    )
    cleanup_cluster_objects.append(("clustertrainingruntimes", name))

    added = api.post(
        "/api/v1/runtimes/allow-list", {"kind": "ClusterTrainingRuntime", "name": name}, format="json"
    )
    assert added.status_code == 201, added.json()
    assert added.json()["verdict"]["refused"] is False
    assert added.json()["verdict_source"] == "live"
    assert _codes("ClusterTrainingRuntime", name) == []

    runtimes_recheck.apply()
    assert RuntimeVerdict.objects.filter(name=name).count() == 1  # nothing changed, nothing recorded

    body = kube.custom.get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", name)
    trainer_job(body)["template"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    kube.custom.replace_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", name, body)
    runtimes_recheck.apply()
    # The edit both breaks a rule and changes what was reviewed.
    changed = ["runtime-changed-since-review", "restart-policy"]
    assert _codes("ClusterTrainingRuntime", name) == changed
    detail = api.get(f"/api/v1/runtimes/ClusterTrainingRuntime/_/{name}").json()
    assert detail["verdict"]["refused"] is True
    assert [h["codes"] for h in detail["history"]] == [changed, []]
    assert detail["object"]["metadata"]["name"] == name
    assert "managedFields" not in detail["object"]["metadata"]  # bookkeeping is stripped at the gateway

    kube.custom.delete_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", name)
    runtimes_recheck.apply()
    assert _codes("ClusterTrainingRuntime", name) == ["runtime-not-found"]
    assert RuntimeVerdict.objects.filter(name=name).count() == 3


def test_listing_shows_allow_listed_and_other_cluster_runtimes_with_live_verdicts(
    kube: Any, namespace: str, platform: tuple[User, APIClient]
) -> None:
    _, api = platform
    body = runtime_body("TrainingRuntime", "ns-runtime", namespace)
    trainer_job(body)["template"]["spec"]["podFailurePolicy"] = {
        "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", body)
    response = api.post(
        "/api/v1/runtimes/allow-list",
        {"kind": "TrainingRuntime", "namespace": namespace, "name": "ns-runtime", "purposes": ["jobs"]},
        format="json",
    )
    assert response.status_code == 201

    rows = {r["ref"]: r for r in api.get("/api/v1/runtimes").json()["results"]}
    mine = rows[f"TrainingRuntime/{namespace}/ns-runtime"]
    assert mine["allow_listed"] is True
    assert [r["code"] for r in mine["verdict"]["reasons"]] == ["pod-failure-policy-ignore"]
    other = rows["ClusterTrainingRuntime/dispatch-kind"]
    assert other["allow_listed"] is False
    assert [r["code"] for r in other["verdict"]["reasons"]] == ["runtime-not-allowed"]

    # allowRankRestart waives the Ignore rule: the runtime is accepted with an identity warning.
    assert api.patch("/api/v1/settings", {"allow_rank_restart": True}, format="json").status_code == 200
    rows = {r["ref"]: r for r in api.get("/api/v1/runtimes").json()["results"]}
    verdict = rows[f"TrainingRuntime/{namespace}/ns-runtime"]["verdict"]
    assert verdict["refused"] is False
    assert verdict["identity_warning"].startswith(
        "allowRankRestart: the runtime's trainer job states a podFailurePolicy Ignore rule, so a failed rank"
    )
