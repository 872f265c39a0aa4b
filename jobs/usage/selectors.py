"""Usage reads: the daily rollup summed per group (and per day or week), scoped like every read, plus the
attempts it has not counted yet (running ones, measured until now). Never a scan of the attempts' history:
the rows are per day and key (jobs.usage.models)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

from django.db import connection, transaction
from django.db.models import F, Q, QuerySet, Sum
from django.db.models.functions import TruncWeek
from django.utils import timezone

from dispatch_site import roles
from jobs.models import ACTIVE_STATES, Execution, JobState
from jobs.usage import measure
from jobs.usage.models import WAIT_COLUMNS, UsageDay, usage_key

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


def _scoped(
    queryset: QuerySet[Any], user: Any, *, owner: str = "owner", namespace: str = "namespace"
) -> QuerySet[Any]:
    """Platform and on-call read all usage; everybody else their own jobs' and their granted namespaces'.
    `owner` and `namespace` name the lookups that hold the owner's username and the namespace."""
    if roles.can_read_all_jobs(user):
        return queryset
    granted = roles.granted_namespaces(user)
    if roles.ALL_NAMESPACES in granted:
        return queryset
    return queryset.filter(Q(**{owner: user.get_username()}) | Q(**{f"{namespace}__in": sorted(granted)}))


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


@dataclass
class Amounts:
    gpu: float = 0.0
    lost: float = 0.0
    cpu: float = 0.0
    jobs: int = 0
    attempts: int = 0
    waits: dict[int, int] = field(default_factory=dict)  # histogram bucket -> attempts

    def add(self, other: Amounts) -> None:
        self.gpu += other.gpu
        self.lost += other.lost
        self.cpu += other.cpu
        self.jobs += other.jobs
        self.attempts += other.attempts
        for bucket, n in other.waits.items():
            self.waits[bucket] = self.waits.get(bucket, 0) + n


def _period(day: date, step: str) -> date | None:
    if step == "week":
        return day - timedelta(days=day.weekday())  # TruncWeek's Monday
    return day if step == "day" else None


def _not_counted(user: Any, query: UsageQuery, now: datetime) -> Iterator[tuple[tuple[Any, ...], Amounts]]:
    """The attempts the rollup has not counted yet, measured now: those still running (on today, outcome
    `running`, measured until now) and those ended in the last moments before the beat's next rollup. A few
    at any time (the active attempts, through the state index, and the rollup's partial index): never a scan
    of history. Each yields its group key and amounts, so the answer never drops or doubles an attempt."""
    attempts = Execution.objects.filter(
        Q(finished_at__isnull=True, state__in=sorted(ACTIVE_STATES))
        | Q(finished_at__isnull=False, usage_rolled_at__isnull=True)
    ).select_related("job", "job__owner")
    attempts = _scoped(attempts, user, owner="job__owner__username", namespace="job__namespace")
    for name, lookup in (("namespace", "job__namespace"), ("owner", "job__owner__username")):
        if getattr(query, name):
            attempts = attempts.filter(**{lookup: getattr(query, name)})
    for execution in attempts.iterator(chunk_size=200):
        job = execution.job
        ended = execution.finished_at is not None
        day = (execution.finished_at or now).astimezone(UTC).date()
        if not query.since <= day <= query.until:
            continue
        usage = measure.attempt_usage(
            execution.pods_seen or {},
            state=execution.state if ended else JobState.RUNNING,
            started_at=execution.started_at,
            submitted_at=execution.submitted_at,
            ended_at=execution.finished_at or now,
        )
        if not ended and not usage.gpu_seconds and not usage.cpu_seconds and execution.started_at is None:
            continue  # nothing ran yet: not an attempt that used anything
        outcome = measure.outcome(execution.state, execution.cause) if ended else JobState.RUNNING.value
        fields = usage_key(job, outcome)
        if query.queue and fields["queue"] != query.queue:
            continue
        amounts = Amounts(
            gpu=usage.gpu_seconds,
            lost=usage.gpu_seconds if ended and usage.lost else 0.0,
            cpu=usage.cpu_seconds,
            jobs=1 if execution.attempt == 1 else 0,
            attempts=1,
        )
        if usage.queue_wait_seconds is not None:
            amounts.waits[measure.wait_bucket(usage.queue_wait_seconds)] = 1
        yield (fields[_COLUMN.get(query.group_by, query.group_by)], _period(day, query.step)), amounts


@contextmanager
def _snapshot() -> Iterator[None]:
    """One snapshot for the reads inside: on PostgreSQL a REPEATABLE READ transaction when this is the
    outermost one (inside another, its isolation stands); SQLite's read transaction is a snapshot already."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def usage_rows(user: Any, query: UsageQuery, *, now: datetime | None = None) -> list[dict[str, Any]]:
    """One row per group (and period): the key, GPU-, lost GPU- and CPU-hours, jobs, attempts and the queue
    wait's p50 and p95 (estimated from the histogram: jobs.usage.measure.percentile), sorted by key. One
    aggregate query over the day rows, plus the few attempts the rollup has not counted yet (running, or
    ended since its last run), so a running job's GPU-hours show while it runs."""
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
    groups: dict[tuple[Any, ...], Amounts] = {}
    with _snapshot():  # the rollup commits between two reads: each attempt is in exactly one of them
        for row in totals:
            period = row.get("period")
            key = (row[keys[0]], period.date() if isinstance(period, datetime) else period)
            groups[key] = Amounts(
                gpu=row["gpu"] or 0.0,
                lost=row["lost"] or 0.0,
                cpu=row["cpu"] or 0.0,
                jobs=row["n_jobs"] or 0,
                attempts=row["n_attempts"] or 0,
                waits={i: row[f"n_{column}"] or 0 for i, column in enumerate(WAIT_COLUMNS)},
            )
        for key, amounts in _not_counted(user, query, now or timezone.now()):
            groups.setdefault(key, Amounts()).add(amounts)
    rows = []
    for (value, period), amounts in sorted(
        groups.items(), key=lambda item: (item[0][0], item[0][1] or date.min)
    ):
        out: dict[str, Any] = {query.group_by: value}
        if query.step:
            out["period"] = period
        out |= {
            "gpu_hours": measure.hours(amounts.gpu),
            "gpu_hours_lost": measure.hours(amounts.lost),
            "cpu_hours": measure.hours(amounts.cpu),
            "jobs": amounts.jobs,
            "attempts": amounts.attempts,
            "queue_wait_p50_seconds": measure.percentile(amounts.waits, 0.5),
            "queue_wait_p95_seconds": measure.percentile(amounts.waits, 0.95),
        }
        rows.append(out)
    return rows
