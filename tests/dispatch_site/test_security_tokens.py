"""API tokens: kept as digests (django-rest-knox), named, expiring, several per user, revocable by their owner
and by the platform role; the database never holds a token in clear."""

from __future__ import annotations

import importlib
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from dispatch_site.models import ApiToken, AuditEvent

pytestmark = pytest.mark.django_db


def _client(token: str, keyword: str = "Token") -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} {token}")
    return client


@pytest.fixture
def uma_login(plain_user: tuple[User, str]) -> APIClient:
    """uma after a password login (a session, as the dashboard has): what creates tokens."""
    client = APIClient()
    assert client.login(username="uma", password="pw-uma")
    return client


def _database_holds(text: str) -> list[str]:
    """Every table.column of the whole database whose value contains the text (all text and JSON columns)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public' "
            "AND data_type IN ('character varying', 'text', 'jsonb', 'json')"
        )
        columns = cursor.fetchall()
        found = []
        for table, column in columns:
            cursor.execute(f'SELECT 1 FROM "{table}" WHERE "{column}"::text LIKE %s LIMIT 1', [f"%{text}%"])
            if cursor.fetchone():
                found.append(f"{table}.{column}")
    return found


def test_a_created_token_authenticates_and_the_database_holds_only_its_digest(uma_login: APIClient) -> None:
    response = uma_login.post("/api/v1/tokens", {"name": "laptop", "expires_in_days": 7}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    token = body["token"]
    assert len(token) == 64
    assert body["name"] == "laptop" and body["user"] == "uma" and body["last_used_at"] is None
    expires = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00"))
    assert timedelta(days=6, hours=23) < expires - timezone.now() <= timedelta(days=7)

    for keyword in ("Token", "Bearer"):
        assert _client(token, keyword).get("/api/v1/me").json()["username"] == "uma"
    # Neither the token nor any 20 characters of it past the lookup prefix are stored anywhere.
    assert _database_holds(token) == []
    assert _database_holds(token[15:35]) == []


def test_the_fixture_tokens_are_stored_hashed_too(plain_user: tuple[User, str]) -> None:
    assert _database_holds(plain_user[1]) == []
    assert _client(plain_user[1]).get("/api/v1/me").status_code == 200


def test_several_tokens_per_user_listed_without_the_secret_and_last_use_shown(
    user_api: APIClient, uma_login: APIClient
) -> None:
    token = uma_login.post("/api/v1/tokens", {"name": "ci"}, format="json").json()["token"]
    _client(token).get("/api/v1/me")
    rows = user_api.get("/api/v1/tokens").json()
    assert sorted(r["name"] for r in rows) == ["ci", "create_user"]
    assert token not in str(rows)
    ci = next(r for r in rows if r["name"] == "ci")
    assert ci["last_used_at"] is not None
    assert set(ci) == {"id", "name", "user", "created_at", "expires_at", "last_used_at", "url"}


def test_an_expired_token_is_401(plain_user: tuple[User, str]) -> None:
    ApiToken.objects.filter(user=plain_user[0]).update(expiry=timezone.now() - timedelta(seconds=1))
    response = _client(plain_user[1]).get("/api/v1/me")
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]


def test_the_owner_revokes_a_token_and_it_is_401_at_once(user_api: APIClient, uma_login: APIClient) -> None:
    created = uma_login.post("/api/v1/tokens", {"name": "temp"}, format="json").json()
    assert _client(created["token"]).get("/api/v1/me").status_code == 200
    assert user_api.delete(created["url"]).status_code == 204
    assert _client(created["token"]).get("/api/v1/me").status_code == 401
    event = AuditEvent.objects.get(action="token.revoke")
    assert (event.actor_name, event.details["name"]) == ("uma", "temp")


def test_platform_revokes_anybodys_token_another_user_cannot_even_see_it(
    platform_api: APIClient, plain_user: tuple[User, str], make_user
) -> None:
    _, other_token = make_user("otto", namespaces=("team-b",))
    other = _client(other_token)
    uma_token = ApiToken.objects.get(user=plain_user[0])

    assert other.delete(f"/api/v1/tokens/{uma_token.pk}").status_code == 404  # same as a missing one
    assert [r["user"] for r in other.get("/api/v1/tokens").json()] == ["otto"]
    assert [r["user"] for r in other.get("/api/v1/tokens", {"owner": "uma"}).json()] == ["otto"]
    assert _client(plain_user[1]).get("/api/v1/me").status_code == 200

    listed = platform_api.get("/api/v1/tokens", {"owner": "uma"}).json()
    assert [r["id"] for r in listed] == [uma_token.pk]
    assert platform_api.delete(f"/api/v1/tokens/{uma_token.pk}").status_code == 204
    assert _client(plain_user[1]).get("/api/v1/me").status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "expires_in_days": 0}, "expires_in_days"),
        ({"name": "x", "expires_in_days": 400}, "expires_in_days"),
        ({"expires_in_days": 5}, "name"),
        ({"name": "x", "scope": "all"}, "scope"),
    ],
)
def test_bad_token_requests_are_400_with_the_field(uma_login: APIClient, body: dict, field: str) -> None:
    response = uma_login.post("/api/v1/tokens", body, format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_tokens_endpoints_need_credentials(anon_api: APIClient) -> None:
    assert anon_api.get("/api/v1/tokens").status_code == 401
    assert anon_api.post("/api/v1/tokens", {"name": "x"}, format="json").status_code == 401


# ---------------------------------------------------------------- tokens that cannot renew themselves


def test_a_token_cannot_mint_a_token_so_revoking_a_stolen_one_ends_the_access(user_api: APIClient) -> None:
    """The attack (issue 22): with a stolen token, mint a 366-day one; revoking the stolen token then left
    the new one working. A plain user's token may not create tokens at all now: 403, nothing created."""
    response = user_api.post("/api/v1/tokens", {"name": "persist", "expires_in_days": 366}, format="json")
    assert response.status_code == 403, response.content
    assert "password" in response.json()["detail"]
    assert not ApiToken.objects.filter(name="persist").exists()
    assert not AuditEvent.objects.filter(action="token.create", details__name="persist").exists()


def test_a_password_login_creates_tokens(uma_login: APIClient) -> None:
    response = uma_login.post("/api/v1/tokens", {"name": "laptop", "expires_in_days": 366}, format="json")
    assert response.status_code == 201, response.content
    assert ApiToken.objects.get(name="laptop").created_by is None


def test_a_platform_tokens_child_never_outlives_it_and_is_revoked_with_it(
    platform_user: tuple[User, str],
) -> None:
    parent = ApiToken.objects.get(user=platform_user[0])
    ApiToken.objects.filter(pk=parent.pk).update(expiry=timezone.now() + timedelta(days=3))
    parent.refresh_from_db()
    response = _client(platform_user[1]).post(
        "/api/v1/tokens", {"name": "child", "expires_in_days": 366}, format="json"
    )
    assert response.status_code == 201, response.content
    child = response.json()
    expires = datetime.fromisoformat(child["expires_at"].replace("Z", "+00:00"))
    assert expires <= parent.expiry  # asked for 366 days, got what its creator has left
    grandchild = _client(child["token"]).post("/api/v1/tokens", {"name": "grandchild"}, format="json")
    assert grandchild.status_code == 201, grandchild.content
    assert _client(grandchild.json()["token"]).get("/api/v1/me").status_code == 200

    # Revoking the parent revokes everything created with it, however deep.
    assert _client(platform_user[1]).delete(f"/api/v1/tokens/{parent.pk}").status_code == 204
    assert _client(child["token"]).get("/api/v1/me").status_code == 401
    assert _client(grandchild.json()["token"]).get("/api/v1/me").status_code == 401
    event = AuditEvent.objects.get(action="token.revoke")
    assert sorted(event.details["also_revoked"]) == sorted([child["id"], grandchild.json()["id"]])


def test_a_drf_authtoken_from_before_keeps_working_after_the_migration(plain_user: tuple[User, str]) -> None:
    """The data migration reads DRF's old authtoken table (tokens in clear), stores digests, drops it."""
    migration = importlib.import_module("dispatch_site.migrations.0003_hash_drf_tokens")
    old_key = "0123456789abcdef0123456789abcdef01234567"  # DRF's format: 40 hex characters
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamptz NOT NULL, "
            "user_id integer NOT NULL)"
        )
        cursor.execute("INSERT INTO authtoken_token VALUES (%s, now(), %s)", [old_key, plain_user[0].pk])
    from django.apps import apps

    with connection.schema_editor() as editor:
        migration.hash_old_tokens(apps, editor)
    assert "authtoken_token" not in connection.introspection.table_names()
    assert _database_holds(old_key) == []
    assert _client(old_key).get("/api/v1/me").json()["username"] == "uma"
    migrated = ApiToken.objects.get(name="migrated")
    assert migrated.expiry is not None and migrated.expiry > timezone.now() + timedelta(days=80)


class TestTokensPage:
    def test_create_shows_the_token_once_and_revoke_removes_it(
        self, client: Client, plain_user: tuple[User, str]
    ) -> None:
        client.login(username="uma", password="pw-uma")
        page = client.post("/tokens/", {"name": "notebook", "expires_in_days": "30"})
        assert page.status_code == 200
        new = ApiToken.objects.get(name="notebook")
        token = page.context["new_token"]
        assert token.encode() in page.content
        assert _client(token).get("/api/v1/me").status_code == 200

        listing = client.get("/tokens/")
        assert f'data-token-id="{new.pk}"'.encode() in listing.content
        assert b"notebook" in listing.content and token.encode() not in listing.content
        assert client.post(f"/tokens/{new.pk}/revoke/").status_code == 302
        assert _client(token).get("/api/v1/me").status_code == 401
        after = client.get("/tokens/").content
        assert f'data-token-id="{new.pk}"'.encode() not in after and b"revoked" in after

    def test_a_bad_form_is_400_and_creates_nothing(
        self, client: Client, plain_user: tuple[User, str]
    ) -> None:
        client.login(username="uma", password="pw-uma")
        page = client.post("/tokens/", {"name": "", "expires_in_days": "0"})
        assert page.status_code == 400
        assert not ApiToken.objects.exclude(name="create_user").exists()

    def test_nobody_else_revokes_from_the_page(
        self, client: Client, plain_user: tuple[User, str], make_user
    ) -> None:
        make_user("otto", namespaces=("team-b",))
        uma_token = ApiToken.objects.get(user=plain_user[0])
        client.login(username="otto", password="pw-otto")
        assert client.post(f"/tokens/{uma_token.pk}/revoke/").status_code == 404
        assert b"create_user" in client.get("/tokens/").content  # otto's own token
        assert ApiToken.objects.filter(pk=uma_token.pk).exists()


def test_create_user_refuses_a_weak_password_and_creates_nobody() -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=r"password refused: .*This password is too short"):
        call_command("create_user", "wendy", "--password", "wendy1")
    with pytest.raises(CommandError, match="too common"):
        call_command("create_user", "wendy", "--password", "password1234")
    assert not User.objects.filter(username="wendy").exists()
