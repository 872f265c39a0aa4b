"""Reads: the sessions a user may see, and one session's exec history."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from dispatch_site import roles
from dispatch_site.models import AuditEvent
from jobs.models import Session
from jobs.sessions.rules import AUDIT_OBJECT, EXEC_ACTION


def may_close(user: Any, session: Session) -> bool:
    return bool(session.owner_id == user.pk or roles.is_platform(user) or roles.is_oncall(user))


def sessions_visible_to(user: Any) -> QuerySet[Session]:
    """Platform and on-call read every session; everybody else reads their own."""
    queryset = Session.objects.select_related("owner")
    if roles.can_read_all_jobs(user):
        return queryset
    return queryset.filter(owner_id=user.pk)


def session_for(user: Any, session_id: str) -> Session | None:
    return sessions_visible_to(user).filter(pk=session_id).first()


def session_for_exec(user: Any, session_id: str) -> Session | None:
    """The session a user asks to run a command in, read with one query on the owner's path (the hot one):
    the owner, or someone who may read every session (and then is refused as not the owner); None when
    the user may not see it. The owner is not joined in: on the owner's path it is the user already."""
    session = Session.objects.filter(pk=session_id).first()
    if session is not None and session.owner_id == user.pk:
        session.owner = user
        return session
    if session is None or roles.can_read_all_jobs(user):
        return session
    return None


def session_history(session: Session) -> QuerySet[AuditEvent]:
    """The commands run in a session, newest first: the audit log's exec rows for it."""
    return AuditEvent.objects.filter(object_type=AUDIT_OBJECT, object_id=session.id, action=EXEC_ACTION)
