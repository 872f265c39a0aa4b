"""Who may do what is audited however it changes (issue 33, "the audit log records grant and role changes"):
through `manage.py user_access` (named as the actor), and through any other path (a shell, a migration: named
"system"). Deactivating an account revokes its tokens at once. The platform role reads it all in GET
/api/v1/audit, the route on-call would use to answer "who gave eve the platform role?"."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from dispatch_site import roles
from dispatch_site.models import AuditEvent, NamespaceGrant

pytestmark = pytest.mark.django_db


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _changes(username: str) -> list[tuple[str, str, str]]:
    rows = AuditEvent.objects.filter(object_type="user", object_id=username).exclude(action="user.create")
    return sorted(
        (e.action, e.details.get("role") or e.details.get("namespace") or "", e.actor_name) for e in rows
    )


def test_the_command_changes_access_and_every_change_is_audited_with_who_did_it(make_user: Any) -> None:
    eve, token = make_user("eve", roles.USER, ("team-a",))
    assert _client(token).get("/api/v1/jobs").status_code == 200
    out = io.StringIO()
    call_command(
        "user_access", "eve", "--role", "platform", "--grant", "team-b", "--revoke", "team-a", stdout=out
    )
    assert out.getvalue().strip() == "eve: role platform; granted team-b; revoked team-a"
    assert roles.is_platform(eve) and roles.granted_namespaces(eve) == {"team-b"}
    [who] = {e.actor_name for e in AuditEvent.objects.filter(object_id="eve", action__in=("role.add",))}
    assert who.startswith("manage.py user_access (")
    assert [(a, what) for a, what, _ in _changes("eve")] == [
        ("grant.add", "team-a"),  # at creation
        ("grant.add", "team-b"),
        ("grant.remove", "team-a"),
        ("role.add", "platform"),
    ]

    call_command("user_access", "eve", "--role", "user", "--deactivate", stdout=out)
    assert "role user; deactivated; 1 API token(s) revoked" in out.getvalue()
    assert _client(token).get("/api/v1/jobs").status_code == 401  # the token died with the account's right
    assert ("role.remove", "platform") in [(a, w) for a, w, _ in _changes("eve")]
    assert AuditEvent.objects.filter(action="user.deactivate", object_id="eve").count() == 1
    call_command("user_access", "eve", "--deactivate", stdout=out)  # nothing to change: nothing audited
    assert out.getvalue().strip().endswith("eve: nothing changed")
    assert AuditEvent.objects.filter(action="user.deactivate", object_id="eve").count() == 1


def test_access_changed_outside_dispatchs_commands_is_audited_as_system(make_user: Any) -> None:
    _, token = make_user("pat", roles.PLATFORM, ("*",))
    bob, _ = make_user("bob", roles.USER)
    oncall = Group.objects.get_or_create(name=roles.ONCALL)[0]
    bob.groups.add(oncall)  # as a shell would
    oncall.user_set.remove(bob)  # from the group's side
    NamespaceGrant.objects.create(user=bob, namespace="team-c")
    NamespaceGrant.objects.filter(user=bob).delete()
    bob.is_active = False
    bob.save()
    assert _changes("bob") == [
        ("grant.add", "team-c", "system"),
        ("grant.remove", "team-c", "system"),
        ("role.add", "oncall", "system"),
        ("role.remove", "oncall", "system"),
        ("user.deactivate", "", "system"),
    ]
    listed = _client(token).get("/api/v1/audit", {"object_id": "bob"}).json()["results"]
    assert {row["action"] for row in listed} >= {"grant.add", "role.add", "user.deactivate"}


def test_the_command_refuses_a_bad_namespace_or_an_unknown_user(make_user: Any) -> None:
    make_user("uma", roles.USER, ("team-a",))
    with pytest.raises(CommandError, match="not a valid Kubernetes namespace"):
        call_command("user_access", "uma", "--grant", "Team_A")
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("user_access", "nobody", "--grant", "team-a")
    assert (
        not AuditEvent.objects.filter(object_id="uma")
        .exclude(action__in=("user.create", "grant.add"))
        .exists()
    )
