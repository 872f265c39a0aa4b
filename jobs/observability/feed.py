"""The change feed: the sequencer that orders the outbox, and reads of it.

Why a sequencer: Change ids are handed out at insert time, so transaction B can commit its id 11 while
transaction A still holds id 10; a reader that moved its cursor to 11 would never see 10. The sequencer gives
each committed, not yet sequenced row the next `seq`, in id order, one sequencer at a time (a transaction-
level advisory lock on PostgreSQL; SQLite runs one writer at a time anyway). Rows that commit later get larger
numbers than everything already numbered, so a reader following `seq` misses nothing. Readers run it before
they read (a cheap UPDATE on a partial index when there is nothing to number); writers never wait for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Max, QuerySet

from jobs.models import Job
from jobs.observability import cursors, payloads
from jobs.observability.cursors import BadCursor as BadCursor  # what parse_cursor raises
from jobs.observability.models import Change

# pg_advisory_xact_lock key: "dispatch feed sequencer" (any constant the application uses for nothing else).
SEQUENCER_LOCK = 0x64_69_73_70_66_65_65_64
BATCH = 5000
NOW = "now"
PAGE = 100
PAGE_MAX = 1000


def sequence() -> int:
    """Number the committed rows that have no seq yet; returns how many it numbered."""
    numbered = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SEQUENCER_LOCK])
            table = Change._meta.db_table
            cursor.execute(
                f"""
                UPDATE {table} SET seq = todo.base + todo.n
                FROM (
                    SELECT id, row_number() OVER (ORDER BY id) AS n,
                           (SELECT coalesce(max(seq), 0) FROM {table}) AS base
                    FROM {table} WHERE seq IS NULL ORDER BY id LIMIT {BATCH}
                ) AS todo
                WHERE {table}.id = todo.id
                """
            )
            count = cursor.rowcount
        numbered += max(count, 0)
        if count < BATCH:
            return numbered


def parse_cursor(raw: str | None, *, user_id: int) -> int | None:
    """The seq after which to read: "" or None from the start, "now" from the newest (None here), else a
    cursor this feed handed to this user (jobs.observability.cursors); BadCursor otherwise."""
    if raw is None or raw == "":
        return 0
    if raw == NOW:
        return None
    return cursors.unseal(raw, user_id)


def visible_changes(user: Any, visible_jobs: QuerySet[Job]) -> QuerySet[Change]:
    """The changes of the jobs `visible_jobs` holds (jobs.selectors.jobs_visible_to(user)): unfiltered when
    that queryset has no filter (platform, on-call), else through it (its rules, whatever they are)."""
    changes = Change.objects.filter(seq__isnull=False)
    if visible_jobs.query.has_filters():
        changes = changes.filter(job__in=visible_jobs.order_by().values("pk"))
    return changes


def latest_seq() -> int:
    return int(Change.objects.aggregate(top=Max("seq"))["top"] or 0)


@dataclass(frozen=True)
class FeedPage:
    items: list[dict[str, Any]]
    cursor: str  # pass as ?after= to read on
    more: bool  # another page follows at once


def read(changes: QuerySet[Change], *, after: int | None, user_id: int, limit: int = PAGE) -> FeedPage:
    """Up to `limit` changes after the cursor, oldest first, their cursors sealed for `user_id`. Numbers the
    outbox first (sequence)."""
    sequence()
    if after is None:
        return FeedPage(items=[], cursor=cursors.seal(latest_seq(), user_id), more=False)
    rows = list(
        changes.filter(seq__gt=after)
        .order_by("seq")
        .values_list(
            "seq",
            "job_id",
            "namespace",
            "kind",
            "type",
            "from_state",
            "to_state",
            "cause",
            "attempt",
            "at",
            "data",
        )[: limit + 1]
    )
    more = len(rows) > limit
    rows = rows[:limit]
    items = [
        payloads.feed_item(
            cursor=cursors.seal(int(seq or 0), user_id),
            job_id=job_id,
            namespace=ns,
            kind=kind,
            type_=type_,
            from_state=from_state,
            to_state=to_state,
            cause=cause,
            attempt=attempt,
            at=at,
            data=data,
        )
        for seq, job_id, ns, kind, type_, from_state, to_state, cause, attempt, at, data in rows
    ]
    # Nothing visible after the cursor: move it to the newest seq, so the next read starts there (every row up
    # to it is numbered already and can no longer appear).
    cursor = items[-1]["cursor"] if items else cursors.seal(max(after, latest_seq()), user_id)
    return FeedPage(items=items, cursor=cursor, more=more)


def version() -> tuple[int, int, int]:
    """A cheap fingerprint of the outbox, for ETags of pages that list jobs: the newest seq, and how many rows
    wait for one with the newest of their ids (a late commit changes it even before the sequencer runs).
    Reads only: two index lookups."""
    waiting = Change.objects.filter(seq__isnull=True).order_by().aggregate(n=Count("id"), top=Max("id"))
    return latest_seq(), int(waiting["n"] or 0), int(waiting["top"] or 0)
