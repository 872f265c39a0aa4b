"""The one way to write the audit log."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User

from dispatch_site.models import AuditEvent
from dispatch_site.roles import AnyUser


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
