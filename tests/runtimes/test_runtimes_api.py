"""The allow-list and site settings over REST, per role. The cluster is unreachable here: the
listing falls back to the recorded verdicts and says so (test_runtimes_recheck.py covers the live path)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from dispatch_site.models import AuditEvent
from runtimes.models import AllowListEntry, RuntimeVerdict, SiteSettings

pytestmark = pytest.mark.django_db

DISPATCH_KIND = {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind", "purposes": ["jobs", "sessions"]}


@pytest.mark.parametrize(("who", "status"), [("oncall_api", 403), ("user_api", 403), ("anon_api", 401)])
def test_only_platform_may_allow_a_runtime(request: pytest.FixtureRequest, who: str, status: int) -> None:
    client: APIClient = request.getfixturevalue(who)
    assert client.post("/api/v1/runtimes/allow-list", DISPATCH_KIND, format="json").status_code == status
    assert not AllowListEntry.objects.exists()


def test_platform_allows_and_removes_a_runtime_and_both_are_audited(platform_api: APIClient) -> None:
    response = platform_api.post(
        "/api/v1/runtimes/allow-list", DISPATCH_KIND | {"note": "the test runtime"}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["ref"] == "ClusterTrainingRuntime/dispatch-kind"
    assert body["allow_listed"] is True
    assert sorted(body["purposes"]) == ["jobs", "sessions"]

    listing = platform_api.get("/api/v1/runtimes").json()
    assert [r["ref"] for r in listing["results"]] == ["ClusterTrainingRuntime/dispatch-kind"]
    assert "127.0.0.1:1" in listing["cluster_error"]

    assert (
        platform_api.delete("/api/v1/runtimes/allow-list/ClusterTrainingRuntime/_/dispatch-kind").status_code
        == 204
    )
    assert not AllowListEntry.objects.exists()
    actions = list(AuditEvent.objects.filter(object_type="runtime").values_list("action", "object_id"))
    assert actions == [
        ("runtime.disallow", "ClusterTrainingRuntime/dispatch-kind"),
        ("runtime.allow", "ClusterTrainingRuntime/dispatch-kind"),
    ]


def test_allowing_twice_re_approves(platform_api: APIClient) -> None:
    """POSTing an entry again is a re-approval (200), not a conflict: it records the runtime as it is now.
    The cluster is unreachable here, so nothing could be reviewed: the review says so."""
    assert platform_api.post("/api/v1/runtimes/allow-list", DISPATCH_KIND, format="json").status_code == 201
    response = platform_api.post(
        "/api/v1/runtimes/allow-list", DISPATCH_KIND | {"purposes": ["jobs", "sessions"]}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert sorted(response.json()["purposes"]) == ["jobs", "sessions"]
    assert response.json()["review"]["state"] == "missing"
    assert AuditEvent.objects.filter(action="runtime.reapprove").count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "MPIJob", "name": "x"}, "kind"),
        ({"kind": "ClusterTrainingRuntime", "name": "Not_A_Name"}, "name"),
        ({"kind": "TrainingRuntime", "name": "rt"}, "namespace"),
        ({"kind": "ClusterTrainingRuntime", "name": "rt", "namespace": "team-a"}, "namespace"),
        # Whitespace is not "no namespace" (it was trimmed and accepted, though the schema says empty).
        ({"kind": "ClusterTrainingRuntime", "name": "rt", "namespace": "\u000b"}, "namespace"),
        ({"kind": "ClusterTrainingRuntime", "name": "rt", "purposes": ["batch"]}, "purposes"),
        ({"kind": "ClusterTrainingRuntime", "name": "rt", "purposes": []}, "purposes"),
        ({"kind": "ClusterTrainingRuntime"}, "name"),
        ({"kind": "ClusterTrainingRuntime", "name": "rt", "purpose": ["jobs"]}, "purpose"),
    ],
)
def test_bad_allow_list_input_is_400_with_the_field(platform_api: APIClient, body: dict, field: str) -> None:
    response = platform_api.post("/api/v1/runtimes/allow-list", body, format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_removing_what_is_not_listed_is_404(platform_api: APIClient) -> None:
    assert platform_api.delete("/api/v1/runtimes/allow-list/ClusterTrainingRuntime/_/nope").status_code == 404
    assert platform_api.delete("/api/v1/runtimes/allow-list/Pod/_/nope").status_code == 404


def test_runtime_detail_shows_recorded_history_when_the_cluster_is_unreadable(user_api: APIClient) -> None:
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="rt")
    verdict = {
        "refused": True,
        "reasons": [{"code": "backoff-limit", "message": "m", "path": "p", "waived": False}],
        "identity_warning": None,
        "capabilities": [],
    }
    RuntimeVerdict.objects.create(
        kind="ClusterTrainingRuntime",
        name="rt",
        refused=True,
        verdict=verdict,
        resource_version="42",
        generation=3,
        runtime={"kind": "ClusterTrainingRuntime"},
    )
    body = user_api.get("/api/v1/runtimes/ClusterTrainingRuntime/_/rt").json()
    assert body["verdict_source"] == "recorded"
    assert body["verdict"]["reasons"][0]["code"] == "backoff-limit"
    assert body["history"][0]["codes"] == ["backoff-limit"]
    assert body["history"][0]["resource_version"] == "42"


def test_every_role_reads_settings_only_platform_changes_them(
    user_api: APIClient, oncall_api: APIClient, platform_api: APIClient
) -> None:
    assert user_api.get("/api/v1/settings").json()["publish_via"] == "env"
    assert user_api.patch("/api/v1/settings", {"allow_rank_restart": True}, format="json").status_code == 403
    assert (
        oncall_api.patch("/api/v1/settings", {"allow_rank_restart": True}, format="json").status_code == 403
    )
    response = platform_api.patch("/api/v1/settings", {"allow_rank_restart": True}, format="json")
    assert response.status_code == 200
    assert SiteSettings.load().allow_rank_restart is True
    event = AuditEvent.objects.get(action="settings.update")
    assert event.details == {"allow_rank_restart": {"from": False, "to": True}}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"publish_via": "initContainer"}, "publish_container"),
        ({"publish_container": ""}, "publish_container"),
        ({"publish_via": "sidecar"}, "publish_via"),
        ({"trainer_version": "latest"}, "trainer_version"),
        ({"label_domain": "nodots"}, "label_domain"),
        ({"allow_rank_restart": "perhaps"}, "allow_rank_restart"),
        ({"allowRankRestart": True}, "allowRankRestart"),
    ],
)
def test_bad_settings_are_400(platform_api: APIClient, body: dict, field: str) -> None:
    response = platform_api.patch("/api/v1/settings", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not AuditEvent.objects.filter(action="settings.update").exists()


def test_platform_sets_the_kueue_settings_per_namespace_and_the_change_is_audited(
    user_api: APIClient, platform_api: APIClient
) -> None:
    kueue = {
        "kueue_default_queues": {"team-a": "team-a-queue", "*": "shared"},
        "kueue_priority_classes": {"team-a": ["dispatch-high", "dispatch-low"], "*": []},
    }
    assert user_api.patch("/api/v1/settings", kueue, format="json").status_code == 403
    response = platform_api.patch("/api/v1/settings", kueue, format="json")
    assert response.status_code == 200, response.json()
    assert {k: response.json()[k] for k in kueue} == kueue
    site = SiteSettings.load()
    assert (site.kueue_default_queues, site.kueue_priority_classes) == (
        kueue["kueue_default_queues"],
        kueue["kueue_priority_classes"],
    )
    assert {k: user_api.get("/api/v1/settings").json()[k] for k in kueue} == kueue
    event = AuditEvent.objects.get(action="settings.update")
    assert event.details["kueue_default_queues"] == {"from": {}, "to": kueue["kueue_default_queues"]}
    assert event.details["kueue_priority_classes"]["to"] == kueue["kueue_priority_classes"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"kueue_default_queues": {"Team_A": "q"}}, "is not a namespace name"),
        ({"kueue_default_queues": {"team-a": "Queue"}}, "DNS-1123 subdomain"),
        ({"kueue_default_queues": {"team-a": "q" * 64}}, "at most 63 characters"),
        ({"kueue_default_queues": {"team-a": ["q"]}}, "must be a string"),
        ({"kueue_priority_classes": {"team-a": "dispatch-high"}}, "Expected a list"),
        ({"kueue_priority_classes": {"team-a": [0]}}, "must be a string"),
        ({"kueue_priority_classes": {"team-a": ["high", "high"]}}, "lists a class twice"),
        ({"kueue_priority_classes": {"**": ["high"]}}, "is not a namespace name"),
    ],
)
def test_bad_kueue_settings_are_400_naming_the_namespace(
    platform_api: APIClient, body: dict, message: str
) -> None:
    response = platform_api.patch("/api/v1/settings", body, format="json")
    assert response.status_code == 400, response.json()
    (field,) = body
    assert message in str(response.json()[field])
    assert not AuditEvent.objects.filter(action="settings.update").exists()


def test_the_publish_settings_go_together_whatever_is_stored(platform_api: APIClient) -> None:
    """A request is valid or not on its own (as the schema says), not by what an earlier PATCH stored."""
    set_both = {"publish_via": "initContainer", "publish_container": "publish"}
    assert platform_api.patch("/api/v1/settings", set_both, format="json").status_code == 200
    again = platform_api.patch("/api/v1/settings", {"publish_via": "initContainer"}, format="json")
    assert again.status_code == 400 and "publish_container" in again.json()
    emptied = platform_api.patch("/api/v1/settings", {"publish_container": ""}, format="json")
    assert emptied.status_code == 400 and "publish_via env" in str(emptied.json())
    to_env = {"publish_via": "env", "publish_container": ""}
    back = platform_api.patch("/api/v1/settings", to_env, format="json")
    assert back.status_code == 200 and back.json()["publish_via"] == "env"


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/runtimes/ClusterTrainingRuntime/_/bad%25name",
        "/api/v1/runtimes/ClusterTrainingRuntime/team-a/rt",
        "/api/v1/runtimes/TrainingRuntime/_/rt",
        "/api/v1/runtimes/TrainingRuntime/Team_A/rt",
        "/api/v1/runtimes/Pod/_/rt",
    ],
)
def test_a_name_no_runtime_could_have_is_404_not_a_cluster_error(user_api: APIClient, path: str) -> None:
    response = user_api.get(path)
    assert response.status_code == 404


def test_the_longest_legal_names_are_accepted_and_audited(platform_api: APIClient) -> None:
    name, namespace = "r" * 253, "n" * 63
    response = platform_api.post(
        "/api/v1/runtimes/allow-list",
        {"kind": "TrainingRuntime", "namespace": namespace, "name": name},
        format="json",
    )
    assert response.status_code == 201, response.content
    event = AuditEvent.objects.get(action="runtime.allow")
    assert event.object_id == f"TrainingRuntime/{namespace}/{name}"
