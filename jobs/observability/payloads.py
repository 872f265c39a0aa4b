"""Pure: what a job change says in the change feed and in a webhook message. Plain data in, plain data out."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

STATE_CHANGED: Final = "job.state_changed"
RETRY_SCHEDULED: Final = "job.retry_scheduled"
ATTEMPT_STARTED: Final = "job.attempt_started"
IDENTITY_FINDING: Final = "job.identity_finding"
NOTE: Final = "job.note"
EVENT_TYPES: Final = (STATE_CHANGED, RETRY_SCHEDULED, ATTEMPT_STARTED, IDENTITY_FINDING, NOTE)

SUBMITTED: Final = "submitted"  # the Change kind of a new (accepted) job: it has no JobEvent of its own
NEW: Final = "new"  # the state a submission leaves, in metrics labels
NO_CAUSE: Final = "none"  # the cause of a change without one, in metrics labels

# Timeline kinds that change the state without naming it (jobs.submission writes them), and the state each
# one enters.
KIND_ENTERS: Final = {
    "created": "queued",
    "refused": "refused",
    "cancelled": "cancelled",
    "failed": "failed",
    "unknown": "unknown",
    SUBMITTED: "pending",
}
_TYPES: Final = {
    "transition": STATE_CHANGED,
    "retry": RETRY_SCHEDULED,
    "attempt": ATTEMPT_STARTED,
    "identity-finding": IDENTITY_FINDING,
    **dict.fromkeys(KIND_ENTERS, STATE_CHANGED),
}
EVIDENCE_ROWS = 5
VALUE_CHARS = 300
MESSAGE_CHARS = 2000


def event_type(kind: str) -> str:
    return _TYPES.get(kind, NOTE)


def states(kind: str, from_state: str, to_state: str, job_state_before: str) -> tuple[str, str]:
    """(from, to) of a change: the event's own, else what its kind enters and the job's state before it."""
    to = to_state or KIND_ENTERS.get(kind, "")
    if not to:
        return from_state, ""
    before = from_state or (job_state_before if job_state_before and job_state_before != to else "")
    return before, to


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def evidence_summary(evidence: Any) -> list[dict[str, str]]:
    """The first rows of the evidence (object, field, value, at), each value cut to a few hundred chars."""
    if not isinstance(evidence, list):
        return []
    return [
        {
            "object": _short(row.get("object", "")),
            "field": _short(row.get("field", "")),
            "value": _short(row.get("value", "")),
            "at": str(row.get("at") or ""),
        }
        for row in evidence[:EVIDENCE_ROWS]
        if isinstance(row, dict)
    ]


def change_data(
    *, kind: str, message: str, details: dict[str, Any], rank: int | None, exit_code: int | None
) -> dict[str, Any]:
    """What a change carries besides its states: message, rank and exit code, evidence summary, and per kind
    the reason codes (refused), the findings (identity), the backoff (retry)."""
    data: dict[str, Any] = {"message": _short_message(message), "rank": rank, "exit_code": exit_code}
    if details.get("evidence"):
        data["evidence"] = evidence_summary(details["evidence"])
    if kind == "refused":
        data["reasons"] = [
            str(r.get("code", "")) for r in details.get("reasons") or [] if isinstance(r, dict)
        ]
    if kind == "identity-finding":
        data["findings"] = [
            {k: f.get(k) for k in ("rank", "attempt", "restart_attempt", "pods", "why", "expected")}
            for f in details.get("findings") or []
            if isinstance(f, dict)
        ]
    if kind == "retry":
        data["backoff_seconds"] = details.get("backoff_seconds")
        data["why"] = details.get("why", "")
    return data


def _short_message(message: str) -> str:
    return message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 1] + "…"


def feed_item(
    *,
    cursor: str,
    job_id: str,
    namespace: str,
    kind: str,
    type_: str,
    from_state: str,
    to_state: str,
    cause: str,
    attempt: int | None,
    at: datetime,
    data: dict[str, Any],
) -> dict[str, Any]:
    """One change as the feed (GET /api/v1/events) and a webhook message's `data` show it."""
    return {
        "cursor": cursor,  # sealed for its reader (jobs.observability.cursors)
        "type": type_,
        "kind": kind,
        "job": job_id,
        "namespace": namespace,
        "from_state": from_state,
        "to_state": to_state,
        "cause": cause,
        "attempt": attempt,
        "at": at.isoformat(),
        "status_url": f"/api/v1/jobs/{job_id}",
        **data,
    }


def message_body(type_: str, timestamp: datetime, data: dict[str, Any]) -> dict[str, Any]:
    """A Standard Webhooks message: {type, timestamp, data}."""
    return {"type": type_, "timestamp": timestamp.isoformat(), "data": data}
