"""The supervisor's informer cache (`manage.py supervise`): a copy of the namespaces with active executions,
kept by watches, and the Source a cycle derives from (jobs.supervision.cycle).

Per namespace that has active executions: one informer (cluster.informer) per supervised kind (TrainJob,
JobSet, Job, Pod) and label domain of its jobs (selected by `<domain>/job`), and one for the namespace's
Events (only those about objects named like dispatch's are kept). Never a cluster-wide list or watch; Nodes
are read by name when a pod's fate depends on its node (jobs.supervision.nodes). A Kueue Workload is one more
Resource and informer, keyed like the rest.

What a change does: an object of a tracked execution changed, so that execution is due; a pod of one was
deleted, so its last state is kept as a tombstone (PodTombstone, written before the next cycle reads the
copy). A quiet cycle derives nothing and makes no API call. Executions are tracked from the database
incrementally: new rows (a higher pk) and rows not yet submitted are read each cycle, the whole active set
every RESYNC_SECONDS. A finished execution leaves the cache: it is untracked, its objects are dropped (and
kept out on a re-list), and a namespace without active executions stops being watched. What is kept of each
object, trimmed, is jobs.supervision.trim. Under MultiKueue, the JobSets, Jobs, pods and Events of an
execution admitted to a worker are watched on that worker (jobs.supervision.worker_watch); its TrainJob and
Workload here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from cluster import gateway, kueue
from cluster.informer import DELETED, Informer
from jobs.models import Execution, JobState, PodTombstone
from jobs.supervision.apply import SUPERVISED
from jobs.supervision.clock import observation_time
from jobs.supervision.cycle import Observation, domain_of
from jobs.supervision.grouping import EVENT, WORKLOAD, label_key, owner_uids
from jobs.supervision.reads import is_dispatch_event
from jobs.supervision.status import DerivedStatus
from jobs.supervision.tombstones import TOMBSTONE_STATES, keep_tombstones
from jobs.supervision.trim import (
    Key,
    event_prefix,
    key_of_trainjob_name,
    trim_workload,
    workload_key,
)
from jobs.supervision.worker_watch import Watches, WorkerWatches, purge, unique, watch_kinds
from runtimes.models import SiteSettings

logger = logging.getLogger(__name__)

RESYNC_SECONDS = 60.0
FINISHED_FORGET_SECONDS = 3600.0


# ---------------------------------------------------------------- tracking executions


@dataclass(frozen=True)
class Tracked:
    pk: int
    key: Key
    namespace: str
    trainjob_name: str
    domain: str
    queued: bool = False  # its plan names a Kueue queue: its namespace's Workloads are always watched
    cluster: str = ""  # the MultiKueue worker it was admitted to (Execution.cluster), "" while none is known


class CacheSource:
    """The Source of `manage.py supervise` (see the module docstring)."""

    def __init__(
        self,
        *,
        relist_seconds: float | None = None,
        resync_seconds: float = RESYNC_SECONDS,
        informer: Callable[..., Informer] = Informer,
    ) -> None:
        from cluster.informer import RELIST_SECONDS

        self.relist_seconds = relist_seconds or RELIST_SECONDS
        self.resync_seconds = resync_seconds
        self._informer = informer
        self._lock = threading.RLock()
        self.wake = threading.Event()
        self._tracked: dict[int, Tracked] = {}
        self._by_key: dict[Key, int] = {}
        self._per_namespace: dict[str, int] = {}  # tracked executions per namespace
        self._unsubmitted: set[int] = set()
        # Executions being started (pending): their namespace and domain are watched already, so a pod that
        # comes and goes before the start is recorded (an eviction in the first second) leaves its tombstone.
        self._starting: dict[int, Tracked] = {}
        self._starting_keys: dict[Key, int] = {}
        self._max_pk = 0
        self._resynced_at = 0.0
        self._dirty: set[Key] = set()
        self._recheck: dict[Key, datetime] = {}
        self._namespaces: dict[str, Watches] = {}
        self._dead: list[tuple[int, dict[str, Any]]] = []
        self._finished: dict[Key, float] = {}
        self._unknown: set[Key] = set()  # keys seen on objects, neither tracked nor known finished
        self._site_domain = ""
        self._kueue_served = False  # kueue.installed() as the last refresh read it
        self.resynced = False
        self.workers = WorkerWatches(self)  # the MultiKueue workers' watches (jobs.supervision.worker_watch)

    # ---------------------------------------------------------------- the Source protocol

    def active(self) -> int:
        with self._lock:
            return len(self._tracked)

    def prepare(self) -> None:
        """Before each cycle, whoever holds the lease: track new and finished executions (their namespaces'
        informers start and stop) and write the tombstones the watches collected, so none waits on a cycle
        this process may not get to run."""
        self._site_domain = SiteSettings.load().label_domain
        self.resynced = self._refresh()
        self.flush()
        self.workers.settle()
        self.workers.record()

    def due(self) -> list[Execution]:
        now = timezone.now()
        with self._lock:
            keys = self._dirty
            self._dirty = set()
            for key, when in list(self._recheck.items()):
                if when <= now:
                    keys.add(key)
                    del self._recheck[key]
            pks = [self._by_key[k] for k in keys if k in self._by_key]
        if not pks:
            return []
        rows = [
            e
            for e in Execution.objects.select_related("job").filter(
                pk__in=pks, state__in=SUPERVISED, submitted_at__isnull=False, job__state__in=SUPERVISED
            )
            if e.job.current_attempt == e.attempt
        ]
        found = {e.pk for e in rows}
        for pk in set(pks) - found:
            self._untrack(pk)
        # MultiKueue: an execution admitted to a worker is derived from that worker's watches; while they
        # are at their first list it waits (due again once they are in: WorkerWatches._synced).
        held: list[Execution] = []
        for e in rows:
            if e.cluster:
                domain = domain_of(e, self._site_domain)
                self.workers.want(e.pk, e.cluster, e.job.namespace, domain, (e.job_id, e.attempt))
                if self.workers.listing(e.cluster, e.job.namespace):
                    held.append(e)
        if held:
            with self._lock:
                self._dirty.update((e.job_id, e.attempt) for e in held)
            rows = [e for e in rows if e not in held]
        return sorted(rows, key=lambda e: e.pk)

    def observe(self, executions: Sequence[Execution]) -> Observation:
        read_at = observation_time()
        errors: dict[str, dict[str, str]] = {}
        waiting: set[str] = set()
        with self._lock:
            namespaces = {e.job.namespace: self._namespaces.get(e.job.namespace) for e in executions}
        for namespace, watched in namespaces.items():
            if watched is None:
                waiting.add(namespace)
                continue
            for (kind, _), informer in watched.informers.items():
                if informer.error:
                    errors.setdefault(namespace, {})[kind] = informer.error
                elif not informer.synced.is_set():
                    waiting.add(namespace)
        # MultiKueue: the executions admitted to a worker are derived from its watches (no list call).
        workers, worker_errors = self.workers.observe(executions)
        return Observation(
            source=self,
            read_at=read_at,
            errors=errors,
            waiting=waiting,
            workers=workers,
            worker_errors=worker_errors,
        )

    def flush(self) -> None:
        """Write the tombstones the watches collected (before a cycle reads them)."""
        with self._lock:
            dead, self._dead = self._dead, []
        if dead:
            try:
                keep_tombstones(dead)
            except Exception:
                # The database did not take them (a restart, say): they are the only record of how those pods
                # ended, so they wait for the next cycle instead of being dropped.
                with self._lock:
                    self._dead[:0] = dead
                raise

    def derived(self, execution: Execution, status: DerivedStatus | None, supervised: bool) -> None:
        key = (execution.job_id, execution.attempt)
        if not supervised:
            self._untrack(execution.pk)
            return
        if status is not None and status.cluster and execution.pk in self._tracked:
            # Just admitted to a MultiKueue worker (the Workload's clusterName): watch it there from now.
            domain = domain_of(execution, self._site_domain)
            self.workers.want(execution.pk, status.cluster, execution.job.namespace, domain, key)
        with self._lock:
            if status is None:
                self._dirty.add(key)  # not judged this time (reads failed, not ready): again next cycle
            elif status.recheck_at is not None:
                self._recheck[key] = status.recheck_at
            else:
                self._recheck.pop(key, None)

    # ---------------------------------------------------------------- the ObjectSource protocol

    def _informers(self, namespace: str, kind: str) -> list[Informer]:
        with self._lock:
            watched = self._namespaces.get(namespace)
            return watched.of(kind) if watched else []

    def named(self, kind: str, namespace: str, name: str) -> list[Mapping[str, Any]]:
        return unique(i.by_index("name", name) for i in self._informers(namespace, kind))

    def owned_by(self, kind: str, namespace: str, owner_uid: str) -> list[Mapping[str, Any]]:
        return unique(i.by_index("owner", owner_uid) for i in self._informers(namespace, kind))

    def events_about(self, namespace: str, uid: str) -> list[Mapping[str, Any]]:
        return unique(i.by_index("involved", uid) for i in self._informers(namespace, EVENT))

    def events_named(self, namespace: str, name_prefix: str) -> list[Mapping[str, Any]]:
        return unique(i.by_index("prefix", name_prefix) for i in self._informers(namespace, EVENT))

    def events_of_pod(self, namespace: str, name: str) -> list[Mapping[str, Any]]:
        return unique(i.by_index("pod", name) for i in self._informers(namespace, EVENT))

    def labelled(self, kind: str, domain: str, job_id: str, attempt: int) -> list[Mapping[str, Any]]:
        with self._lock:
            informers = [
                ns.informers[(kind, domain)]
                for ns in self._namespaces.values()
                if (kind, domain) in ns.informers
            ]
        return unique(i.by_index("job", f"{job_id}/{attempt}") for i in informers)

    # ---------------------------------------------------------------- the supervisor loop

    def due_from_database(self) -> bool:
        """Work the watches cannot announce: an execution newer than any tracked, or one of the pending ones
        now submitted (its namespace may not be watched yet). One indexed read; the supervisor asks every
        second while it waits, so a new job is followed within a second or so, not at the next periodic
        cycle."""
        with self._lock:
            pending = sorted(self._unsubmitted)
        return Execution.objects.filter(
            Q(pk__gt=self._max_pk) | Q(pk__in=pending, submitted_at__isnull=False)
        ).exists()

    def wait(self, timeout: float) -> bool:
        """Until a tracked execution's objects change (True) or `timeout` seconds pass (False)."""
        woken = self.wake.wait(timeout)
        self.wake.clear()
        return woken

    def close(self) -> None:
        with self._lock:
            namespaces, self._namespaces = self._namespaces, {}
        for watched in namespaces.values():
            watched.stop()
        self.workers.close()

    def informer_count(self) -> int:
        with self._lock:
            return sum(len(ns.informers) for ns in self._namespaces.values()) + self.workers.informer_count()

    def cached_objects(self) -> int:
        with self._lock:
            informers = [i for ns in self._namespaces.values() for i in ns.informers.values()]
        return sum(len(i) for i in informers) + self.workers.cached_objects()

    # ---------------------------------------------------------------- tracking (database -> cache)

    def _refresh(self) -> bool:
        full = time.monotonic() - self._resynced_at >= self.resync_seconds
        fields = (
            "pk",
            "job_id",
            "attempt",
            "trainjob_name",
            "state",
            "submitted_at",
            "job__state",
            "job__namespace",
            "job__label_domain",
            "job__current_attempt",
            "job__plan__queue",
            "cluster",
        )
        if full:
            rows = list(
                Execution.objects.filter(
                    Q(state__in=SUPERVISED, submitted_at__isnull=False, job__state__in=SUPERVISED)
                    | Q(state=JobState.PENDING, job__state__in=[*SUPERVISED, JobState.PENDING])
                ).values_list(*fields)
            )
        else:
            with self._lock:
                pending = sorted(self._unsubmitted)
            rows = list(
                Execution.objects.filter(Q(pk__gt=self._max_pk) | Q(pk__in=pending)).values_list(*fields)
            )
        active: set[int] = set()
        # Whether Kueue is served, asked here, outside the cache's lock (one discovery GET at most a minute);
        # a namespace where no job names a queue watches Workloads only when it is.
        self._kueue_served = kueue.installed()
        for row in rows:
            (
                pk,
                job_id,
                attempt,
                name,
                state,
                submitted,
                job_state,
                namespace,
                domain,
                current,
                queue,
                worker,
            ) = row
            domain = domain or self._site_domain
            item = Tracked(pk, (job_id, attempt), namespace, name, domain, bool(queue), worker or "")
            self._max_pk = max(self._max_pk, pk)
            if current > attempt:  # a later attempt took over
                self._unsubmitted.discard(pk)
                self._unexpect(pk)
                continue
            # (The job's current_attempt reaches an attempt when its start is recorded: a pending attempt is
            # ahead of it. Skipping those left a slow start unfollowed until the next full re-read, 60 s.)
            if (
                current == attempt
                and state in SUPERVISED
                and job_state in SUPERVISED
                and submitted is not None
            ):
                active.add(pk)
                self._unsubmitted.discard(pk)
                self._track(item)
            elif state == JobState.PENDING and job_state in (*SUPERVISED, JobState.PENDING):
                self._unsubmitted.add(pk)
                self._expect(item)
            else:
                self._unsubmitted.discard(pk)
                self._unexpect(pk)
        self._settle_unknown()
        if full:
            with self._lock:
                gone = set(self._tracked) - active
                left = set(self._starting) - self._unsubmitted
            for pk in gone:
                self._untrack(pk)
            for pk in left:
                self._unexpect(pk)
            self._resynced_at = time.monotonic()
            self._forget_finished()
            self._stop_unused()
            PodTombstone.objects.exclude(execution__state__in=TOMBSTONE_STATES).delete()
        return full

    def _settle_unknown(self) -> None:
        """Objects of executions neither tracked nor known finished (a re-list brings back what a job that
        ended long ago left in the cluster): those not active leave the copy."""
        with self._lock:
            keys, self._unknown = self._unknown, set()
            keys -= set(self._by_key)
        if not keys:
            return
        active = set(
            Execution.objects.filter(
                job_id__in={job_id for job_id, _ in keys},
                state__in=[*SUPERVISED, JobState.PENDING],
                job__state__in=[*SUPERVISED, JobState.PENDING],
            ).values_list("job_id", "attempt")
        )
        now = time.monotonic()
        ended = sorted(keys - active)
        with self._lock:
            for key in ended:
                self._finished[key] = now
            namespaces = list(self._namespaces.values())
        for watched in namespaces:
            purge(watched, ended)
        self.workers.purge(ended)

    def _expect(self, item: Tracked) -> None:
        """Watch for an execution being started (see _starting)."""
        with self._lock:
            if item.pk in self._tracked or item.pk in self._starting:
                return
            self._starting[item.pk] = item
            self._starting_keys[item.key] = item.pk
            self._per_namespace[item.namespace] = self._per_namespace.get(item.namespace, 0) + 1
            self._watch(item.namespace, item.domain, queued=item.queued)

    def _unexpect(self, pk: int) -> None:
        with self._lock:
            item = self._starting.pop(pk, None)
            if item is None:
                return
            self._starting_keys.pop(item.key, None)
            still = self._release_namespace(item.namespace)
        self.workers.release(pk)
        if not still:
            self._stop_namespace(item.namespace)

    def _track(self, item: Tracked) -> None:
        with self._lock:
            if item.pk in self._tracked:
                return
            self._tracked[item.pk] = item
            self._by_key[item.key] = item.pk
            started = self._starting.pop(item.pk, None)
            if started is not None:  # it keeps the namespace's watches it had while starting
                self._starting_keys.pop(started.key, None)
            else:
                self._per_namespace[item.namespace] = self._per_namespace.get(item.namespace, 0) + 1
            self._finished.pop(item.key, None)
            self._dirty.add(item.key)
            self._watch(item.namespace, item.domain, queued=item.queued)
            if item.cluster:  # admitted to a MultiKueue worker: its objects there are watched too
                self.workers.want(item.pk, item.cluster, item.namespace, item.domain, item.key)

    def _untrack(self, pk: int) -> None:
        with self._lock:
            item = self._tracked.pop(pk, None)
            if item is None:
                return
            self._by_key.pop(item.key, None)
            self._recheck.pop(item.key, None)
            self._dirty.discard(item.key)
            self._finished[item.key] = time.monotonic()
            watched = self._namespaces.get(item.namespace)
            still = self._release_namespace(item.namespace)
        self.workers.release(pk)
        if watched is None:
            return
        if not still:
            self._stop_namespace(item.namespace)
            return
        # The namespace stays watched for its other executions: this one's objects leave the copy.
        purge(watched, [item.key])

    def _release_namespace(self, namespace: str) -> int:
        """An execution (tracked or starting) of the namespace no longer needs its watches: how many still do.
        Under self._lock; the caller stops the namespace's informers (outside the lock) when none does."""
        still = self._per_namespace[namespace] - 1
        if still:
            self._per_namespace[namespace] = still
        else:
            del self._per_namespace[namespace]
        return still

    def _forget_finished(self) -> None:
        cutoff = time.monotonic() - FINISHED_FORGET_SECONDS
        with self._lock:
            for key, when in list(self._finished.items()):
                if when < cutoff:
                    del self._finished[key]

    def _stop_unused(self) -> None:
        """Informers of a domain no tracked execution of the namespace uses any more."""
        with self._lock:
            used = {(t.namespace, t.domain) for t in [*self._tracked.values(), *self._starting.values()]}
            stale = [
                (namespace, key)
                for namespace, watched in self._namespaces.items()
                for key in watched.informers
                if key[0] not in (EVENT, WORKLOAD) and (namespace, key[1]) not in used
            ]
            stopped = [self._namespaces[ns].informers.pop(key) for ns, key in stale]
        for informer in stopped:
            informer.stop()

    def _stop_namespace(self, namespace: str) -> None:
        with self._lock:
            watched = self._namespaces.pop(namespace, None)
        if watched is not None:
            watched.stop()

    # ---------------------------------------------------------------- informers (cache <- watches)

    def _watch(self, namespace: str, domain: str, *, queued: bool) -> None:
        """Informers for the namespace's Events, its Workloads (when the job names a queue, or Kueue is
        served) and, for `domain`, its labelled kinds (lock held: no network call here)."""
        watched = self._namespaces.setdefault(namespace, Watches())
        watch_kinds(self, watched, namespace, domain, cluster="", on_synced=self._synced(namespace))
        # A job that names a queue has a Workload whatever this process remembers of Kueue (a 404 from before
        # Kueue was installed, a discovery call that failed): its namespace's Workloads are watched, and an
        # informer that cannot list them says so on the job.
        if (WORKLOAD, "") not in watched.informers and (queued or self._kueue_served):
            # Kueue's Workloads carry no dispatch label: every Workload of the namespace, keeping those a
            # TrainJob named like dispatch's controls (grouping then checks the owner's UID).
            watched.informers[(WORKLOAD, "")] = self._informer(
                gateway.WORKLOADS,
                namespace,
                trim=trim_workload,
                keep=self._keep_workload,
                indexers={
                    "name": lambda o: [str((o.get("metadata") or {}).get("name") or "")],
                    "owner": owner_uids,
                    "job": lambda o: [f"{k[0]}/{k[1]}"] if (k := workload_key(o)) else [],
                },
                on_change=self._workload_changed,
                on_synced=self._synced(namespace),
                relist_seconds=self.relist_seconds,
                cluster="",
            ).start()

    def _due_again(self, pks: Iterable[int]) -> None:
        """These executions are due at the next cycle (their worker's watches just listed)."""
        with self._lock:
            keys = [self._tracked[pk].key for pk in pks if pk in self._tracked]
            self._dirty.update(keys)
        if keys:
            self.wake.set()

    def _synced(self, namespace: str) -> Callable[[], None]:
        """An informer of the namespace has its first list: the namespace's executions are due again. A cycle
        skips the executions of a namespace whose informers are still listing; without this, one whose own
        objects came in an earlier informer's list waited for its next change, or the full re-read (60 s)."""

        def synced() -> None:
            with self._lock:
                keys = [t.key for t in self._tracked.values() if t.namespace == namespace]
                self._dirty.update(keys)
            if keys:
                self.wake.set()

        return synced

    def _keeper(self, domain: str) -> Callable[[Mapping[str, Any]], bool]:
        def keep(obj: Mapping[str, Any]) -> bool:
            return label_key(obj, domain) not in self._finished

        return keep

    def _keep_workload(self, obj: Mapping[str, Any]) -> bool:
        key = workload_key(obj)
        return key is not None and key not in self._finished

    def _workload_changed(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        self._touch(workload_key(obj))

    def _keep_event(self, event: Mapping[str, Any]) -> bool:
        if not is_dispatch_event(event):
            return False
        key = key_of_trainjob_name(event_prefix(event) or "")
        return key not in self._finished

    def _changed(self, domain: str) -> Callable[[str, dict[str, Any], dict[str, Any] | None], None]:
        def changed(kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
            self._touch(label_key(obj, domain))

        return changed

    def _event_changed(self, namespace: str) -> Callable[[str, dict[str, Any], dict[str, Any] | None], None]:
        def changed(kind: str, event: dict[str, Any], old: dict[str, Any] | None) -> None:
            if kind != DELETED:  # an Event's TTL ran out: nothing changed for the job
                self._touch(key_of_trainjob_name(event_prefix(event) or ""))

        return changed

    def _touch(self, key: Key | None) -> None:
        if key is None:
            return
        with self._lock:
            if key in self._by_key:
                self._dirty.add(key)
                self.wake.set()
            elif key not in self._finished:
                self._unknown.add(key)  # a new execution not tracked yet, or one that ended long ago

    def _pod_deleted(self, domain: str) -> Callable[[dict[str, Any]], None]:
        def deleted(pod: dict[str, Any]) -> None:
            key = label_key(pod, domain)
            with self._lock:
                pk = (self._by_key.get(key) or self._starting_keys.get(key)) if key else None
                if pk is not None:
                    self._dead.append((pk, pod))

        return deleted
