"""Site settings refuse what would break submission (issue 37), without a cluster: the values an outside
fuzzer (schemathesis) saved are 400s with field errors, and a Kueue setting the cluster cannot be asked about
is saved with a warning (in the answer, on the page and in the audit), not silently. The settings page
previews how many namespaces and queued jobs a change affects before it is saved. The same against Kueue on
the local control plane: test_settings_kueue.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from dispatch_site.models import AuditEvent
from jobs.models import Job, JobState
from jobs.naming import new_job_id
from runtimes.models import SiteSettings
from runtimes.settings_checks import TRAINER_RELEASES

pytestmark = pytest.mark.django_db


def _refused(api: APIClient, body: dict[str, Any]) -> dict[str, Any]:
    before = SiteSettings.load().as_dict()
    response = api.patch("/api/v1/settings", body, format="json")
    assert response.status_code == 400, response.json()
    assert SiteSettings.load().as_dict() == before
    assert not AuditEvent.objects.filter(action="settings.update").exists()
    errors: dict[str, Any] = response.json()
    return errors


@pytest.mark.parametrize("version", ["v2.9.963733315945005", "v2.4.0", "v2.3.0-rc.1", "2.3", "latest"])
def test_a_trainer_version_that_is_not_a_known_release_is_refused_naming_the_known_ones(
    platform_api: APIClient, version: str
) -> None:
    errors = _refused(platform_api, {"trainer_version": version})
    (message,) = errors["trainer_version"]
    assert f'"{version}" is not a Kubeflow Trainer release dispatch knows' in message
    assert ", ".join(TRAINER_RELEASES) in message


def test_a_known_trainer_release_is_saved_and_audited(platform_api: APIClient) -> None:
    response = platform_api.patch("/api/v1/settings", {"trainer_version": "v2.2.1"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["trainer_version"] == "v2.2.1" and response.json()["warnings"] == []
    assert SiteSettings.load().trainer_version == "v2.2.1"
    event = AuditEvent.objects.get(action="settings.update")
    assert event.details == {"trainer_version": {"from": "v2.3.0", "to": "v2.2.1"}}


@pytest.mark.parametrize(
    ("policy", "where", "bound"),
    [
        ({"budgets": {"infrastructure": 5000}}, ("budgets", "infrastructure"), "less than or equal to 10"),
        ({"budgets": {"user": 1000}}, ("budgets", "user"), "less than or equal to 10"),
        ({"retry": {"preempted": 2000}}, ("retry", "preempted"), "less than or equal to 10"),
        (
            {"backoff_seconds": {"node-lost": 86400}},
            ("backoff_seconds", "node-lost"),
            "less than or equal to 3600",
        ),
        ({"budgets": {"infrastructure": -1}}, ("budgets", "infrastructure"), "greater than or equal to 0"),
    ],
)
def test_recovery_budgets_and_backoffs_outside_their_bounds_are_refused_naming_the_bound(
    platform_api: APIClient, policy: dict[str, Any], where: tuple[str, str], bound: str
) -> None:
    errors = _refused(platform_api, {"recovery_policy": policy})
    part, key = where
    assert bound in str(errors["recovery_policy"][part][key])


@pytest.mark.parametrize("cap", [0, 101, -1, "many"])
def test_an_open_session_cap_outside_1_to_100_is_refused(platform_api: APIClient, cap: Any) -> None:
    assert "max_open_sessions_per_user" in _refused(platform_api, {"max_open_sessions_per_user": cap})


def test_the_open_session_cap_is_saved_and_audited(platform_api: APIClient) -> None:
    response = platform_api.patch("/api/v1/settings", {"max_open_sessions_per_user": 1}, format="json")
    assert response.status_code == 200 and response.json()["max_open_sessions_per_user"] == 1
    assert SiteSettings.load().max_open_sessions_per_user == 1
    event = AuditEvent.objects.get(action="settings.update")
    assert event.details["max_open_sessions_per_user"] == {"from": 5, "to": 1}


def test_a_kueue_setting_the_cluster_cannot_confirm_is_saved_with_a_warning(
    platform_api: APIClient, make_user: Any
) -> None:
    """The tests' API server is unreachable: the schemathesis value is saved, and the answer, the audit and
    the page say it was not checked."""
    make_user("tess", namespaces=("team-a",))
    body = {"kueue_default_queues": {"*": "90e0n70b.o.327.s.i.7"}, "kueue_priority_classes": {"*": ["high"]}}
    response = platform_api.patch("/api/v1/settings", body, format="json")
    assert response.status_code == 200, response.json()
    warnings = response.json()["warnings"]
    assert any("the cluster could not be read" in w for w in warnings), warnings
    assert any("LocalQueue team-a/90e0n70b.o.327.s.i.7" in w for w in warnings), warnings
    assert any("WorkloadPriorityClass high" in w for w in warnings), warnings
    assert SiteSettings.load().kueue_default_queues == {"*": "90e0n70b.o.327.s.i.7"}
    event = AuditEvent.objects.get(action="settings.update")
    assert event.details["warnings"] == warnings
    assert event.details["kueue_default_queues"]["to"] == {"*": "90e0n70b.o.327.s.i.7"}


def _login(client: Client, username: str) -> None:
    assert client.login(username=username, password=f"pw-{username}")


FORM = {"publish_via": "env", "label_domain": "dispatch.dev", "trainer_version": "v2.3.0"}


def test_the_page_refuses_an_unknown_trainer_version_naming_the_releases(
    client: Client, platform_user: object
) -> None:
    _login(client, "pat")
    response = client.post("/settings/", FORM | {"trainer_version": "v2.9.963733315945005"})
    assert response.status_code == 400
    assert SiteSettings.load().trainer_version == "v2.3.0"
    page = response.content.decode()
    assert "Select a valid choice" in page and all(v in page for v in TRAINER_RELEASES)


def test_the_page_saves_an_unconfirmed_queue_with_a_warning(client: Client, platform_user: object) -> None:
    _login(client, "pat")
    form = FORM | {"kueue_default_queues": '{"team-a": "team-a-queue"}'}
    page = client.post("/settings/", form, follow=True).content.decode()
    assert "Site settings saved." in page
    assert "the cluster could not be read" in page and "LocalQueue team-a/team-a-queue" in page
    assert SiteSettings.load().kueue_default_queues == {"team-a": "team-a-queue"}


def _jobs(owner: Any, namespace: str, state: str, n: int) -> None:
    for _ in range(n):
        Job.objects.create(
            id=new_job_id(),
            owner=owner,
            namespace=namespace,
            runtime_kind="ClusterTrainingRuntime",
            runtime_name="dispatch-kind",
            spec={},
            state=state,
        )


def test_the_page_previews_the_namespaces_and_queued_jobs_a_change_affects_before_saving(
    client: Client, platform_user: tuple[Any, str], make_user: Any
) -> None:
    make_user("ann", namespaces=("team-a",))
    make_user("bob", namespaces=("team-b",))
    make_user("cyd", namespaces=("team-c",))
    owner = platform_user[0]
    _jobs(owner, "team-a", JobState.QUEUED, 2)
    _jobs(owner, "team-a", JobState.PENDING, 1)
    _jobs(owner, "team-a", JobState.RUNNING, 4)  # running: not waiting
    _jobs(owner, "team-b", JobState.QUEUED, 5)
    _jobs(owner, "team-c", JobState.QUEUED, 7)
    site = SiteSettings.load()
    site.kueue_default_queues = {"team-c": "c-queue"}
    site.save()
    _login(client, "pat")

    # "*" reaches every namespace without its own entry: team-a and team-b, not team-c.
    queues = FORM | {"kueue_default_queues": '{"*": "shared", "team-c": "c-queue"}', "preview": "1"}
    response = client.post("/settings/", queues)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Preview: not saved yet" in page
    assert "2 namespaces" in page and "8 queued jobs" in page and "team-a, team-b" in page
    assert SiteSettings.load().kueue_default_queues == {"team-c": "c-queue"}  # nothing was saved
    assert not AuditEvent.objects.filter(action="settings.update").exists()

    # A site-wide setting reaches every namespace dispatch knows.
    page = client.post("/settings/", FORM | {"trainer_version": "v2.2.1", "preview": "1"}).content.decode()
    assert "3 namespaces" in page and "15 queued jobs" in page and "every namespace dispatch knows" in page
    assert SiteSettings.load().trainer_version == "v2.3.0"

    # Saving it is the same form without preview.
    saved = client.post("/settings/", FORM | {"trainer_version": "v2.2.1"}, follow=True).content.decode()
    assert "Site settings saved." in saved and "Preview: not saved yet" not in saved
    assert AuditEvent.objects.get(action="settings.update").details["trainer_version"]["to"] == "v2.2.1"
