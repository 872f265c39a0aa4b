"""Roles are groups: `platform` curates runtimes and site settings, `oncall` reads every job and may cancel.

Every authenticated user may submit into the namespaces granted to them (NamespaceGrant).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db.models import Q
from django.http import HttpRequest

from dispatch_site import sql

PLATFORM = "platform"
ONCALL = "oncall"
USER = "user"
ROLES = (PLATFORM, ONCALL, USER)
ALL_NAMESPACES = "*"

AnyUser = AbstractBaseUser | AnonymousUser


class NamespaceNotGranted(Exception):
    """403: the namespace is not granted to the user (submitting a job, opening a session)."""


def _group_names(user: AnyUser) -> set[str]:
    if not user.is_authenticated:
        return set()
    cached: set[str] | None = getattr(user, "_dispatch_groups", None)
    if cached is None:
        cached = set(
            User.groups.through.objects.filter(user_id=user.pk).values_list("group__name", flat=True)
        )
        setattr(user, "_dispatch_groups", cached)  # noqa: B010 - a per-request cache on the user object
    return cached


def is_platform(user: AnyUser) -> bool:
    return bool(
        user.is_authenticated and (getattr(user, "is_superuser", False) or PLATFORM in _group_names(user))
    )


def is_oncall(user: AnyUser) -> bool:
    return ONCALL in _group_names(user)


def can_read_all_jobs(user: AnyUser) -> bool:
    return is_platform(user) or is_oncall(user)


def granted_namespaces(user: AnyUser) -> set[str]:
    """The namespaces the user may submit into; contains "*" when every namespace is granted."""
    from dispatch_site.models import NamespaceGrant

    if not user.is_authenticated:
        return set()
    grants = NamespaceGrant.objects.filter(Q(user_id=user.pk) | Q(group__user__id=user.pk))
    return set(grants.values_list("namespace", flat=True))


def namespaces_granted_to_anyone() -> list[str]:
    """Every namespace some user or group may submit to, by name ("*" left out: it names none), sorted."""
    from dispatch_site.models import NamespaceGrant

    names = NamespaceGrant.objects.exclude(namespace=ALL_NAMESPACES).values_list("namespace", flat=True)
    return sorted(set(names))


@cache
def _grant_sql() -> str:
    from dispatch_site.models import NamespaceGrant

    memberships = sql.table(User.groups.through)
    return (
        f"SELECT 1 FROM {sql.table(NamespaceGrant)} WHERE namespace IN (%s, %s) AND (user_id = %s OR "
        f"group_id IN (SELECT group_id FROM {memberships} WHERE user_id = %s)) LIMIT 1"
    )


def may_submit_to(user: AnyUser, namespace: str) -> bool:
    """Is the namespace granted to the user, themselves or through a group (or are all namespaces)? One
    written-out statement (dispatch_site.sql): every plan, submission, start and session command asks."""
    if not user.is_authenticated:
        return False
    return sql.fetch_one(_grant_sql(), [namespace, ALL_NAMESPACES, user.pk, user.pk]) is not None


def may_read_namespace(user: AnyUser, namespace: str) -> bool:
    """Whether the user may read what lives in a namespace (its TrainingRuntimes): platform reads every
    namespace; everybody else reads the namespaces granted to them."""
    return is_platform(user) or may_submit_to(user, namespace)


def namespace_reader(user: AnyUser) -> Callable[[str], bool]:
    """may_read_namespace for many namespaces, with the grants read once."""
    if is_platform(user):
        return lambda namespace: True
    namespaces = granted_namespaces(user)
    if ALL_NAMESPACES in namespaces:
        return lambda namespace: True
    return lambda namespace: namespace in namespaces


def roles_context(request: HttpRequest) -> dict[str, Any]:
    user = request.user
    return {"is_platform": is_platform(user), "is_oncall": is_oncall(user)}
