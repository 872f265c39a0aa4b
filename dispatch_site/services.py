"""User and grant services."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import transaction

from dispatch_site import roles
from dispatch_site.audit import acting_as, audit_record
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
    with acting_as(actor):  # the role and grants are audited as given by the creator
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


@transaction.atomic
def user_access_update(
    *,
    user: User,
    role: str | None = None,
    grant: Iterable[str] = (),
    revoke: Iterable[str] = (),
    active: bool | None = None,
    actor: AnyUser | None = None,
    actor_name: str | None = None,
) -> list[str]:
    """Change a user's role (platform, oncall or user: the one role they hold after), namespace grants and
    whether the account may act; returns what changed, in words. Each change is audited
    (dispatch_site.signals) with `actor` (or `actor_name`) as who did it. Deactivating an account revokes
    its API tokens: a token must not outlive the account's right to act. The user's row is locked, so two
    changes apply in turn."""
    if role is not None and role not in roles.ROLES:
        raise ValueError(f"unknown role {role!r}: use one of {', '.join(roles.ROLES)}")
    user = User.objects.select_for_update().get(pk=user.pk)
    changed: list[str] = []
    with acting_as(actor, actor_name):
        if role is not None:
            held = set(user.groups.filter(name__in=roles.ROLES).values_list("name", flat=True))
            wanted = set() if role == roles.USER else {role}
            if held != wanted:
                for name in sorted(held - wanted):
                    user.groups.remove(Group.objects.get(name=name))
                for name in sorted(wanted - held):
                    user.groups.add(Group.objects.get_or_create(name=name)[0])
                changed.append(f"role {role}")
        for namespace in dict.fromkeys(grant):
            _, made = NamespaceGrant.objects.get_or_create(user=user, namespace=namespace)
            if made:
                changed.append(f"granted {namespace}")
        for namespace in dict.fromkeys(revoke):
            if NamespaceGrant.objects.filter(user=user, namespace=namespace).delete()[0]:
                changed.append(f"revoked {namespace}")
        if active is not None and active != user.is_active:
            user.is_active = active
            user.save(update_fields=["is_active"])
            changed.append("activated" if active else "deactivated")
            if not active:
                revoked = ApiToken.objects.filter(user=user).count()
                ApiToken.objects.filter(user=user).delete()  # and what they created (CASCADE)
                if revoked:
                    changed.append(f"{revoked} API token(s) revoked")
    return changed


class TokenNotAllowed(Exception):
    """403: a token may not create tokens unless its user has the platform role."""


def token_create(
    *,
    user: User,
    name: str,
    ttl_days: int | None = None,
    actor: AnyUser | None = None,
    created_by: ApiToken | None = None,
) -> tuple[ApiToken, str]:
    """A new API token for the user: returns the stored row and the token itself, which is never stored
    (only its digest) and cannot be shown again.

    `created_by` is the token the request came with (None for a password login or the create_user command):
    only a platform user's token may create tokens (TokenNotAllowed otherwise), so a stolen token cannot
    renew itself; the new token expires no later than its creator and is revoked with it."""
    days = settings.API_TOKEN_TTL_DAYS if ttl_days is None else ttl_days
    if not 1 <= days <= MAX_TOKEN_TTL_DAYS:
        raise ValueError(f"a token lives 1 to {MAX_TOKEN_TTL_DAYS} days, not {days}")
    if created_by is not None and not roles.is_platform(created_by.user):
        raise TokenNotAllowed(
            "a token cannot create tokens: log in with your password (dashboard → API tokens) to create one; "
            "only the platform role creates tokens with a token"
        )
    with transaction.atomic():
        row, token = ApiToken.objects.create(user=user, expiry=timedelta(days=days), name=name)
        if created_by is not None:
            row.created_by = created_by
            if created_by.expiry is not None and (row.expiry is None or row.expiry > created_by.expiry):
                row.expiry = created_by.expiry  # never outlives the token that created it
            row.save(update_fields=["created_by", "expiry"])
        audit_record(
            actor=actor or user,
            action="token.create",
            object_type="token",
            object_id=str(row.pk),
            details={
                "user": user.get_username(),
                "name": name,
                "expires": row.expiry.isoformat(),
                "created_by_token": created_by.pk if created_by is not None else None,
            },
        )
    return row, token


def _created_from(token: ApiToken) -> list[int]:
    """The ids of every token created, directly or not, with this one."""
    found: list[int] = []
    frontier = [token.pk]
    while frontier:
        frontier = list(ApiToken.objects.filter(created_by_id__in=frontier).values_list("pk", flat=True))
        found += frontier
    return found


def token_revoke(*, actor: AnyUser, token: ApiToken) -> None:
    """Revoke a token (its owner or the platform role): it is deleted and stops working at once, and so is
    every token created with it (CASCADE)."""
    details: dict[str, object] = {
        "user": token.user.get_username(),
        "name": token.name,
        "also_revoked": _created_from(token),
    }
    token_id = str(token.pk)
    token.delete()
    audit_record(actor=actor, action="token.revoke", object_type="token", object_id=token_id, details=details)
