"""User and grant services."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import transaction

from dispatch_site import roles
from dispatch_site.audit import audit_record
from dispatch_site.models import ApiToken, NamespaceGrant
from dispatch_site.roles import AnyUser

MAX_TOKEN_TTL_DAYS = 366


@transaction.atomic
def user_create(
    *,
    username: str,
    role: str,
    namespaces: Iterable[str] = (),
    password: str | None = None,
    email: str = "",
    actor: AnyUser | None = None,
) -> tuple[User, str]:
    """Create a user with a role and namespace grants; returns the user and their API token key."""
    if role not in roles.ROLES:
        raise ValueError(f"unknown role {role!r}: use one of {', '.join(roles.ROLES)}")
    user = User.objects.create_user(username=username, email=email, password=password)
    if role != roles.USER:
        group, _ = Group.objects.get_or_create(name=role)
        user.groups.add(group)
    for namespace in dict.fromkeys(namespaces):
        NamespaceGrant.objects.create(user=user, namespace=namespace)
    _, token = token_create(user=user, name="create_user", actor=actor)
    audit_record(
        actor=actor,
        action="user.create",
        object_type="user",
        object_id=username,
        details={"role": role, "namespaces": list(dict.fromkeys(namespaces))},
    )
    return user, token


def token_create(
    *, user: User, name: str, ttl_days: int | None = None, actor: AnyUser | None = None
) -> tuple[ApiToken, str]:
    """A new API token for the user: returns the stored row and the token itself, which is never stored
    (only its digest) and cannot be shown again."""
    days = settings.API_TOKEN_TTL_DAYS if ttl_days is None else ttl_days
    if not 1 <= days <= MAX_TOKEN_TTL_DAYS:
        raise ValueError(f"a token lives 1 to {MAX_TOKEN_TTL_DAYS} days, not {days}")
    row, token = ApiToken.objects.create(user=user, expiry=timedelta(days=days), name=name)
    audit_record(
        actor=actor or user,
        action="token.create",
        object_type="token",
        object_id=str(row.pk),
        details={"user": user.get_username(), "name": name, "expires": row.expiry.isoformat()},
    )
    return row, token


def token_revoke(*, actor: AnyUser, token: ApiToken) -> None:
    """Revoke a token (its owner or the platform role): it is deleted and stops working at once."""
    details = {"user": token.user.get_username(), "name": token.name}
    token_id = str(token.pk)
    token.delete()
    audit_record(actor=actor, action="token.revoke", object_type="token", object_id=token_id, details=details)
