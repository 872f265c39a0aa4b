"""Usage reads: the daily rollup summed per group (and per day or week), scoped like every read. Never a
scan of the attempts: the rows are per day and key (jobs.usage.models)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Final

from django.db.models import F, Q, QuerySet, Sum
from django.db.models.functions import TruncWeek

from dispatch_site import roles
from jobs.usage import measure
from jobs.usage.models import WAIT_COLUMNS, UsageDay

GROUPS: Final = ("namespace", "owner", "queue", "runtime", "cause")
STEPS: Final = ("day", "week")
_COLUMN: Final = {"cause": "outcome"}  # the API's name -> the rollup's column


@dataclass(frozen=True)
class UsageQuery:
    group_by: str
    since: date
    until: date  # inclusive
    step: str = ""  # "", day or week
    namespace: str = ""
    owner: str = ""
    queue: str = ""


def _scoped(queryset: QuerySet[Any], user: Any) -> QuerySet[Any]:
    """Platform and on-call read all usage; everybody else their own jobs' and their granted namespaces'."""
    if roles.can_read_all_jobs(user):
        return queryset
    granted = roles.granted_namespaces(user)
    if roles.ALL_NAMESPACES in granted:
        return queryset
    return queryset.filter(Q(owner=user.get_username()) | Q(namespace__in=sorted(granted)))


def _filtered(user: Any, query: UsageQuery) -> QuerySet[Any]:
    rows = _scoped(UsageDay.objects.filter(day__gte=query.since, day__lte=query.until), user)
    for name in ("namespace", "owner", "queue"):
        value = getattr(query, name)
        if value:
            rows = rows.filter(**{name: value})
    if query.step == "week":
        rows = rows.annotate(period=TruncWeek("day"))
    elif query.step == "day":
        rows = rows.annotate(period=F("day"))
    return rows


def _keys(query: UsageQuery) -> list[str]:
    column = _COLUMN.get(query.group_by, query.group_by)
    return [column, "period"] if query.step else [column]


def usage_rows(user: Any, query: UsageQuery) -> list[dict[str, Any]]:
    """One row per group (and period): the key, GPU-, lost GPU- and CPU-hours, jobs, attempts and the queue
    wait's p50 and p95 (estimated from the histogram: jobs.usage.measure.percentile), sorted by key. One
    aggregate query over the day rows."""
    keys = _keys(query)
    waits = {column: Sum(column) for column in WAIT_COLUMNS}
    totals = (
        _filtered(user, query)
        .values(*keys)
        .annotate(
            gpu=Sum("gpu_seconds"),
            lost=Sum("gpu_seconds_lost"),
            cpu=Sum("cpu_seconds"),
            n_jobs=Sum("jobs"),
            n_attempts=Sum("attempts"),
            **{f"n_{column}": total for column, total in waits.items()},
        )
        .order_by(*keys)
    )
    rows = []
    for row in totals:
        counts = {i: row[f"n_{column}"] or 0 for i, column in enumerate(WAIT_COLUMNS)}
        out: dict[str, Any] = {query.group_by: row[keys[0]]}
        if query.step:
            period = row["period"]
            out["period"] = period.date() if isinstance(period, datetime) else period
        out |= {
            "gpu_hours": measure.hours(row["gpu"] or 0.0),
            "gpu_hours_lost": measure.hours(row["lost"] or 0.0),
            "cpu_hours": measure.hours(row["cpu"] or 0.0),
            "jobs": row["n_jobs"] or 0,
            "attempts": row["n_attempts"] or 0,
            "queue_wait_p50_seconds": measure.percentile(counts, 0.5),
            "queue_wait_p95_seconds": measure.percentile(counts, 0.95),
        }
        rows.append(out)
    return rows
