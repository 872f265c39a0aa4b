"""Run a command in a running session's trainer pod through pods/exec, and record it in the audit log.

Every call re-checks, under the session row's lock, everything that allowed the command when the session
opened: the session is running and within the site's maximum lifetime, the caller still holds the namespace
grant, the runtime is still on the allow-list for sessions, the container is one commands may run in, and the
trainer pod is the one the session started on (name and UID). The lock is held until the API server has the
exec stream open (the command runs), so a close acknowledged before is seen here (409), and a close that
arrives meanwhile waits until the command has started: no command starts after a close was acknowledged.
The command's output is then read without the lock.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from cluster import exec as pods
from cluster.errors import ClusterError, NotFound, Rejected
from cluster.where import on_cluster
from dispatch_site import metrics, roles
from dispatch_site.audit import audit_record
from jobs.models import Session, SessionState
from jobs.sessions.errors import (
    ExecForbidden,
    ExecRefused,
    ExecTimedOut,
    NotSessionOwner,
    SessionNotRunning,
)
from jobs.sessions.rules import (
    AUDIT_OBJECT,
    EXEC_ACTION,
    ExecResult,
    allow_list_miss,
    command_argv,
    container_problem,
    lifetime_over,
)
from jobs.sessions.services import pod_problem, session_set_state
from runtimes.models import AllowListEntry
from runtimes.selectors import allow_list_entry


def _fail(session: Session, message: str) -> SessionNotRunning:
    session_set_state(session, {SessionState.RUNNING}, SessionState.FAILED, message=message)
    session.refresh_from_db()
    return SessionNotRunning(session, message)


def _still_allowed(actor: User, session: Session) -> None:
    """The grant and the allow-list, as they are now (ExecForbidden naming what was withdrawn)."""
    if not roles.may_submit_to(actor, session.namespace):
        raise ExecForbidden(
            f"namespace {session.namespace!r} is no longer granted to {actor.get_username()}: no command "
            f"runs in session {session.id}"
        )
    entry = allow_list_entry(session.runtime_kind, session.runtime_namespace, session.runtime_name)
    miss = allow_list_miss(entry, list_empty=entry is None and not AllowListEntry.objects.exists())
    if miss is not None:
        raise ExecForbidden(
            f"runtime {session.runtime_ref} is no longer on the allow-list for sessions: no command runs in "
            f"session {session.id}; close it"
        )


def session_exec(
    *,
    actor: User,
    session: Session,
    command: str | Sequence[str],
    container: str | None = None,
    timeout_seconds: float | None = None,
) -> ExecResult:
    """Run one command in the session's trainer pod and record it (history and audit log).
    NotSessionOwner, ExecForbidden, SessionNotRunning, ExecRefused, ExecTimedOut; ClusterError when the
    cluster cannot be reached (the session is left as it is)."""
    if session.owner_id != actor.pk:
        raise NotSessionOwner(
            f"only {session.owner.get_username()}, who opened session {session.id}, runs commands in it"
        )
    container = container or session.container
    timeout = float(timeout_seconds or settings.SESSION_EXEC_TIMEOUT_SECONDS)
    argv = command_argv(command)
    started = time.monotonic()
    with transaction.atomic():
        locked = Session.objects.select_for_update().filter(pk=session.pk).first()
        if locked is None:
            raise SessionNotRunning(session, f"session {session.id} no longer exists")
        session = locked
        if session.state != SessionState.RUNNING:
            reason = f": {session.message}" if session.message else ""
            raise SessionNotRunning(session, f"session {session.id} is {session.state}{reason}")
        if lifetime_over(session, timezone.now(), settings.SESSION_MAX_LIFETIME_SECONDS):
            raise SessionNotRunning(
                session,
                f"session {session.id} reached the maximum session lifetime "
                f"({settings.SESSION_MAX_LIFETIME_SECONDS}s): it is being closed; open a new one",
            )
        _still_allowed(actor, session)
        problem = container_problem(session, container)
        if problem:
            raise ExecRefused(problem)
        failed_with = pod_problem(session)  # ClusterError: nothing decided, the session stays running
        stream: pods.ExecStream | None = None
        open_error, unreachable = "", None
        if not failed_with:
            try:
                with on_cluster(session.cluster):  # a MultiKueue session's pod is on its worker
                    stream = pods.exec_open(session.namespace, session.pod, container, argv, timeout=timeout)
            except (NotFound, Rejected) as exc:
                open_error = exc.message
            except ClusterError as exc:
                unreachable = exc
    if failed_with:
        raise _fail(session, failed_with)
    if unreachable is not None:
        _record_exec(actor, session, command, container, None, unreachable.message, started)
        raise unreachable
    if stream is None:
        _record_exec(actor, session, command, container, None, open_error, started)
        try:
            problem = pod_problem(session)
        except ClusterError:
            problem = None  # cannot tell now: the session is left running, the refusal stands
        if problem:
            raise _fail(session, problem)
        raise ExecRefused(open_error)

    output: pods.ExecOutput | None = None
    error = ""
    try:
        with on_cluster(session.cluster):
            output = pods.exec_collect(stream, max_bytes=settings.SESSION_EXEC_MAX_OUTPUT_BYTES)
    except pods.ExecTimeout as exc:
        output, error = exc.output, exc.message
    except ClusterError as exc:
        _record_exec(actor, session, command, container, None, exc.message, started)
        raise
    _record_exec(actor, session, command, container, output, error, started)
    result = ExecResult(
        stdout=output.stdout,
        stderr=output.stderr,
        returncode=output.returncode,
        truncated=output.truncated,
        pod=session.pod,
        container=container,
    )
    if error:
        raise ExecTimedOut(f"{error}; the output so far is in the answer", result)
    return result


def _record_exec(
    actor: User,
    session: Session,
    command: str | Sequence[str],
    container: str,
    output: pods.ExecOutput | None,
    error: str,
    started: float,
) -> None:
    shown = command if isinstance(command, str) else list(command)
    returncode = output.returncode if output is not None else None
    bytes_out = output.bytes_out if output is not None else 0
    duration_ms = int((time.monotonic() - started) * 1000)
    metrics.SESSION_EXEC.observe(duration_ms / 1000)
    # The audit log is the session's command history too (one row per command, one write).
    audit_record(
        actor=actor,
        action=EXEC_ACTION,
        object_type=AUDIT_OBJECT,
        object_id=session.id,
        details={
            "pod": session.pod,
            "pod_uid": session.pod_uid,
            "container": container,
            "command": shown,
            "returncode": returncode,
            "bytes_out": bytes_out,
            "truncated": output.truncated if output is not None else False,
            "duration_ms": duration_ms,
            "error": error,
        },
    )
