"""Reads for the overview (home) and the refusals page. Every job read starts from jobs_visible_to, and every
runtime read keeps only the runtimes the user may read (ClusterTrainingRuntimes; TrainingRuntimes of granted
namespaces; the platform role all), so a user sees counts, codes, jobs and runtimes of what their grants allow
and nothing else. Error text from the API server and the supervisor is the platform role's only."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from dispatch_site import roles
from dispatch_site.causes import Cause
from jobs.models import ACTIVE_STATES, Execution, Job, JobState, SupervisorCycle, WorkerRead
from jobs.selectors import jobs_visible_to, running_per_worker, window_start
from runtimes.fixes import Fix, fix_for
from runtimes.models import AllowListEntry, RuntimeVerdict, runtime_ref
from runtimes.selectors import latest_verdicts, runtime_readable

RECENT_VERDICTS = timedelta(days=7)
LIST_CAP = 20  # jobs named per refusal code (the count says how many there are)


@dataclass(frozen=True)
class Counts:
    window: str
    total: int
    states: list[tuple[str, int]]  # every state, in JobState order, zeros included
    causes: list[tuple[str, int]]  # causes that occur, most frequent first


def counts(user: Any, window: str, *, now: datetime | None = None) -> Counts:
    """Jobs submitted in the window, per state and per cause: two grouped queries on the created_at index."""
    since = window_start(window, now)
    queryset = jobs_visible_to(user).order_by()
    if since is not None:
        queryset = queryset.filter(created_at__gte=since)
    by_state = dict(queryset.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    by_cause = (
        queryset.exclude(cause="").values_list("cause").annotate(n=Count("id")).values_list("cause", "n")
    )
    return Counts(
        window=window,
        total=sum(by_state.values()),
        states=[(state, by_state.get(state, 0)) for state in JobState.values],
        causes=sorted(by_cause, key=lambda pair: (-pair[1], pair[0])),
    )


@dataclass(frozen=True)
class QueueWaiting:
    cluster_queue: str
    jobs: int
    local_queues: list[str]


def waiting_in_kueue(user: Any) -> list[QueueWaiting]:
    """Queued jobs the user may see, per Kueue ClusterQueue (the one their plan resolved their LocalQueue
    to: a waiting Workload names no ClusterQueue until it is admitted): one grouped query, most waiting
    first."""
    rows = (
        jobs_visible_to(user)
        .order_by()
        .filter(state=JobState.QUEUED)
        .exclude(plan__queue__cluster_queue=None)
        .exclude(plan__queue__cluster_queue="")
        .values_list("plan__queue__cluster_queue", "plan__queue__local_queue")
        .annotate(n=Count("id"))
    )
    jobs: Counter[str] = Counter()
    local: dict[str, set[str]] = defaultdict(set)
    for cluster_queue, local_queue, n in rows:
        jobs[str(cluster_queue)] += n
        if local_queue:
            local[str(cluster_queue)].add(str(local_queue))
    return [
        QueueWaiting(cluster_queue=cq, jobs=n, local_queues=sorted(local[cq]))
        for cq, n in sorted(jobs.items(), key=lambda item: (-item[1], item[0]))
    ]


@dataclass
class RefusedRuntime:
    ref: str
    kind: str
    namespace: str
    name: str
    messages: list[str]


@dataclass
class CodeGroup:
    """One refusal code: what it means, how to fix it, and who is refused for it."""

    code: str
    fix: Fix
    job_count: int = 0
    jobs: list[dict[str, Any]] = field(default_factory=list)  # the newest LIST_CAP
    runtimes: list[RefusedRuntime] = field(default_factory=list)
    runtime_names: Counter[str] = field(default_factory=Counter)  # runtimes behind the refused jobs

    @property
    def total(self) -> int:
        return self.job_count + len(self.runtimes)

    @property
    def top_runtimes(self) -> list[tuple[str, int]]:
        """(a template cannot call most_common: a Counter answers 0 to any key it is asked for.)"""
        return self.runtime_names.most_common(5)


def refusals(
    user: Any,
    *,
    code: str = "",
    runtime: str = "",
    namespace: str = "",
    owner: str = "",
    window: str = "",
    now: datetime | None = None,
) -> list[CodeGroup]:
    """Every refused job (visible to `user`) and every refused allow-listed runtime, grouped by code, the
    most frequent code first. Reads the refused jobs' reasons only (the state index), newest first."""
    jobs = jobs_visible_to(user).filter(state=JobState.REFUSED)
    if runtime:
        jobs = jobs.filter(runtime_name=runtime)
    if namespace:
        jobs = jobs.filter(namespace=namespace)
    if owner:
        jobs = jobs.filter(owner__username=owner)
    since = window_start(window, now)
    if since is not None:
        jobs = jobs.filter(created_at__gte=since)
    groups: dict[str, CodeGroup] = {}

    def group(reason_code: str) -> CodeGroup:
        if reason_code not in groups:
            groups[reason_code] = CodeGroup(code=reason_code, fix=fix_for(reason_code))
        return groups[reason_code]

    rows = jobs.order_by("-created_at", "-id").values_list(
        "id",
        "display_name",
        "namespace",
        "runtime_kind",
        "runtime_name",
        "owner__username",
        "created_at",
        "reasons",
    )
    for job_id, name, ns, kind, rt_name, username, created_at, reasons in rows.iterator(chunk_size=2000):
        seen: set[str] = set()
        for reason in reasons or []:
            reason_code = str(reason.get("code", "")) if isinstance(reason, dict) else ""
            if not reason_code or reason_code in seen or (code and reason_code != code):
                continue
            seen.add(reason_code)
            entry = group(reason_code)
            entry.job_count += 1
            entry.runtime_names[rt_name] += 1
            if len(entry.jobs) < LIST_CAP:
                entry.jobs.append(
                    {
                        "id": job_id,
                        "display_name": name,
                        "namespace": ns,
                        "runtime": rt_name,
                        "runtime_kind": kind,
                        "owner": username,
                        "created_at": created_at,
                        "message": str(reason.get("message", "")),
                    }
                )
    # Namespace and owner filters are about jobs; a runtime is nobody's, so they leave runtimes out.
    if not (namespace or owner or window):
        for runtime_row in refused_runtimes(user):
            if runtime and runtime_row.name != runtime:
                continue
            by_code: dict[str, list[str]] = defaultdict(list)
            for reason_code, message in runtime_row.messages_by_code:
                by_code[reason_code].append(message)
            for reason_code, messages in by_code.items():
                if code and reason_code != code:
                    continue
                group(reason_code).runtimes.append(
                    RefusedRuntime(
                        ref=runtime_row.ref,
                        kind=runtime_row.kind,
                        namespace=runtime_row.namespace,
                        name=runtime_row.name,
                        messages=messages,
                    )
                )
    return sorted(groups.values(), key=lambda g: (-g.total, g.code))


@dataclass(frozen=True)
class RuntimeRefusal:
    ref: str
    kind: str
    namespace: str
    name: str
    messages_by_code: list[tuple[str, str]]
    checked_at: datetime


def refused_runtimes(user: Any) -> list[RuntimeRefusal]:
    """Allow-listed runtimes the user may read whose newest recorded verdict refuses them (the re-check's
    history)."""
    readable = runtime_readable(user)
    allowed = {(e.kind, e.namespace, e.name) for e in AllowListEntry.objects.all()}
    rows = []
    for key, verdict in latest_verdicts().items():
        if key not in allowed or not verdict.refused or not readable(key):
            continue
        reasons = [r for r in verdict.verdict.get("reasons", []) if not r.get("waived")]
        rows.append(
            RuntimeRefusal(
                ref=runtime_ref(*key),
                kind=key[0],
                namespace=key[1],
                name=key[2],
                messages_by_code=[(str(r.get("code", "")), str(r.get("message", ""))) for r in reasons],
                checked_at=verdict.checked_at,
            )
        )
    return sorted(rows, key=lambda r: r.ref)


def identity_warned_jobs(user: Any, limit: int = 50) -> list[Job]:
    """Jobs not yet finished that run under an identity warning (the partial index of 0004)."""
    return list(
        jobs_visible_to(user)
        .filter(~Q(identity_warnings=[]), state__in=ACTIVE_STATES)
        .order_by("-created_at", "-id")[:limit]
    )


@dataclass(frozen=True)
class VerdictChange:
    ref: str
    kind: str
    namespace: str
    name: str
    at: datetime
    refused: bool
    codes: list[str]
    before_refused: bool | None  # None: the first verdict recorded for this runtime
    before_codes: list[str]


def verdict_changes(user: Any, *, now: datetime | None = None, limit: int = 15) -> list[VerdictChange]:
    """The newest verdict rows of the last week of runtimes the user may read, each with the verdict it
    replaced. A runtime that never existed (a typo, a made-up name) makes no entry: a "not found" verdict
    counts only when the runtime existed before it."""
    since = (now or timezone.now()) - RECENT_VERDICTS
    readable = runtime_readable(user)
    namespaces = roles.namespace_reader(user)
    recent_rows = RuntimeVerdict.objects.filter(checked_at__gte=since).order_by("-checked_at", "-id")
    if not roles.is_platform(user) and not namespaces(roles.ALL_NAMESPACES):
        granted = roles.granted_namespaces(user)
        recent_rows = recent_rows.filter(Q(namespace="") | Q(namespace__in=granted))
    changes: list[VerdictChange] = []
    for row in recent_rows.iterator(chunk_size=200):
        if len(changes) >= limit:
            break
        if not readable((row.kind, row.namespace, row.name)):
            continue
        before = (
            RuntimeVerdict.objects.filter(
                kind=row.kind, namespace=row.namespace, name=row.name, id__lt=row.id
            )
            .order_by("-id")
            .first()
        )
        if row.runtime is None and (before is None or before.runtime is None):
            continue  # never existed: nothing changed
        changes.append(
            VerdictChange(
                ref=runtime_ref(row.kind, row.namespace, row.name),
                kind=row.kind,
                namespace=row.namespace,
                name=row.name,
                at=row.checked_at,
                refused=row.refused,
                codes=row.codes,
                before_refused=before.refused if before else None,
                before_codes=before.codes if before else [],
            )
        )
    return changes


@dataclass(frozen=True)
class SupervisorHealth:
    name: str
    last_finished: datetime | None
    lag_seconds: float | None  # since the last cycle finished
    interval_seconds: float
    late: bool  # more than three intervals since the last cycle
    duration_ms: int
    api_requests: int
    error: str


def supervisor_health(user: Any, *, now: datetime | None = None) -> SupervisorHealth:
    """The supervisor's last cycle; its error text only for the platform role (it can name other
    namespaces' objects and the API server's answers)."""
    cycle = SupervisorCycle.objects.filter(name="supervisor").first()
    interval = float(settings.SUPERVISOR_INTERVAL_SECONDS)
    finished = cycle.finished_at if cycle else None
    lag = ((now or timezone.now()) - finished).total_seconds() if finished else None
    return SupervisorHealth(
        name="supervisor",
        last_finished=finished,
        lag_seconds=lag,
        interval_seconds=interval,
        late=lag is None or lag > 3 * interval,
        duration_ms=cycle.duration_ms if cycle else 0,
        api_requests=cycle.api_requests if cycle else 0,
        error=_shown_error(user, cycle.error if cycle else ""),
    )


@dataclass(frozen=True)
class WorkerHealth:
    """One MultiKueue worker cluster on the overview (issue 35): whether it answers now (the live check the
    view made), how supervision's last reads of it went (jobs.models.WorkerRead), and how many of the user's
    visible jobs run there."""

    name: str
    reachable: bool
    version: str
    error: str
    last_read_ok: datetime | None
    last_read_failed: datetime | None
    read_error: str
    reading: bool
    running: int


def worker_health(
    user: Any, *, configured: list[str], checks: dict[str, dict[str, Any]]
) -> list[WorkerHealth]:
    """Every worker dispatch has credentials for (`configured`), has read, or has a supervised job on;
    `checks`: the live check of each (cluster.health.check_worker), a missing one read as not reachable.
    Error texts for the platform role only."""
    reads = {r.name: r for r in WorkerRead.objects.all()}
    on_worker = (
        Execution.objects.filter(state__in=ACTIVE_STATES, job__state__in=ACTIVE_STATES)
        .exclude(cluster="")
        .values_list("cluster", flat=True)
        .distinct()
    )
    names = sorted(set(configured) | set(reads) | set(on_worker))
    running = running_per_worker(jobs_visible_to(user))
    rows = []
    for name in names:
        check = checks.get(name) or {"ok": False, "error": "dispatch has no credentials for it"}
        read = reads.get(name)
        rows.append(
            WorkerHealth(
                name=name,
                reachable=bool(check.get("ok")),
                version=str(check.get("version") or ""),
                error=_shown_error(user, str(check.get("error") or "")),
                last_read_ok=read.ok_at if read else None,
                last_read_failed=read.failed_at if read else None,
                read_error=_shown_error(user, read.error if read and not read.reading else ""),
                reading=bool(read and read.reading),
                running=int(running.get(name, 0)),
            )
        )
    return rows


HIDDEN_ERROR = "an error (its text is shown to the platform role)"


def _shown_error(user: Any, error: str) -> str:
    return error if not error or roles.is_platform(user) else HIDDEN_ERROR


def kubernetes_health(user: Any, check: dict[str, Any]) -> dict[str, Any]:
    """The API server check as the overview shows it: its error text for the platform role only."""
    if check.get("ok") or roles.is_platform(user):
        return check
    return {**check, "error": HIDDEN_ERROR}


GUARD_HIDDEN = "the platform role sees which policy is missing (manage.py check_cluster)"


def guard_health(user: Any, check: dict[str, Any]) -> dict[str, Any]:
    """The admission guard check (cluster.guard) as the overview shows it: complete or not to everyone; which
    policy is missing, which namespaces it covers, and a read's error text, to the platform role only."""
    if roles.is_platform(user):
        return check
    if check.get("ok"):
        return {"ok": True}
    return {"ok": False, "warnings": [GUARD_HIDDEN] if "warnings" in check else [], "error": HIDDEN_ERROR}


CAUSES = Cause.values
