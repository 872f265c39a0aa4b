"""The errors the session services raise; the API turns each into an answer."""

from __future__ import annotations

from collections.abc import Sequence

from jobs.models import Session
from jobs.sessions.rules import ExecResult
from runtimes.reasons import Reason


class SessionRefused(Exception):
    """422: the runtime cannot serve a session; every reason."""

    def __init__(self, reasons: Sequence[Reason]) -> None:
        self.reasons = tuple(reasons)
        super().__init__("refused: " + ", ".join(r.code for r in self.reasons))


class SessionNameTaken(Exception):
    """409: another session that is not closed holds the TrainJob name in the namespace."""


class SessionLimitReached(Exception):
    """409: the owner already holds the site's limit of open sessions (max_open_sessions_per_user)."""


class SessionCreateFailed(Exception):
    """The cluster refused the objects (422) or could not be reached (503); the session is failed."""

    def __init__(self, session: Session, message: str, *, transient: bool) -> None:
        self.session = session
        self.transient = transient
        super().__init__(message)


class NotSessionOwner(Exception):
    """403: only the owner runs commands in a session."""


class ExecForbidden(Exception):
    """403: the caller's namespace grant, or the runtime's place on the allow-list, was withdrawn."""


class SessionNotRunning(Exception):
    """409: the session is not running (its state says why); or its trainer pod is gone."""

    def __init__(self, session: Session, message: str) -> None:
        self.session = session
        super().__init__(message)


class ExecRefused(Exception):
    """400: the container is not one commands may run in, or the API server refused the exec for the
    request's own reason."""


class ExecTimedOut(Exception):
    """504: the command was still running when its timeout ended."""

    def __init__(self, message: str, result: ExecResult) -> None:
        self.result = result
        super().__init__(message)
