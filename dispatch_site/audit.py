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
) -> AuditEvent:
    """The audit row, not yet saved: for a caller that writes it together with the rows it records."""
    user = actor if isinstance(actor, User) else None
    return AuditEvent(
        actor=user,
        actor_name=user.get_username() if user is not None else "system",
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
) -> AuditEvent:
    event = audit_event(
        actor=actor, action=action, object_type=object_type, object_id=object_id, details=details
    )
    event.save(force_insert=True)
    return event
