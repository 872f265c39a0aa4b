"""One supervision cycle: bring the active executions up to date with the cluster.

A cycle takes the executions a Source says are due, reads what the Source observed of their namespaces, keeps
each execution's own objects (its TrainJob's owner chain: jobs.supervision.grouping), reads the Nodes its pods
need, derives each status with the pure jobs.supervision.status.derive, and hands what changed to
jobs.supervision.apply. Two Sources:

- ListSource (the beat's task, and `manage.py supervise --no-watch`): every active execution, read with plain
  list calls namespace by namespace (one per kind and label domain, plus the namespace's Events);
- jobs.supervision.cache.CacheSource (`manage.py supervise`): informers keep a copy of each namespace that has
  active executions, and a cycle derives only the executions whose objects changed (or whose waiting
  threshold may have run out); a quiet cycle makes no API call at all.

A read that fails (a 403 on one kind, a CRD version the server does not serve) is named: the executions of
that namespace go `unknown` when their TrainJobs, JobSets, Jobs or Pods could not be read, and are derived
without Events (saying so) when only the Events could not be.

A cycle holds a lease (SupervisorCycle), renewed by a thread while the cycle runs, so overlapping cycles skip
instead of racing; every write is compare-and-set anyway, so a cycle that lost its lease does no harm."""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from django.db import connection
from django.db.models import F, Q
from django.utils import timezone

from cluster import gateway
from cluster.errors import ClusterError
from dispatch_site import metrics
from dispatch_site.causes import Cause
from jobs.models import Execution, PodTombstone, SupervisorCycle
from jobs.supervision.apply import (
    SUPERVISED,
    _digest,
    _mark_unknown,
    _nothing_new,
    apply_status,
    consume_tombstones,
)
from jobs.supervision.clock import observation_time
from jobs.supervision.grouping import (
    EVENT,
    JOB,
    JOBSET,
    POD,
    TRAINJOB,
    WORKLOAD,
    Grouped,
    ObjectSource,
    StaticIndex,
    Watched,
    owned_objects,
)
from jobs.supervision.grouping import uid as object_uid
from jobs.supervision.kueue import deactivate_evicted, queue_positions
from jobs.supervision.nodes import nodes_for, read_nodes
from jobs.supervision.reads import read_namespace, read_workers, worker_failures
from jobs.supervision.retries import start_due_retries
from jobs.supervision.status import (
    TRAINJOB_GONE,
    Context,
    DerivedStatus,
    condense_pod,
    derive,
    with_tombstone,
)
from jobs.waits import Thresholds
from runtimes.models import SiteSettings

logger = logging.getLogger(__name__)

__all__ = ["CycleReport", "ListSource", "Observation", "Watched", "derive_all", "supervise"]

# Kinds without which an execution cannot be judged (its state would be made up): it goes `unknown`.
REQUIRED_READS = (TRAINJOB, JOBSET, JOB, POD)


def holder() -> str:
    """Who holds a lease: host, process and thread (a host name may be long: SupervisorCycle.lease_holder)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


@dataclass
class CycleReport:
    ran: bool = True
    executions: int = 0  # active executions the source knows
    derived: int = 0  # executions derived this cycle
    transitions: int = 0
    api_requests: int = 0
    lists: int = 0
    gets: int = 0
    bytes_received: int = 0
    retries_started: int = 0
    error: str = ""
    duration_ms: int = 0
    cpu_ms: float = 0.0  # CPU time of the thread that ran the cycle
    prepare_cpu_ms: float = 0.0  # the supervisor's tracking before the cycle (jobs.supervision.watch)
    phases_ms: dict[str, float] = field(default_factory=dict)  # wall time per step of the cycle
    resynced: bool = False  # that tracking read the whole active set this time (every RESYNC_SECONDS)


# ---------------------------------------------------------------- the lease


def _lease_seconds() -> float:
    return float(getattr(settings, "SUPERVISOR_LEASE_SECONDS", 30))


def _lease(name: str, who: str, seconds: float) -> bool:
    """Take the cycle lease for `name` (compare-and-set on its row); False when another holder has it."""
    now = timezone.now()
    SupervisorCycle.objects.get_or_create(name=name)
    taken = (
        SupervisorCycle.objects.filter(name=name)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_holder=who))
        .update(lease_holder=who, lease_until=now + timedelta(seconds=seconds), started_at=now)
    )
    return taken == 1


def _renew(name: str, who: str, seconds: float) -> bool:
    now = timezone.now()
    return (
        SupervisorCycle.objects.filter(name=name, lease_holder=who).update(
            lease_until=now + timedelta(seconds=seconds)
        )
        == 1
    )


def _release(name: str, who: str, report: CycleReport) -> None:
    SupervisorCycle.objects.filter(name=name, lease_holder=who).update(
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


class LeaseKeeper:
    """Renews the lease every third of its length while a cycle runs (on a connection of its own), so a long
    cycle keeps it; `lost` is set if a renewal finds another holder (the cycle then stops writing)."""

    def __init__(self, name: str, who: str, seconds: float) -> None:
        self.name, self.who, self.seconds = name, who, seconds
        self.lost = threading.Event()
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease {name}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.seconds / 3):
                try:
                    if not _renew(self.name, self.who, self.seconds):
                        self.lost.set()
                        return
                    self.renewals += 1
                except Exception:
                    logger.exception("supervision: could not renew the cycle lease")
        finally:
            connection.close()


# ---------------------------------------------------------------- what a cycle observes


@dataclass
class Observation:
    source: ObjectSource
    # The reads began no earlier than this, on the database's clock (an older observation never overwrites
    # it: jobs.supervision.clock).
    read_at: datetime
    errors: dict[str, dict[str, str]] = field(default_factory=dict)  # namespace -> kind -> what failed
    waiting: set[str] = field(default_factory=set)  # namespaces not read yet (informers still listing)
    # MultiKueue: what each worker holds for the executions admitted there, and the reads that failed on a
    # worker, per (worker, namespace) (jobs.supervision.workers).
    workers: dict[str, ObjectSource] = field(default_factory=dict)
    worker_errors: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)


class Source(Protocol):
    def due(self) -> list[Execution]: ...

    def active(self) -> int: ...

    def observe(self, executions: Sequence[Execution]) -> Observation: ...

    def flush(self) -> None: ...

    def derived(self, execution: Execution, status: DerivedStatus | None, supervised: bool) -> None: ...


def _active_executions() -> list[Execution]:
    executions = list(
        Execution.objects.select_related("job")
        .filter(state__in=SUPERVISED, submitted_at__isnull=False, job__state__in=SUPERVISED)
        .order_by("pk")
    )
    return [e for e in executions if e.job.current_attempt == e.attempt]


def domain_of(execution: Execution, site_domain: str) -> str:
    """The label domain the execution's objects carry: stored with the job ("" on rows from before)."""
    return execution.job.label_domain or site_domain


class ListSource:
    """Plain list reads, namespace by namespace: every active execution every cycle (the beat's cycle)."""

    def __init__(self) -> None:
        self._site_domain = ""
        self._count = 0

    def due(self) -> list[Execution]:
        self._site_domain = SiteSettings.load().label_domain
        executions = _active_executions()
        self._count = len(executions)
        return executions

    def active(self) -> int:
        return self._count

    def observe(self, executions: Sequence[Execution]) -> Observation:
        read_at = observation_time()
        domains: dict[str, set[str]] = {}
        for execution in executions:
            domains.setdefault(execution.job.namespace, set()).add(domain_of(execution, self._site_domain))
        objects: list[dict[str, Any]] = []
        errors: dict[str, dict[str, str]] = {}
        for namespace, wanted in sorted(domains.items()):
            found, failed = read_namespace(namespace, sorted(wanted))
            objects.extend(found)
            if failed:
                errors[namespace] = failed
        every_domain = {d for wanted in domains.values() for d in wanted}
        workers, worker_errors = read_workers(executions, domain_of=lambda e: domain_of(e, self._site_domain))
        return Observation(
            source=StaticIndex(objects, every_domain),
            read_at=read_at,
            errors=errors,
            workers=workers,
            worker_errors=worker_errors,
        )

    def flush(self) -> None:
        return None

    def derived(self, execution: Execution, status: DerivedStatus | None, supervised: bool) -> None:
        return None


# ---------------------------------------------------------------- the cycle


def _thresholds() -> Thresholds:
    return Thresholds(
        no_capacity_after=float(settings.NO_CAPACITY_AFTER_SECONDS),
        stuck_after=float(settings.STUCK_AFTER_SECONDS),
        inadmissible_after=float(settings.INADMISSIBLE_AFTER_SECONDS),
    )


def supervise(*, name: str = "supervisor", source: Source | None = None) -> CycleReport:
    """One cycle (see the module docstring); ran=False when another holder has the lease."""
    started = time.monotonic()
    cpu_started = time.thread_time()
    who = holder()
    seconds = _lease_seconds()
    if not _lease(name, who, seconds):
        return CycleReport(ran=False)
    report = CycleReport()
    before_requests = gateway.requests_made.total
    before = gateway.traffic.snapshot()
    try:
        with LeaseKeeper(name, who, seconds) as keeper:
            _cycle(report, source or ListSource(), keeper)
    except Exception as exc:  # recorded for the dashboard, then raised for the task's log
        report.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        after = gateway.traffic.snapshot()
        report.api_requests = gateway.requests_made.total - before_requests
        report.lists = after["lists"] - before["lists"]
        report.gets = after["gets"] - before["gets"]
        report.bytes_received = after["bytes_received"] - before["bytes_received"]
        report.duration_ms = int((time.monotonic() - started) * 1000)
        report.cpu_ms = (time.thread_time() - cpu_started) * 1000
        metrics.SUPERVISOR_CYCLE.observe(report.duration_ms / 1000)
        _release(name, who, report)
    return report


class _Phases:
    def __init__(self, report: CycleReport) -> None:
        self._report = report
        self._at = time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self._report.phases_ms[name] = round((now - self._at) * 1000, 2)
        self._at = now


def _cycle(report: CycleReport, source: Source, keeper: LeaseKeeper) -> None:
    phase = _Phases(report)
    report.retries_started = start_due_retries()
    phase("retries")
    executions = source.due()
    report.executions = source.active()
    phase("due")
    if not executions:
        return
    observation = source.observe(executions)
    phase("observe")
    failures = sorted({m for failed in observation.errors.values() for m in failed.values()})
    if failures:
        report.error = f"{len(failures)} read(s) failed: " + "; ".join(failures)
    site_domain = SiteSettings.load().label_domain
    judged: list[Execution] = []
    worker_unread: dict[tuple[str, int], str] = {}
    for execution in executions:
        namespace = execution.job.namespace
        if namespace in observation.waiting:
            continue
        failed = observation.errors.get(namespace, {})
        required = [failed[kind] for kind in REQUIRED_READS if kind in failed]
        if on_worker := worker_failures(execution, observation.worker_errors):
            # Its worker cannot be read: judged on the manager's TrainJob and Workload alone, which can only
            # end it there (the worker lost past workerLostTimeout, or another eviction); else unknown.
            worker_unread[(execution.job_id, execution.attempt)] = "; ".join(on_worker)
        if required:
            if keeper.lost.is_set():
                return
            message = "; ".join(required)
            report.transitions += _mark_unknown(execution, message, observation.read_at)
            source.derived(execution, None, True)
            continue
        judged.append(execution)
    watched = [
        Watched(
            key=(e.job_id, e.attempt),
            namespace=e.job.namespace,
            trainjob_name=e.trainjob_name,
            memory=dict(e.pods_seen or {}),
            identity_warned=bool(e.job.identity_warnings),
            domain=domain_of(e, site_domain),
            ran=e.started_at is not None,
            trainjob_uid=e.trainjob_uid,
            cluster=e.cluster,
        )
        for e in judged
    ]
    phase("unknown")
    with _no_cyclic_gc():
        groups = {
            w.key: owned_objects(
                observation.source,
                w,
                worker=_worker_of(observation, w, worker_unread),
            )
            for w in watched
        }
    phase("group")
    # The tombstones after the copy was read: a pod missing from it was already kept as one (the watch
    # records the tombstone before the pod leaves its copy).
    source.flush()
    tombstones = _tombstones([e.pk for e in judged])
    dead = {w.key: [pod for _, pod in tombstones.get(e.pk, [])] for w, e in zip(watched, judged, strict=True)}
    for item in watched:
        # A pod on a MultiKueue worker has its Events there, not on the manager.
        where = _worker_of(observation, item, worker_unread) or observation.source
        _add_events_of(groups[item.key], where, item, _uids(dead[item.key]))
    phase("tombstones")
    nodes, unread, node_errors = read_nodes(groups, watched, dead)
    phase("nodes")
    statuses = derive_grouped(
        groups,
        watched,
        nodes=nodes,
        unread_nodes=unread,
        now=timezone.now(),
        thresholds=_thresholds(),
        tombstones=dead,
    )
    report.derived = len(statuses)
    phase("derive")
    unconfirmed = _gone_unconfirmed(statuses, watched)
    queue_positions(statuses)
    acted, deactivation_errors = deactivate_evicted(statuses)
    if deactivation_errors:
        report.error = "; ".join(filter(None, [report.error, *deactivation_errors]))
    phase("kueue")
    # State changes first: when many executions changed at once, a failure is written before memory updates.
    order = sorted(
        zip(judged, watched, strict=True), key=lambda pair: statuses[pair[1].key].state == pair[0].state
    )
    for execution, item in order:
        status = statuses[item.key]
        if item.key in worker_unread and not (status.deactivate or status.cause == Cause.CLUSTER_LOST):
            if keeper.lost.is_set():
                return
            report.transitions += _mark_unknown(execution, worker_unread[item.key], observation.read_at)
            source.derived(execution, None, True)
            continue
        if item.key not in acted or item.key in unconfirmed:
            # Its Workload could not be deactivated, or its TrainJob is missing from the copy but the API
            # server still has it (or could not say): next cycle.
            source.derived(execution, None, True)
            continue
        failed = observation.errors.get(execution.job.namespace, {})
        if WORKLOAD in failed:
            status.warnings.append(
                {
                    "kind": "read",
                    "object": f"Workloads in {execution.job.namespace}",
                    "message": f"{failed[WORKLOAD]}: the status was derived without Kueue's Workloads",
                }
            )
        if EVENT in failed:
            status.warnings.append(
                {
                    "kind": "read",
                    "object": f"Events in {execution.job.namespace}",
                    "message": f"{failed[EVENT]}: the status was derived without Events",
                }
            )
        status.warnings.extend(node_errors.get(item.key, []))
        used = [pk for pk, _ in tombstones.get(execution.pk, [])]
        digest = _digest(status)
        if _nothing_new(status, digest, execution, execution.job.state):
            consume_tombstones(used)  # the memory already holds what they said
            source.derived(execution, status, True)
            continue  # checked again under the locks; most executions, most cycles: no lock, no write
        if keeper.lost.is_set():
            return  # another holder runs cycles now: leave the writing to it
        applied = apply_status(
            execution_id=execution.pk,
            status=status,
            digest=digest,
            observed_at=observation.read_at,
            tombstone_ids=used,
            job_id=execution.job_id,
        )
        report.transitions += int(applied.changed)
        # A refused status was not judged: derived again next cycle, even if nothing it watches changes.
        source.derived(execution, None if applied.refused else status, applied.supervised)
    phase("apply")


def _gone_unconfirmed(
    statuses: Mapping[tuple[str, int], DerivedStatus], watched: Sequence[Watched]
) -> set[tuple[str, int]]:
    """Executions whose TrainJob the objects read do not hold, but which the API server still has (or
    could not say): not ended for it this cycle. The watch delivers a TrainJob some milliseconds after its
    create, and a start records the TrainJob as soon as its create answers, so a cycle can read the recorded
    start before the watch brings its TrainJob (seen: 3 of 1,000 jobs of the supervision bench ended as
    "deleted outside dispatch" within 140 ms of their start). One GET, for such executions only: a TrainJob
    the API server does not have either is gone, and so is one it has under the name with another UID than
    the start recorded (deleted outside dispatch and made again by somebody else: grouping took it for a
    stranger's, and waiting would never see the job's own come back)."""
    unconfirmed: set[tuple[str, int]] = set()
    for item in watched:
        if statuses[item.key].message != TRAINJOB_GONE:
            continue
        try:
            found = gateway.get_namespaced("TrainJob", item.namespace, item.trainjob_name)
        except ClusterError as exc:
            logger.warning(
                "could not confirm that TrainJob %s/%s is gone: %s", item.namespace, item.trainjob_name, exc
            )
            unconfirmed.add(item.key)
            continue
        if found is not None and item.trainjob_uid and object_uid(found) != item.trainjob_uid:
            logger.info(
                "TrainJob %s/%s has UID %s, not %s: the execution's is gone",
                item.namespace,
                item.trainjob_name,
                object_uid(found),
                item.trainjob_uid,
            )
            continue
        if found is not None:
            logger.info("TrainJob %s/%s is not in the watch's copy yet", item.namespace, item.trainjob_name)
            unconfirmed.add(item.key)
    return unconfirmed


def _worker_of(
    observation: Observation, item: Watched, worker_unread: Mapping[tuple[str, int], str]
) -> ObjectSource | None:
    """What was read on the MultiKueue worker the execution runs on; None when it runs where dispatch
    submitted it, or its worker could not be read this cycle."""
    if not item.cluster or item.key in worker_unread:
        return None
    return observation.workers.get(item.cluster)


def _add_events_of(grouped: Grouped, source: ObjectSource, item: Watched, uids: Iterable[str]) -> None:
    """The Events about tombstoned pods the memory did not hold yet (owned_objects found those it held)."""
    events = [o for o in grouped.objects if o.get("kind") == EVENT]
    have = {str((o.get("metadata") or {}).get("uid") or "") for o in events}
    for uid in uids:
        if not uid or uid in item.memory:
            continue
        for event in source.events_about(item.namespace, uid):
            event_uid = str((event.get("metadata") or {}).get("uid") or "")
            if event_uid not in have:
                have.add(event_uid)
                grouped.objects.append(event)


def _uids(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    return [str((p.get("metadata") or {}).get("uid") or "") for p in pods]


def _tombstones(execution_ids: list[int]) -> dict[int, list[tuple[int, dict[str, Any]]]]:
    found: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    if not execution_ids:
        return found
    rows = PodTombstone.objects.filter(execution_id__in=execution_ids).order_by("pk")
    for pk, execution_id, pod in rows.values_list("pk", "execution_id", "pod"):
        found.setdefault(execution_id, []).append((pk, pod))
    return found


def derive_all(
    source: ObjectSource,
    watched: list[Watched],
    *,
    now: datetime,
    thresholds: Thresholds,
    tombstones: Mapping[tuple[str, int], Sequence[Mapping[str, Any]]] | None = None,
    nodes: Iterable[Mapping[str, Any]] = (),
) -> dict[tuple[str, int], DerivedStatus]:
    """Every watched execution's status from what `source` observed: its owner chain, then derive. Pure."""
    dead = tombstones or {}
    with _no_cyclic_gc():
        groups = {w.key: owned_objects(source, w, also_about=_uids(dead.get(w.key, []))) for w in watched}
    by_name = {str((n.get("metadata") or {}).get("name", "")): dict(n) for n in nodes}
    return derive_grouped(
        groups, watched, nodes={"": by_name}, now=now, thresholds=thresholds, tombstones=dead
    )


def derive_grouped(
    groups: Mapping[tuple[str, int], Grouped],
    watched: list[Watched],
    *,
    nodes: Mapping[str, Mapping[str, Mapping[str, Any]]],
    now: datetime,
    thresholds: Thresholds,
    tombstones: Mapping[tuple[str, int], Sequence[Mapping[str, Any]]],
    unread_nodes: frozenset[str] = frozenset(),
) -> dict[tuple[str, int], DerivedStatus]:
    """Each execution's status from its grouped objects (`nodes`: by cluster, "" here, then by name: a pod on
    a MultiKueue worker ran on that worker's node). Pure; linear in the objects.

    The cyclic garbage collector is paused meanwhile: the derivation allocates many small objects (and
    makes no reference cycles), and each collection it would trigger walks every object the cycle read, so
    with 5,000 executions about a fifth of the time went to collections that free nothing."""
    with _no_cyclic_gc():
        statuses = {}
        for item in watched:
            grouped = groups[item.key]
            memory = _with_tombstones(item, tombstones.get(item.key, ()), grouped)
            objects = grouped.objects + nodes_for(grouped.objects, memory, nodes.get(item.cluster, {}))
            ctx = Context(
                now=now,
                label_domain=item.domain,
                attempt=item.key[1],
                identity_warned=item.identity_warned,
                thresholds=thresholds,
                ran=item.ran,
                unread_nodes=unread_nodes,
            )
            status = derive(objects, ctx, memory)
            status.warnings = grouped.warning_list() + status.warnings  # the derivation's own last
            statuses[item.key] = status
        return statuses


def _with_tombstones(item: Watched, dead: Iterable[Mapping[str, Any]], grouped: Grouped) -> dict[str, Any]:
    """The execution's memory with the pods a watch saw deleted. A watched deletion carries the pod's last
    state (its DisruptionTarget): it wins over what earlier cycles saw, even when a cycle already found the
    pod gone (it vanished between two reads, so that cycle remembered it without the condition); when it was
    found gone is kept; a late, older delivery takes nothing back (status.with_tombstone). A tombstone counts
    only for a pod of this execution: one the memory holds, or one whose Job is in the chain."""
    memory = dict(item.memory)
    for pod in dead:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        owners = {str(r.get("uid")) for r in meta.get("ownerReferences") or () if r.get("uid")}
        if uid not in memory and not owners & grouped.job_uids:
            continue
        condensed = condense_pod(pod, item.domain)
        memory[condensed["uid"]] = with_tombstone(memory.get(condensed["uid"]), condensed)
    return memory


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()
