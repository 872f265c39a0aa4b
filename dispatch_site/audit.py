"""The one way to write the audit log."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from dispatch_site.models import AuditEvent
from dispatch_site.roles import AnyUser

_ACTOR: ContextVar[tuple[AnyUser | None, str | None] | None] = ContextVar("audit_actor", default=None)


@contextmanager
def acting_as(actor: AnyUser | None, name: str | None = None) -> Iterator[None]:
    """Who the audit rows written inside (by the model signals: grants, roles, activation) name as acting:
    a service or command that changes access says who does; without it they read "system"."""
    token = _ACTOR.set((actor, name))
    try:
        yield
    finally:
        _ACTOR.reset(token)


def current_actor() -> tuple[AnyUser | None, str | None]:
    return _ACTOR.get() or (None, None)


def audit_event(
    *,
    actor: AnyUser | None,
    action: str,
    object_type: str,
    object_id: str,
    details: dict[str, Any] | None = None,
    actor_name: str | None = None,
) -> AuditEvent:
    """The audit row, not yet saved: for a caller that writes it together with the rows it records.
    `actor_name`: who acted when no user did ("anonymous" for a login that failed); "system" otherwise."""
    user = actor if isinstance(actor, User) else None
    name = user.get_username() if user is not None else (actor_name or "system")
    return AuditEvent(
        actor=user,
        actor_name=name[:150],
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        details=details or {},
    )


def audit_record(
    *,
    actor: AnyUser | None,
    action: str,
    object_type: str,
    object_id: str,
    details: dict[str, Any] | None = None,
    actor_name: str | None = None,
) -> AuditEvent:
    event = audit_event(
        actor=actor,
        action=action,
        object_type=object_type,
        object_id=object_id,
        details=details,
        actor_name=actor_name,
    )
    event.save(force_insert=True)
    return event


def audit_record_unless_recent(
    *,
    actor: AnyUser,
    action: str,
    object_type: str,
    object_id: str,
    details: dict[str, Any],
    within: timedelta,
) -> AuditEvent | None:
    """The row, unless the same actor recorded the same action on the same object with the same details
    within `within` (a page that reloads a log every few seconds is one read, not hundreds)."""
    user = actor if isinstance(actor, User) else None
    recent = AuditEvent.objects.filter(
        object_type=object_type,
        object_id=str(object_id),
        action=action,
        actor=user,
        at__gte=timezone.now() - within,
        details=details,
    )
    if recent.exists():
        return None
    return audit_record(
        actor=actor, action=action, object_type=object_type, object_id=object_id, details=details
    )
