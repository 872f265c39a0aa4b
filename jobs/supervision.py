"""Supervision: bring every active execution up to date with the cluster.

One cycle reads the cluster with six label-selected list calls however many jobs there are
(cluster.gateway.list_supervised), groups the objects per execution, derives each execution's status with the
pure jobs.status.derive, and writes what changed:

- every transition is compare-and-set under row locks taken in one order (job, then execution), and written
  as a JobEvent (from, to, cause, evidence): two supervisors at once never double-record or double-act, and a
  cycle holds a lease (SupervisorCycle) so overlapping cycles skip instead of racing;
- a failed execution is followed by attempt A+1 when the job's recovery policy says so (jobs.recovery): the
  job goes back to `pending` for the backoff, then a new execution is started from the runtime snapshot
  stored with the job, and attempt A's objects are removed;
- when the cluster cannot be read, active jobs go to `unknown` (with their last known state and since when)
  and come back by themselves on the next readable cycle.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from cluster import gateway
from cluster.errors import ClusterError
from jobs import recovery
from jobs.models import Execution, Job, JobEvent, JobState, SupervisorCycle
from jobs.naming import trainjob_name, trainjob_name_prefix
from jobs.status import Context, DerivedStatus, Thresholds, condense_pod, derive
from runtimes.models import SiteSettings

logger = logging.getLogger(__name__)

SUPERVISED = frozenset({JobState.QUEUED, JobState.RUNNING, JobState.UNKNOWN})
RETRY_BACKOFF = "retry-backoff"


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


@dataclass
class CycleReport:
    ran: bool = True
    executions: int = 0
    transitions: int = 0
    api_requests: int = 0
    retries_started: int = 0
    error: str = ""
    duration_ms: int = 0


# ---------------------------------------------------------------- the lease


def _lease(name: str, seconds: float) -> bool:
    """Take the cycle lease for `name` (compare-and-set on its row); False when another holder has it."""
    now = timezone.now()
    SupervisorCycle.objects.get_or_create(name=name)
    taken = (
        SupervisorCycle.objects.filter(name=name)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_holder=_holder()))
        .update(lease_holder=_holder(), lease_until=now + timedelta(seconds=seconds), started_at=now)
    )
    return taken == 1


def _release(name: str, report: CycleReport) -> None:
    SupervisorCycle.objects.filter(name=name, lease_holder=_holder()).update(
        lease_holder="",
        lease_until=None,
        finished_at=timezone.now(),
        duration_ms=report.duration_ms,
        api_requests=report.api_requests,
        executions=report.executions,
        transitions=report.transitions,
        error=report.error[:2000],
        cycles=F("cycles") + 1,
    )


# ---------------------------------------------------------------- grouping


def _execution_key(obj: Mapping[str, Any], label_domain: str) -> tuple[str, int] | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    job_id = labels.get(f"{label_domain}/job")
    attempt = labels.get(f"{label_domain}/attempt")
    if not job_id or not str(attempt or "").isdigit():
        return None
    return str(job_id), int(str(attempt))


def group_objects(
    observed: gateway.Observed,
    label_domain: str,
    wanted: set[tuple[str, int]],
    trainjob_names: dict[str, tuple[str, int]],
) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The objects of each wanted execution: its labelled objects, the Events about them (by the TrainJob-name
    prefix every child name carries), and the Nodes its pods ran on."""
    grouped: dict[tuple[str, int], list[dict[str, Any]]] = {key: [] for key in wanted}
    for obj in [*observed.trainjobs, *observed.jobsets, *observed.jobs, *observed.pods]:
        key = _execution_key(obj, label_domain)
        if key in grouped:
            grouped[key].append(obj)
    for event in observed.events:
        involved = event.get("involvedObject") or event.get("regarding") or {}
        prefix = trainjob_name_prefix(str(involved.get("name", "")))
        if prefix:
            key = trainjob_names.get(f"{involved.get('namespace', '')}/{prefix}")
            if key in grouped:
                grouped[key].append(event)
    return grouped


def _nodes_for(
    objects: Iterable[Mapping[str, Any]], memory: Mapping[str, Any], nodes: Mapping[str, Any]
) -> list[Any]:
    names = {str((o.get("spec") or {}).get("nodeName") or "") for o in objects if o.get("kind") == "Pod"}
    names |= {str(p.get("node") or "") for p in memory.values()}
    return [nodes[n] for n in sorted(names) if n and n in nodes]


# ---------------------------------------------------------------- the cycle


def _thresholds() -> Thresholds:
    return Thresholds(
        no_capacity_after=float(settings.NO_CAPACITY_AFTER_SECONDS),
        stuck_after=float(settings.STUCK_AFTER_SECONDS),
    )


def supervise(*, name: str = "supervisor", tombstones: Iterable[Mapping[str, Any]] = ()) -> CycleReport:
    """One cycle (see the module docstring). `tombstones` are pods a watch saw deleted since the last cycle,
    with their last state: they join the executions' memory, so their evidence is not lost."""
    started = time.monotonic()
    interval = float(settings.SUPERVISOR_INTERVAL_SECONDS)
    if not _lease(name, max(interval * 3, 30.0)):
        return CycleReport(ran=False)
    report = CycleReport()
    try:
        _cycle(report, tombstones)
    except Exception as exc:  # recorded for the dashboard, then raised for the task's log
        report.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        report.duration_ms = int((time.monotonic() - started) * 1000)
        _release(name, report)
    return report


def _cycle(report: CycleReport, tombstones: Iterable[Mapping[str, Any]]) -> None:
    site = SiteSettings.load()
    domain = site.label_domain
    report.retries_started = _start_due_retries()
    executions = list(
        Execution.objects.select_related("job")
        .filter(state__in=SUPERVISED, submitted_at__isnull=False, job__state__in=SUPERVISED)
        .order_by("pk")
    )
    executions = [e for e in executions if e.job.current_attempt == e.attempt]
    report.executions = len(executions)
    if not executions:
        return
    before = gateway.requests_made.total
    try:
        observed = gateway.list_supervised(f"{domain}/job")
    except ClusterError as exc:
        report.api_requests = gateway.requests_made.total - before
        report.error = str(exc)
        report.transitions = sum(_mark_unknown(e, str(exc)) for e in executions)
        return
    report.api_requests = gateway.requests_made.total - before

    watched = [
        Watched(
            key=(e.job_id, e.attempt),
            namespace=e.job.namespace,
            trainjob_name=e.trainjob_name,
            memory=dict(e.pods_seen or {}),
            identity_warned=bool(e.job.identity_warnings),
        )
        for e in executions
    ]
    statuses = derive_all(
        observed, watched, domain=domain, now=timezone.now(), thresholds=_thresholds(), tombstones=tombstones
    )
    for execution in executions:
        status = statuses[(execution.job_id, execution.attempt)]
        digest = _digest(status)
        if _nothing_new(status, digest, execution, execution.job.state):
            continue  # checked again under the locks; most executions, most cycles: no lock, no write
        if apply_status(execution_id=execution.pk, status=status, digest=digest):
            report.transitions += 1


@dataclass(frozen=True)
class Watched:
    """What a cycle knows of one execution before it reads the cluster."""

    key: tuple[str, int]  # (job id, attempt)
    namespace: str
    trainjob_name: str
    memory: dict[str, Any]  # pods seen by earlier cycles (Execution.pods_seen)
    identity_warned: bool


def derive_all(
    observed: gateway.Observed,
    watched: list[Watched],
    *,
    domain: str,
    now: datetime,
    thresholds: Thresholds,
    tombstones: Iterable[Mapping[str, Any]] = (),
) -> dict[tuple[str, int], DerivedStatus]:
    """Every watched execution's status from one cycle's reads. Pure; linear in the objects read.

    The cyclic garbage collector is paused meanwhile: the derivation allocates many small objects (and
    makes no reference cycles), and each collection it would trigger walks every object the cycle read, so
    with 5,000 executions about a fifth of the time went to collections that free nothing."""
    with _no_cyclic_gc():
        return _derive_all(
            observed, watched, domain=domain, now=now, thresholds=thresholds, tombstones=tombstones
        )


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _derive_all(
    observed: gateway.Observed,
    watched: list[Watched],
    *,
    domain: str,
    now: datetime,
    thresholds: Thresholds,
    tombstones: Iterable[Mapping[str, Any]],
) -> dict[tuple[str, int], DerivedStatus]:
    keys = {w.key for w in watched}
    names = {f"{w.namespace}/{w.trainjob_name}": w.key for w in watched}
    grouped = group_objects(observed, domain, keys, names)
    nodes = {str((n.get("metadata") or {}).get("name", "")): n for n in observed.nodes}
    dead: dict[tuple[str, int], dict[str, Any]] = {}
    for pod in tombstones:
        key = _execution_key(pod, domain)
        if key in grouped:
            condensed = condense_pod(pod, domain)
            dead.setdefault(key, {})[condensed["uid"]] = condensed
    statuses = {}
    for item in watched:
        objects = grouped[item.key]
        memory = dict(item.memory)
        for uid, pod in dead.get(item.key, {}).items():
            # A watched deletion carries the pod's last state (its DisruptionTarget): it wins over what
            # earlier cycles saw, even when a cycle already found the pod gone (it vanished between two
            # reads, so that cycle remembered it without the condition); only when it was found gone is kept.
            memory[uid] = {**pod, "gone": (memory.get(uid) or {}).get("gone")}
        objects = objects + _nodes_for(objects, memory, nodes)
        ctx = Context(
            now=now,
            label_domain=domain,
            attempt=item.key[1],
            identity_warned=item.identity_warned,
            thresholds=thresholds,
        )
        statuses[item.key] = derive(objects, ctx, memory)
    return statuses


def _digest(status: DerivedStatus) -> str:
    data = {
        "state": status.state,
        "cause": status.cause,
        "rank": status.rank,
        "exit_code": status.exit_code,
        "message": status.message,
        "evidence": status.evidence,
        "queued_reason": status.queued_reason,
        "identity_findings": status.identity_findings,
        "ranks": status.ranks,
        "restart_attempt": status.restart_attempt,
        "pods": status.pods,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _nothing_new(status: DerivedStatus, digest: str, execution: Execution, job_state: str) -> bool:
    """The same state, and the same observation as last written (a job read `unknown` always changes)."""
    return (
        status.state == execution.state
        and job_state != JobState.UNKNOWN
        and digest == execution.observed_digest
    )


def _event(job_id: str, attempt: int | None, kind: str, message: str, **fields: Any) -> None:
    details = fields.pop("details", {})
    JobEvent.objects.create(
        job_id=job_id, attempt=attempt, kind=kind, message=message, details=details, **fields
    )


def apply_status(*, execution_id: int, status: DerivedStatus, digest: str = "") -> bool:
    """Write one execution's derived status; True when its state changed. Compare-and-set under row locks
    (job, then execution: the order every writer uses), so a second supervisor with the same observation
    finds nothing left to do."""
    now = timezone.now()
    digest = digest or _digest(status)
    with transaction.atomic():
        execution = Execution.objects.filter(pk=execution_id).only("job_id").first()
        if execution is None:
            return False
        job = Job.objects.select_for_update().filter(pk=execution.job_id).first()
        execution = Execution.objects.select_for_update().filter(pk=execution_id).first()
        if job is None or execution is None:
            return False
        if job.state not in SUPERVISED or execution.state not in SUPERVISED:
            return False  # cancelled, or already finished by another supervisor
        if job.current_attempt != execution.attempt:
            return False
        if _nothing_new(status, digest, execution, job.state):
            return False
        changed = status.state != execution.state or job.state == JobState.UNKNOWN
        old_state = execution.state
        fields: dict[str, Any] = {
            "state": status.state,
            "cause": status.cause or "",
            "message": status.message,
            "rank": status.rank,
            "exit_code": status.exit_code,
            "evidence": status.evidence,
            "queued_reason": status.queued_reason,
            "identity_findings": status.identity_findings,
            "ranks": status.ranks,
            "pods_seen": status.pods,
            "restart_attempt": status.restart_attempt,
            "observed_at": now,
            "observed_digest": digest,
        }
        if status.state == JobState.RUNNING and execution.started_at is None:
            fields["started_at"] = now
        if status.terminal:
            fields["finished_at"] = now
        Execution.objects.filter(pk=execution.pk).update(**fields)

        job_fields: dict[str, Any] = {
            "cause": status.cause or "",
            "message": status.message,
            "evidence": status.evidence,
            "failing_rank": status.rank,
            "exit_code": status.exit_code,
            "queued_reason": status.queued_reason,
            "identity_findings": status.identity_findings,
            "last_known_state": "",
            "unknown_since": None,
            "updated_at": now,
        }
        if not changed:
            Job.objects.filter(pk=job.pk).update(**job_fields)
            return False

        from_state = job.state if job.state == JobState.UNKNOWN else old_state
        decision = None
        if status.state == JobState.FAILED:
            earlier = list(
                Execution.objects.filter(job_id=job.pk, attempt__lt=execution.attempt).values_list(
                    "cause", flat=True
                )
            )
            policy = job.recovery_policy or recovery.resolve(None, (job.spec or {}).get("recovery_policy"))
            decision = recovery.decide(policy, earlier, status.cause or "")
        _event(
            job.pk,
            execution.attempt,
            "transition",
            status.message or f"{from_state} → {status.state}",
            from_state=from_state,
            to_state=status.state,
            cause=status.cause or "",
            details={"evidence": status.evidence, "queued_reason": status.queued_reason},
        )
        if decision is not None and decision.retry:
            until = now + timedelta(seconds=decision.backoff_seconds)
            message = (
                f"attempt {execution.attempt} failed ({status.cause}: {status.message}); attempt "
                f"{execution.attempt + 1} starts after {decision.backoff_seconds} s ({decision.why})"
            )
            job_fields.update(
                state=JobState.PENDING,
                state_changed_at=now,
                message=message,
                queued_reason={
                    "reason": RETRY_BACKOFF,
                    "message": message,
                    "since": now.isoformat(),
                    "until": until.isoformat(),
                    "cause": status.cause,
                },
            )
            Job.objects.filter(pk=job.pk).update(**job_fields)
            _event(
                job.pk,
                execution.attempt,
                "retry",
                message,
                from_state=status.state,
                to_state=JobState.PENDING,
                cause=status.cause or "",
                details={"backoff_seconds": decision.backoff_seconds, "why": decision.why},
            )
            _request_delete(execution_id, now)
            return True
        job_fields.update(state=status.state, state_changed_at=now)
        if decision is not None:
            job_fields["message"] = (
                f"{status.message} (not retried: {decision.why})" if status.message else ""
            )
        Job.objects.filter(pk=job.pk).update(**job_fields)
        if status.stop:
            # dispatch ended it (a waiting cause ran out, the promise broke, the runtime is gone): stop it.
            _request_delete(execution_id, now)
    return True


def _mark_unknown(execution: Execution, error: str) -> int:
    """The cluster could not be read: the job is `unknown`, keeping its last known state and since when."""
    now = timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=execution.job_id).first()
        if job is None or job.state not in (JobState.QUEUED, JobState.RUNNING):
            return 0
        Job.objects.filter(pk=job.pk).update(
            state=JobState.UNKNOWN,
            last_known_state=job.state,
            unknown_since=now,
            state_changed_at=now,
            updated_at=now,
            message=f"the cluster could not be read: {error}",
        )
        _event(
            job.pk,
            execution.attempt,
            "transition",
            f"the cluster could not be read: {error}",
            from_state=job.state,
            to_state=JobState.UNKNOWN,
        )
    return 1


def _start_due_retries() -> int:
    """Jobs whose retry backoff ran out get their next execution (A+1), started by the submit task."""
    now = timezone.now()
    started = 0
    waiting = Job.objects.filter(state=JobState.PENDING, queued_reason__reason=RETRY_BACKOFF)
    for job in waiting:
        until = datetime.fromisoformat(str(job.queued_reason.get("until")))
        if until > now:
            continue
        attempt = job.current_attempt + 1
        with transaction.atomic():
            moved = Job.objects.filter(
                pk=job.pk,
                state=JobState.PENDING,
                current_attempt=job.current_attempt,
                queued_reason__reason=RETRY_BACKOFF,
            ).update(current_attempt=attempt, queued_reason={}, updated_at=now)
            if not moved:
                continue  # another supervisor started it
            execution = Execution.objects.create(
                job=job, attempt=attempt, trainjob_name=trainjob_name(job.pk, attempt)
            )
            _event(job.pk, attempt, "attempt", f"starting attempt {attempt}")
            transaction.on_commit(_submit_on_commit(execution.pk), robust=True)
        started += 1
    return started


def _request_delete(execution_id: int, now: datetime) -> None:
    """Remove the attempt's objects: recorded first, so the stale sweep redoes it if the message is lost."""
    Execution.objects.filter(pk=execution_id).update(delete_requested_at=now, objects_removed_at=None)
    transaction.on_commit(lambda: _enqueue_delete(execution_id), robust=True)


def _submit_on_commit(execution_id: int) -> Callable[[], None]:
    # A named function, not functools.partial: Django's robust on_commit logs a failing callback by its
    # __qualname__, which a partial lacks.
    def submit() -> None:
        _enqueue_submit(execution_id)

    return submit


def _enqueue_submit(execution_id: int) -> None:
    from jobs.tasks import execution_submit

    execution_submit.delay(execution_id)


def _enqueue_delete(execution_id: int) -> None:
    from jobs.tasks import execution_delete

    execution_delete.delay(execution_id)
