"""Events, as one view over core/v1 and events.k8s.io: what outlives a pod's conditions. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from jobs.supervision.status.readers import as_map, iso, meta_of
from jobs.waits import parse_time

# The scheduler's event on a pod it placed: which node a pod that is gone now ran on.
_SCHEDULED_TO: Final = re.compile(r"Successfully assigned (\S+)/(\S+) to (\S+)")


@dataclass(frozen=True)
class EventView:
    kind: str
    name: str
    uid: str
    reason: str
    message: str
    type: str
    at: datetime | None
    # When it first happened: a legacy event's firstTimestamp (its lastTimestamp moves on every repeat), an
    # events.k8s.io event's eventTime (status-facts §5).
    first: datetime | None = None


def event_view(event: Mapping[str, Any]) -> EventView:
    involved = as_map(event.get("involvedObject")) or as_map(event.get("regarding"))
    # When it last happened: an events.k8s.io event's eventTime is its first occurrence, the repeats are in
    # its series (a JobSet's JobCreationFailed, repeated with backoff, keeps its first eventTime).
    at = (
        parse_time(as_map(event.get("series")).get("lastObservedTime"))
        or parse_time(event.get("eventTime"))
        or parse_time(event.get("lastTimestamp"))
        or parse_time(event.get("firstTimestamp"))
        or parse_time(meta_of(event).get("creationTimestamp"))
    )
    return EventView(
        kind=str(involved.get("kind", "")),
        name=str(involved.get("name", "")),
        uid=str(involved.get("uid", "")),
        reason=str(event.get("reason", "")),
        message=str(event.get("message") or event.get("note") or ""),
        type=str(event.get("type", "")),
        at=at,
        first=parse_time(event.get("firstTimestamp")) or parse_time(event.get("eventTime")) or at,
    )


def scheduled_node(events: Iterable[EventView], pod_name: str) -> str:
    """The node the scheduler placed this pod on, by its Scheduled event ("" when none is at hand)."""
    for event in events:
        match = _SCHEDULED_TO.search(event.message) if event.reason == "Scheduled" else None
        if match and match.group(2) == pod_name:
            return match.group(3)
    return ""


def latest_event_message(events: Sequence[EventView], pod_name: str, reason: str) -> str:
    found = [e for e in events if e.kind == "Pod" and e.name == pod_name and e.reason == reason]
    return found[-1].message if found else ""


def first_event_time(events: Sequence[EventView], pod_name: str, reasons: tuple[str, ...]) -> str | None:
    firsts = [
        event.first
        for event in events
        if event.kind == "Pod" and event.name == pod_name and event.reason in reasons and event.first
    ]
    return iso(min(firsts)) if firsts else None
