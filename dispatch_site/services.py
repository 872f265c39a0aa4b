"""User and grant services."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import Group, User
from django.db import transaction
from rest_framework.authtoken.models import Token

from dispatch_site import roles
from dispatch_site.audit import audit_record
from dispatch_site.models import NamespaceGrant
from dispatch_site.roles import AnyUser


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
    token = Token.objects.create(user=user)
    audit_record(
        actor=actor,
        action="user.create",
        object_type="user",
        object_id=username,
        details={"role": role, "namespaces": list(dict.fromkeys(namespaces))},
    )
    return user, token.key
