"""Typed errors: one class per answer a caller handles differently, each carrying what the API said.

Every error from an HTTP answer is a ``DispatchError`` with ``status`` (the HTTP status), ``detail`` (the
API's message), ``body`` (the parsed JSON answer) and ``codes`` (the reason codes of a refusal, e.g.
``["restart-policy", "backoff-limit"]``). ``ConnectionFailed`` means no answer came at all.
"""

from __future__ import annotations

from typing import Any

from dispatch_client.models import ExecResult, Reason, reasons_from


class DispatchError(Exception):
    """The API answered with an error status."""

    def __init__(self, message: str, *, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.reasons: list[Reason] = reasons_from(body)

    @property
    def detail(self) -> str:
        if isinstance(self.body, dict) and isinstance(self.body.get("detail"), str):
            return str(self.body["detail"])
        return str(self)

    @property
    def codes(self) -> list[str]:
        """The reason codes of the answer (a refusal's), in the API's order; empty when it gave none."""
        return [r.code for r in self.reasons if not r.waived]


class ConnectionFailed(DispatchError):
    """No answer: the server could not be reached or did not answer in time."""


class BadRequest(DispatchError):
    """400: the request body is invalid. ``field_errors`` maps each field (nested as in the body) to its
    messages, e.g. ``{"num_nodes": ["Ensure this value is greater than or equal to 1."]}``."""

    @property
    def field_errors(self) -> dict[str, Any]:
        return dict(self.body) if isinstance(self.body, dict) else {}


class Unauthorized(DispatchError):
    """401: no token, or an invalid one."""


class Forbidden(DispatchError):
    """403: the caller's role or namespace grants do not allow this."""


class NotFound(DispatchError):
    """404: no such job, session or runtime (or one the caller may not see)."""


class Conflict(DispatchError):
    """409: the object is not in a state that allows this (``state`` names it when the API says)."""

    @property
    def state(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("state"), str):
            return str(self.body["state"])
        return None


class SessionNotRunning(Conflict, RuntimeError):
    """409 on execute: the session is not running (closed, closing, failed, or its trainer pod is gone)."""


class Refused(DispatchError):
    """422: the job or session was refused; ``reasons`` holds every reason and ``codes`` their codes.
    For a job the refusal is recorded: ``job_id`` names it."""

    @property
    def job_id(self) -> str | None:
        if isinstance(self.body, dict) and self.body.get("id") is not None:
            return str(self.body["id"])
        return None


class ServiceUnavailable(DispatchError):
    """503: a dependency of the service (the cluster, the database, Redis) is down; ``detail`` names it."""


class ServerError(DispatchError):
    """Any other 5xx."""


class ExecTimedOut(ServerError, TimeoutError):
    """504 on execute: the command outlived its ``timeout_seconds``; ``result`` holds what it printed."""

    @property
    def result(self) -> Any:
        return ExecResult.from_api(self.body) if isinstance(self.body, dict) else None


class JobEnded(DispatchError):
    """``wait`` saw the job reach a terminal state other than the one asked for; ``job`` is its last read."""

    def __init__(self, message: str, *, job: Any) -> None:
        super().__init__(message)
        self.job = job


_BY_STATUS: dict[int, type[DispatchError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Refused,
    503: ServiceUnavailable,
}


def error_for(status: int, body: Any, *, what: str) -> DispatchError:
    """The typed error for an HTTP error answer; ``what`` names the request (e.g. ``POST /api/v1/jobs``)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else DispatchError
    message = _summary(body)
    return cls(f"{what}: {status} {message}".rstrip(), status=status, body=body)


def _summary(body: Any) -> str:
    if isinstance(body, dict):
        if isinstance(body.get("detail"), str):
            return str(body["detail"])
        reasons = reasons_from(body)
        if reasons:
            return "; ".join(f"{r.code}: {r.message}" for r in reasons if not r.waived)
        if body.get("message"):
            return str(body["message"])
        return "; ".join(f"{k}: {_flatten(v)}" for k, v in body.items())
    if isinstance(body, str):
        return body[:500]
    return "" if body is None else str(body)[:500]


def _flatten(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(_flatten(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_flatten(v)}" for k, v in value.items())
    return str(value)
