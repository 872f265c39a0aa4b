"""One supervision cycle: bring every active execution up to date with the cluster.

The cycle reads the cluster with a few label-selected list calls however many jobs there are
(cluster.gateway.list_supervised), groups the objects per execution, derives each execution's status with the
pure jobs.supervision.status.derive, and hands what changed to jobs.supervision.apply. A cycle holds a lease
(SupervisorCycle), so overlapping cycles skip instead of racing."""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from cluster import gateway
from cluster.errors import ClusterError
from dispatch_site import metrics
from jobs.models import Execution, SupervisorCycle
from jobs.naming import trainjob_name_prefix
from jobs.supervision.apply import (
    SUPERVISED,
    _digest,
    _mark_unknown,
    _nothing_new,
    _start_due_retries,
    apply_status,
)
from jobs.supervision.status import Context, DerivedStatus, condense_pod, derive
from jobs.waits import Thresholds
from runtimes.models import SiteSettings

logger = logging.getLogger(__name__)


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
        metrics.SUPERVISOR_CYCLE.observe(report.duration_ms / 1000)
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
