"""Run a command in a running session's trainer pod through pods/exec, and record it in the audit log."""

from __future__ import annotations

import time
from collections.abc import Sequence

from django.conf import settings
from django.contrib.auth.models import User

from cluster import exec as pods
from cluster.errors import ClusterError, NotFound, Rejected
from dispatch_site import metrics
from dispatch_site.audit import audit_record
from jobs.models import Session, SessionState
from jobs.sessions.errors import ExecRefused, ExecTimedOut, NotSessionOwner, SessionNotRunning
from jobs.sessions.rules import AUDIT_OBJECT, EXEC_ACTION, PHASE_RUNNING, ExecResult, command_argv
from jobs.sessions.services import session_set_state


def _pod_gone(session: Session, detail: str) -> SessionNotRunning:
    message = (
        f"trainer pod {session.pod} {detail}: the session cannot run commands; close it and open a new one"
    )
    session_set_state(session, {SessionState.RUNNING}, SessionState.FAILED, message=message)
    session.refresh_from_db()
    return SessionNotRunning(session, message)


def session_exec(
    *,
    actor: User,
    session: Session,
    command: str | Sequence[str],
    container: str | None = None,
    timeout_seconds: float | None = None,
) -> ExecResult:
    """Run one command in the session's trainer pod and record it (history and audit log).
    NotSessionOwner, SessionNotRunning, ExecRefused, ExecTimedOut; ClusterError when unreachable."""
    if session.owner_id != actor.pk:
        raise NotSessionOwner(
            f"only {session.owner.get_username()}, who opened session {session.id}, runs commands in it"
        )
    if session.state != SessionState.RUNNING:
        reason = f": {session.message}" if session.message else ""
        raise SessionNotRunning(session, f"session {session.id} is {session.state}{reason}")
    container = container or session.container
    timeout = float(timeout_seconds or settings.SESSION_EXEC_TIMEOUT_SECONDS)
    started = time.monotonic()
    output: pods.ExecOutput | None = None
    error = ""
    try:
        output = pods.exec_in_pod(
            session.namespace,
            session.pod,
            container,
            command_argv(command),
            timeout=timeout,
            max_bytes=settings.SESSION_EXEC_MAX_OUTPUT_BYTES,
        )
    except pods.ExecTimeout as exc:
        output, error = exc.output, exc.message
    except NotFound as exc:
        error = exc.message
    except Rejected as exc:
        error = exc.message
    except ClusterError as exc:
        error = exc.message
        _record_exec(actor, session, command, container, None, error, started)
        raise
    _record_exec(actor, session, command, container, output, error, started)
    if output is None:
        pod = None
        try:
            pod = pods.get_pod(session.namespace, session.pod)
        except ClusterError:
            pod = None
        if pod is None or pod.deleting:
            raise _pod_gone(session, "is gone")
        if pod.phase != PHASE_RUNNING:
            raise _pod_gone(session, f"is {pod.phase}")
        raise ExecRefused(error)
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
            "container": container,
            "command": shown,
            "returncode": returncode,
            "bytes_out": bytes_out,
            "truncated": output.truncated if output is not None else False,
            "duration_ms": duration_ms,
            "error": error,
        },
    )
