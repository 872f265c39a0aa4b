"""Reads follow the grants, without the cluster (test_grants.py covers the live reads): the
allow-list and the recorded verdicts per role and namespace, plan for an ungranted namespace, and jobs of
other users, which never show up, not even their ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from runtimes.models import AllowListEntry, RuntimeVerdict
from tests.jobs.dashboard.test_job_pages import make_job

pytestmark = pytest.mark.django_db

CTR = "ClusterTrainingRuntime/shared"
RT_A = "TrainingRuntime/team-a/rt-a"
RT_B = "TrainingRuntime/team-b/rt-b"
COPY_LABELS = {"app.kubernetes.io/managed-by": "dispatch", "dispatch.dev/job": "jsecretjob0001"}


@pytest.fixture
def listed() -> None:
    """Three allow-listed runtimes with recorded verdicts (the cluster is unreachable here)."""
    for kind, namespace, name in (
        ("ClusterTrainingRuntime", "", "shared"),
        ("TrainingRuntime", "team-a", "rt-a"),
        ("TrainingRuntime", "team-b", "rt-b"),
    ):
        AllowListEntry.objects.create(kind=kind, namespace=namespace, name=name)
        body: dict[str, Any] = {"kind": kind, "metadata": {"name": name, "namespace": namespace}}
        if name == "rt-a":  # a recorded object that turned out to be one of dispatch's copies
            body["metadata"]["labels"] = COPY_LABELS
        RuntimeVerdict.objects.create(
            kind=kind, namespace=namespace, name=name, refused=False, verdict={"refused": False}, runtime=body
        )


def _refs(client: APIClient) -> set[str]:
    response = client.get("/api/v1/runtimes")
    assert response.status_code == 200
    assert response.json()["cluster_error"]  # the recorded fallback, not the live list
    return {row["ref"] for row in response.json()["results"]}


@pytest.mark.parametrize(
    ("who", "expected"),
    [
        ("platform_api", {CTR, RT_A, RT_B}),
        ("user_api", {CTR, RT_A}),  # uma: team-a
        ("oncall_api", {CTR}),  # olive: no namespace granted
    ],
)
def test_runtime_list_shows_cluster_runtimes_and_the_granted_namespaces(
    request: pytest.FixtureRequest, listed: None, who: str, expected: set[str]
) -> None:
    assert _refs(request.getfixturevalue(who)) == expected


def test_a_runtime_of_an_ungranted_namespace_is_404_like_a_missing_one(
    listed: None, user_api: APIClient
) -> None:
    ungranted = user_api.get("/api/v1/runtimes/TrainingRuntime/team-b/rt-b")
    missing = user_api.get("/api/v1/runtimes/TrainingRuntime/team-a/no-such-runtime")
    assert ungranted.status_code == 404
    assert missing.status_code in (404, 503)  # unreachable cluster: 503 for a name it cannot rule out
    assert "rt-b" not in ungranted.content.decode() and "team-b" not in ungranted.content.decode()
    assert user_api.get("/api/v1/runtimes/TrainingRuntime/team-a/rt-a").status_code == 200


def test_a_recorded_copy_never_shows_its_object(listed: None, platform_api: APIClient) -> None:
    response = platform_api.get("/api/v1/runtimes/TrainingRuntime/team-a/rt-a")
    assert response.status_code == 200
    assert response.json()["object"] is None
    assert "jsecretjob0001" not in response.content.decode()


def test_a_user_granted_everything_reads_every_namespace(
    listed: None, make_user: Callable[..., tuple[User, str]]
) -> None:
    _, token = make_user("wide", namespaces=("*",))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert _refs(client) == {CTR, RT_A, RT_B}


class TestRuntimePages:
    def test_list_page_shows_only_the_granted_runtimes(
        self, client: Client, listed: None, plain_user: Any
    ) -> None:
        client.login(username="uma", password="pw-uma")
        page = client.get("/runtimes/").content.decode()
        assert (
            'data-ref="TrainingRuntime/team-a/rt-a"' in page
            and 'data-ref="ClusterTrainingRuntime/shared"' in page
        )
        assert "rt-b" not in page and "team-b" not in page

    def test_detail_page_of_an_ungranted_runtime_is_404(
        self, client: Client, listed: None, plain_user: Any
    ) -> None:
        client.login(username="uma", password="pw-uma")
        assert client.get("/runtimes/TrainingRuntime/team-b/rt-b/").status_code == 404
        assert client.get("/runtimes/TrainingRuntime/team-a/rt-a/").status_code == 200

    def test_platform_sees_every_namespace_on_the_page(
        self, client: Client, listed: None, platform_user: Any
    ) -> None:
        client.login(username="pat", password="pw-pat")
        page = client.get("/runtimes/").content.decode()
        assert all(f'data-ref="{ref}"' in page for ref in (CTR, RT_A, RT_B))
        assert "jsecretjob0001" not in client.get("/runtimes/TrainingRuntime/team-a/rt-a/").content.decode()


PLAN = {
    "runtime": {"kind": "TrainingRuntime", "name": "rt-b"},
    "image": "localhost/trainer:v1",
    "num_nodes": 1,
}


@pytest.mark.parametrize(("who", "status"), [("user_api", 403), ("oncall_api", 403), ("platform_api", 503)])
def test_plan_for_an_ungranted_namespace_is_403(
    request: pytest.FixtureRequest, who: str, status: int
) -> None:
    # The platform user is granted "*": it gets past the grant to the (unreachable) cluster, hence 503.
    client: APIClient = request.getfixturevalue(who)
    response = client.post("/api/v1/plan", PLAN | {"namespace": "team-b"}, format="json")
    assert response.status_code == status
    if status == 403:
        assert response.json() == {"detail": "namespace 'team-b' is not granted to you"}


def test_plan_in_a_granted_namespace_reads_the_cluster(user_api: APIClient) -> None:
    body = PLAN | {"namespace": "team-a", "runtime": {"kind": "TrainingRuntime", "name": "rt-a"}}
    assert user_api.post("/api/v1/plan", body, format="json").status_code == 503  # past the grant check


class TestOtherUsersJobs:
    @pytest.fixture
    def jobs(
        self, plain_user: tuple[User, str], make_user: Callable[..., tuple[User, str]]
    ) -> dict[str, str]:
        otto, _ = make_user("otto", namespaces=("team-a",))  # the same namespace as uma
        return {"uma": make_job(plain_user[0]).id, "otto": make_job(otto).id}

    def test_api_lists_only_own_jobs_whatever_the_filter(
        self, jobs: dict[str, str], user_api: APIClient
    ) -> None:
        for params in ({}, {"owner": "otto"}, {"namespace": "team-a"}):
            body = user_api.get("/api/v1/jobs", params).content.decode()
            assert jobs["otto"] not in body
        assert [j["id"] for j in user_api.get("/api/v1/jobs").json()["results"]] == [jobs["uma"]]

    def test_another_users_job_is_404_like_a_missing_one(
        self, jobs: dict[str, str], user_api: APIClient
    ) -> None:
        other = user_api.get(f"/api/v1/jobs/{jobs['otto']}")
        missing = user_api.get("/api/v1/jobs/jnosuchjob00001")
        assert other.status_code == missing.status_code == 404
        assert other.json() == missing.json()
        cancel = user_api.post(f"/api/v1/jobs/{jobs['otto']}/cancel")
        assert cancel.status_code == 404 and jobs["otto"] not in cancel.content.decode()

    def test_pages_never_show_another_users_job(self, jobs: dict[str, str], client: Client) -> None:
        client.login(username="uma", password="pw-uma")
        assert jobs["otto"] not in client.get("/jobs/").content.decode()
        assert jobs["otto"] not in client.get("/jobs/?owner=otto").content.decode()
        assert client.get(f"/jobs/{jobs['otto']}/").status_code == 404
        assert jobs["uma"] in client.get("/jobs/").content.decode()
        assert client.get(f"/jobs/{jobs['uma']}/").status_code == 200

    def test_oncall_reads_both(self, jobs: dict[str, str], oncall_api: APIClient) -> None:
        ids = {j["id"] for j in oncall_api.get("/api/v1/jobs").json()["results"]}
        assert ids == set(jobs.values())
