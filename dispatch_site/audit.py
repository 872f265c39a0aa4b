"""The one way to write the audit log."""

from __future__ import annotations

from typing import Any

from dispatch_site.models import AuditEvent
from dispatch_site.roles import AnyUser


def audit_record(
    *, actor: AnyUser | None, action: str, object_type: str, object_id: str, details: dict[str, Any] | None = None
) -> AuditEvent:
    authenticated = actor is not None and actor.is_authenticated
    return AuditEvent.objects.create(
        actor=actor if authenticated else None,
        actor_name=actor.get_username() if authenticated and actor is not None else "system",
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        details=details or {},
    )
