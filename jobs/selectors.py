"""Reads: which jobs a user may see, filtered, and one keyset page of them."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, F, Min, Q, QuerySet
from django.db.models.fields.tuple_lookups import (  # type: ignore[import-untyped]
    Tuple,
    TupleGreaterThan,
    TupleLessThan,
)
from django.utils import timezone

from dispatch_site import roles
from jobs.models import Execution, Job, JobState
from jobs.naming import is_job_id

# The windows the overview counts over; the job list accepts the same names (?window=24h).
WINDOWS: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
PAGE_SIZE = 50
# The list says "more than N" instead of counting the whole table on every page.
COUNT_CAP = 1000


def jobs_visible_to(user: Any) -> QuerySet[Job]:
    """Platform and on-call read every job; everybody else reads their own."""
    queryset = Job.objects.select_related("owner")
    if roles.can_read_all_jobs(user):
        return queryset
    return queryset.filter(owner_id=user.pk)


def job_for(user: Any, job_id: str) -> Job | None:
    return jobs_visible_to(user).filter(pk=job_id).first()


def may_cancel(user: Any, job: Job) -> bool:
    return bool(job.owner_id == user.pk or roles.is_platform(user) or roles.is_oncall(user))


def window_start(window: str, now: datetime | None = None) -> datetime | None:
    span = WINDOWS.get(window)
    return (now or timezone.now()) - span if span else None


def jobs_filtered(
    user: Any,
    *,
    state: str = "",
    cause: str = "",
    runtime: str = "",
    namespace: str = "",
    owner: str = "",
    identity_warning: bool = False,
    q: str = "",
    window: str = "",
    now: datetime | None = None,
) -> QuerySet[Job]:
    """Every filter narrows; each maps onto an index of jobs/migrations/0004 (or the primary key)."""
    queryset = jobs_visible_to(user)
    if state:
        queryset = queryset.filter(state=state)
    if cause:
        queryset = queryset.filter(cause=cause)
    if runtime:
        queryset = queryset.filter(runtime_name=runtime)
    if namespace:
        queryset = queryset.filter(namespace=namespace)
    if owner:
        queryset = queryset.filter(owner__username=owner)
    if identity_warning:
        queryset = queryset.filter(~Q(identity_warnings=[]))
    since = window_start(window, now)
    if since is not None:
        queryset = queryset.filter(created_at__gte=since)
    q = q.strip()
    if q:
        # An id finds that job; anything else searches the names (and id prefixes, as people paste them).
        queryset = (
            queryset.filter(pk=q)
            if is_job_id(q)
            else queryset.filter(Q(display_name__icontains=q) | Q(id__startswith=q.lower()))
        )
    return queryset


# ---------------------------------------------------------------- keyset pagination


def encode_cursor(job: Job) -> str:
    raw = f"{job.created_at.isoformat()}|{job.pk}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str] | None:
    """(created_at, id), or None for anything that is not a cursor this module made (a bad link: page 1)."""
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, job_id = raw.split("|", 1)
        when = datetime.fromisoformat(at)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    if when.tzinfo is None or not job_id:
        return None
    return when, job_id


@dataclass
class KeysetPage:
    rows: list[Job] = field(default_factory=list)
    older: str = ""  # cursor for the next (older) page, "" when this is the last one
    newer: str = ""  # cursor for the previous (newer) page, "" when this is the first one
    first: bool = True


def keyset_page(
    queryset: QuerySet[Job], *, after: str = "", before: str = "", size: int = PAGE_SIZE
) -> KeysetPage:
    """One page newest first, by (created_at, id): the database reads `size + 1` index entries from the
    cursor on, whatever the page number, and nothing counts the table."""
    key = Tuple(F("created_at"), F("id"))
    start = decode_cursor(before)
    if start is not None:
        # A newer page: read upwards from the cursor, then show it newest first.
        rows = list(queryset.filter(TupleGreaterThan(key, start)).order_by("created_at", "id")[: size + 1])
        more_newer = len(rows) > size
        rows = rows[:size][::-1]
        return KeysetPage(
            rows=rows,
            older=encode_cursor(rows[-1]) if rows else "",
            newer=encode_cursor(rows[0]) if rows and more_newer else "",
            first=not more_newer,
        )
    start = decode_cursor(after)
    ordered = queryset.order_by("-created_at", "-id")
    if start is not None:
        ordered = ordered.filter(TupleLessThan(key, start))
    rows = list(ordered[: size + 1])
    more_older = len(rows) > size
    rows = rows[:size]
    return KeysetPage(
        rows=rows,
        older=encode_cursor(rows[-1]) if rows and more_older else "",
        newer=encode_cursor(rows[0]) if rows and start is not None else "",
        first=start is None,
    )


def capped_count(queryset: QuerySet[Job], cap: int | None = None) -> tuple[int, bool]:
    """How many match, counting at most cap + 1 rows: (count, more than cap)."""
    cap = COUNT_CAP if cap is None else cap
    count = queryset.order_by()[: cap + 1].count()
    return min(count, cap), count > cap


def waiting_jobs_per_namespace() -> dict[str, int]:
    """Jobs pending or queued, per namespace (the settings page's preview: runtimes.selectors)."""
    rows = (
        Job.objects.filter(state__in=(JobState.PENDING, JobState.QUEUED))
        .values_list("namespace")
        .annotate(n=Count("id"))
    )
    return {str(namespace): int(n) for namespace, n in rows}


def running_per_worker(jobs: QuerySet[Job] | None = None) -> dict[str, int]:
    """MultiKueue worker -> how many jobs (of `jobs`, default all) run there now: their current attempt
    running on it. One grouped query; the overview (per user) and /metrics (all) count the same way."""
    running = Execution.objects.filter(state=JobState.RUNNING, job__state=JobState.RUNNING).exclude(
        cluster=""
    )
    if jobs is not None:
        running = running.filter(job__in=jobs)
    return dict(running.values_list("cluster").annotate(n=Count("pk")).values_list("cluster", "n"))


def deletes_pending() -> tuple[int, datetime | None]:
    """Attempts whose objects dispatch decided to remove and has not removed yet (the delete task and the
    sweep still at it: a TrainJob waiting for its Trainer to stop it, a cluster that does not answer), and
    when the oldest of them was asked for. One query on the partial index execution_delete_pending."""
    pending = Execution.objects.filter(delete_requested_at__isnull=False, objects_removed_at__isnull=True)
    figures = pending.aggregate(n=Count("pk"), oldest=Min("delete_requested_at"))
    return int(figures["n"] or 0), figures["oldest"]
