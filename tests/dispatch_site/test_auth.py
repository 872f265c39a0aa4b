"""Authentication and roles on the API and the dashboard: 401 without credentials, 403 for the wrong role."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

from dispatch_site import roles
from dispatch_site.models import ApiToken, AuditEvent, NamespaceGrant

pytestmark = pytest.mark.django_db


def test_api_without_credentials_is_401(anon_api: APIClient) -> None:
    response = anon_api.get("/api/v1/me")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Token")


def test_api_with_a_wrong_token_is_401(anon_api: APIClient) -> None:
    anon_api.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert anon_api.get("/api/v1/me").status_code == 401


def test_bearer_keyword_is_accepted(plain_user: tuple[User, str]) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plain_user[1]}")
    response = client.get("/api/v1/me")
    assert response.status_code == 200
    assert response.json() == {"username": "uma", "roles": ["user"], "namespaces": ["team-a"]}


def test_me_reports_roles(platform_api: APIClient, oncall_api: APIClient) -> None:
    assert platform_api.get("/api/v1/me").json()["roles"] == ["platform"]
    assert oncall_api.get("/api/v1/me").json()["roles"] == ["oncall"]


@pytest.mark.parametrize(
    ("who", "status"), [("platform_api", 200), ("oncall_api", 403), ("user_api", 403), ("anon_api", 401)]
)
def test_audit_log_api_is_platform_only(request: pytest.FixtureRequest, who: str, status: int) -> None:
    client: APIClient = request.getfixturevalue(who)
    assert client.get("/api/v1/audit").status_code == status


def test_create_user_command_prints_a_working_token(capsys: pytest.CaptureFixture[str]) -> None:
    call_command("create_user", "nina", "--role", "oncall", "--namespace", "ml-a", "ml-b")
    token = capsys.readouterr().out.strip()
    user = User.objects.get(username="nina")
    stored = ApiToken.objects.get(user=user)  # one token, kept as a digest: the printout is the only copy
    assert stored.name == "create_user" and token not in (stored.digest, stored.token_key)
    assert roles.is_oncall(user) and not roles.is_platform(user)
    assert sorted(NamespaceGrant.objects.filter(user=user).values_list("namespace", flat=True)) == [
        "ml-a",
        "ml-b",
    ]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/v1/me").json()["namespaces"] == ["ml-a", "ml-b"]


def test_create_user_refuses_a_duplicate_and_a_bad_namespace(plain_user: tuple[User, str]) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="already exists"):
        call_command("create_user", "uma")
    with pytest.raises(CommandError, match="not a valid Kubernetes namespace"):
        call_command("create_user", "zed", "--namespace", "Bad_NS")
    assert not User.objects.filter(username="zed").exists()


def test_group_grants_reach_members(make_user) -> None:
    from django.contrib.auth.models import Group

    user, _ = make_user("gil")
    group = Group.objects.create(name="vision-team")
    user.groups.add(group)
    NamespaceGrant.objects.create(group=group, namespace="vision")
    assert roles.may_submit_to(user, "vision")
    assert not roles.may_submit_to(user, "speech")


def test_user_creation_is_audited() -> None:
    call_command("create_user", "ravi", "--role", "platform", "--namespace", "*")
    event = AuditEvent.objects.get(action="user.create")
    assert (event.object_type, event.object_id, event.actor_name) == ("user", "ravi", "system")
    assert event.details == {"role": "platform", "namespaces": ["*"]}


def test_audit_log_api_lists_newest_first(platform_api: APIClient) -> None:
    call_command("create_user", "first")
    call_command("create_user", "second")
    rows = platform_api.get("/api/v1/audit", {"action": "user.create"}).json()["results"]
    assert [r["object_id"] for r in rows][:2] == ["second", "first"]


class TestDashboard:
    def test_anonymous_is_sent_to_login(self, client: Client) -> None:
        response = client.get("/jobs/")
        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=/jobs/")

    def test_login_with_password_opens_the_dashboard(
        self, client: Client, plain_user: tuple[User, str]
    ) -> None:
        response = client.post("/login/", {"username": "uma", "password": "pw-uma"})
        assert response.status_code == 302
        page = client.get("/jobs/")
        assert page.status_code == 200
        assert b"uma" in page.content

    def test_wrong_password_stays_on_login(self, client: Client, plain_user: tuple[User, str]) -> None:
        response = client.post("/login/", {"username": "uma", "password": "nope"})
        assert response.status_code == 200
        assert b"didn't match" in response.content

    @pytest.mark.parametrize(("username", "status"), [("pat", 200), ("olive", 403), ("uma", 403)])
    def test_audit_page_is_platform_only(
        self,
        client: Client,
        platform_user: object,
        oncall_user: object,
        plain_user: object,
        username: str,
        status: int,
    ) -> None:
        client.login(username=username, password=f"pw-{username}")
        assert client.get("/audit/").status_code == status

    def test_audit_nav_link_only_for_platform(
        self, client: Client, plain_user: object, platform_user: object
    ) -> None:
        client.login(username="uma", password="pw-uma")
        assert b"Audit log" not in client.get("/jobs/").content
        client.login(username="pat", password="pw-pat")
        assert b"Audit log" in client.get("/jobs/").content
