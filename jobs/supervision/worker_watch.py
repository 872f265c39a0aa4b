"""The supervisor's watches of the MultiKueue workers (issue 35): a part of jobs.supervision.cache.

Under MultiKueue a TrainJob's JobSet, Jobs, pods and their Events exist only on the worker its Workload was
admitted to (Execution.cluster); the manager keeps the TrainJob and the Workload, which the cache's namespace
watches follow. Per (worker, namespace) with a supervised execution admitted there, the same informers as a
namespace of the manager's (per label domain: the worker's TrainJob copy, JobSets, Jobs and pods; the
namespace's Events, those about dispatch's objects kept), each running on the worker (cluster.informer's
`cluster`: dispatch's own credentials for it, cluster.where). They start when an execution is known to be
admitted there (its row names the worker, or a cycle just derived it from the Workload's clusterName) and stop
when none is left, so a cycle reads no list on a worker once its watches are synced: its cost stays constant
in the number of jobs per cluster.

A worker whose watches are still listing holds only its own executions back (the cache's `due` leaves them
out until the first lists are in, then they are due again); one whose watches fail (`Informer.error`, naming
the worker) makes only its own executions `unknown`, as a failed list did, and its reads are recorded for the
overview's worker health (jobs.supervision.reads.record_worker_reads). A pod deleted on a worker leaves its
tombstone as on the manager (the cache's on_delete hook).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cluster import gateway
from cluster.informer import Informer, OnChange, uid_of
from jobs.models import Execution
from jobs.supervision.grouping import EVENT, POD, ObjectSource, involved, owner_uids
from jobs.supervision.reads import LABELLED, WORKER_REQUIRED, record_worker_reads
from jobs.supervision.trim import TRIMS, Key, event_prefix, job_index, trim_event


class Hooks(Protocol):
    """What the watches need of the cache (jobs.supervision.cache.CacheSource): its lock, its informer
    factory and the callbacks its informers report to."""

    _lock: threading.RLock
    relist_seconds: float

    def _informer(self, resource: gateway.Resource, namespace: str, **kwargs: Any) -> Informer: ...

    def _keep_event(self, event: Mapping[str, Any]) -> bool: ...

    def _event_changed(self, namespace: str) -> OnChange: ...

    def _keeper(self, domain: str) -> Callable[[Mapping[str, Any]], bool]: ...

    def _changed(self, domain: str) -> OnChange: ...

    def _pod_deleted(self, domain: str) -> Callable[[dict[str, Any]], None]: ...

    def _due_again(self, pks: Iterable[int]) -> None: ...


# How often the worker health (WorkerRead) is written when no cycle reads a worker's executions.
RECORD_SECONDS = 10.0


@dataclass
class Watches:
    """The informers of one namespace (of the manager, or of a worker): (kind, domain) for the labelled
    kinds, (Event, "") for its Events, (Workload, "") on the manager."""

    informers: dict[tuple[str, str], Informer] = field(default_factory=dict)

    def of(self, kind: str) -> list[Informer]:
        return [i for (k, _), i in self.informers.items() if k == kind]

    def stop(self) -> None:
        for informer in self.informers.values():
            informer.stop()


@dataclass(frozen=True)
class _Wanted:
    worker: str
    namespace: str
    domain: str
    key: Key


class WorkerWatches:
    """The informers of each (worker, namespace) that supervised executions were admitted to (see the module
    docstring). Shares the cache's lock; the informers it starts report to the cache's hooks."""

    def __init__(self, cache: Hooks) -> None:
        self._cache = cache
        self._lock: threading.RLock = cache._lock
        self._wanted: dict[int, _Wanted] = {}
        self._watched: dict[tuple[str, str], Watches] = {}
        self._recorded_at = 0.0
        self._failing: set[tuple[str, str]] = (
            set()
        )  # (worker, namespace) whose watches failed at the last look

    # ---------------------------------------------------------------- which executions need which watches

    def want(self, pk: int, worker: str, namespace: str, domain: str, key: Key) -> None:
        """The execution `pk` runs on `worker`: its namespace there is watched for `domain` (no network call
        here: the informers list in their own threads)."""
        wanted = _Wanted(worker, namespace, domain, key)
        with self._lock:
            if self._wanted.get(pk) == wanted:
                return
            if pk in self._wanted:
                self.release(pk)
            self._wanted[pk] = wanted
            watched = self._watched.setdefault((worker, namespace), Watches())
            synced = functools.partial(self._synced, namespace, worker)
            watch_kinds(self._cache, watched, namespace, domain, cluster=worker, on_synced=synced)

    def release(self, pk: int) -> None:
        """The execution no longer needs its worker's watches: they stop when no other execution there does;
        else its objects leave the copy (and a domain no execution there uses stops being watched)."""
        with self._lock:
            gone = self._wanted.pop(pk, None)
            if gone is None:
                return
            place = (gone.worker, gone.namespace)
            left = [w for w in self._wanted.values() if (w.worker, w.namespace) == place]
            watched = self._watched.get(place)
            if watched is None:
                return
            if not left:
                del self._watched[place]
                stopped = list(watched.informers.values())
            else:
                domains = {w.domain for w in left}
                stale = [k for k in watched.informers if k[0] != EVENT and k[1] not in domains]
                stopped = [watched.informers.pop(k) for k in stale]
        for informer in stopped:
            informer.stop()
        if left:
            purge(watched, [gone.key])

    def worker_of(self, pk: int) -> str:
        with self._lock:
            wanted = self._wanted.get(pk)
            return wanted.worker if wanted else ""

    def _synced(self, namespace: str, cluster: str) -> None:
        """A worker's informer has its first list: the executions there are due again (`due` held them)."""
        with self._lock:
            pks = [pk for pk, w in self._wanted.items() if (w.worker, w.namespace) == (cluster, namespace)]
        self._cache._due_again(pks)

    # ---------------------------------------------------------------- what a cycle reads

    def listing(self, worker: str, namespace: str) -> bool:
        """Its watches are still at their first list (none failed): the executions there wait."""
        with self._lock:
            watched = self._watched.get((worker, namespace))
            informers = list(watched.informers.values()) if watched else []
        if not informers:
            return True
        if any(i.error for i in informers):
            return False
        return not all(i.synced.is_set() for i in informers)

    def errors(self, worker: str, namespace: str) -> dict[str, str]:
        """kind -> the failing read (its message names the worker), for the worker's informers of the
        namespace; a required kind not watched at all counts as failed."""
        with self._lock:
            watched = self._watched.get((worker, namespace))
            informers = dict(watched.informers) if watched else {}
        failed = {kind: i.error for (kind, _), i in informers.items() if i.error}
        watching = {kind for kind, _ in informers}
        for kind in WORKER_REQUIRED:
            if kind not in watching and kind not in failed:
                failed[kind] = f"{worker}: {kind}s in {namespace}: not watched"
        return failed

    def observe(
        self, executions: Sequence[Execution]
    ) -> tuple[dict[str, ObjectSource], dict[tuple[str, str], dict[str, str]]]:
        """What Observation.workers and .worker_errors hold for `executions`: per worker, its watched copy;
        per (worker, namespace), the reads that fail. The workers' health is recorded (WorkerRead)."""
        places = {(e.cluster, e.job.namespace) for e in executions if e.cluster}
        errors = {place: failed for place in sorted(places) if (failed := self.errors(*place))}
        workers = {worker for worker, _ in places}
        record_worker_reads(workers, errors)
        with self._lock:
            self._recorded_at = time.monotonic()
        return {worker: WorkerIndex(self, worker) for worker in workers}, errors

    def settle(self) -> None:
        """The executions of a worker whose watches began or stopped failing are due: a broken watch brings
        no event, so without this they would keep their state until something else changed (the cache's
        prepare, before each cycle)."""
        with self._lock:
            places = {place: list(watched.informers.values()) for place, watched in self._watched.items()}
            failing = {place for place, informers in places.items() if any(i.error for i in informers)}
            changed, self._failing = failing ^ self._failing, failing
            pks = [pk for pk, w in self._wanted.items() if (w.worker, w.namespace) in changed]
        if pks:
            self._cache._due_again(pks)

    def record(self) -> None:
        """The health of every watched worker (WorkerRead), every RECORD_SECONDS at most: a quiet supervisor
        derives nothing, yet the overview says whether each worker's watches work."""
        with self._lock:
            if time.monotonic() - self._recorded_at < RECORD_SECONDS:
                return
            self._recorded_at = time.monotonic()
            places = sorted(self._watched)
        settled = [p for p in places if not self.listing(*p)]
        errors = {place: failed for place in settled if (failed := self.errors(*place))}
        record_worker_reads({worker for worker, _ in settled}, errors)

    def informers(self, worker: str, namespace: str, kind: str) -> list[Informer]:
        with self._lock:
            watched = self._watched.get((worker, namespace))
            return watched.of(kind) if watched else []

    def of_worker(self, worker: str, kind: str, domain: str) -> list[Informer]:
        with self._lock:
            return [
                watched.informers[(kind, domain)]
                for (name, _), watched in self._watched.items()
                if name == worker and (kind, domain) in watched.informers
            ]

    # ---------------------------------------------------------------- the copy

    def purge(self, keys: Sequence[Key]) -> None:
        with self._lock:
            every = list(self._watched.values())
        for watched in every:
            purge(watched, keys)

    def close(self) -> None:
        with self._lock:
            every, self._watched = list(self._watched.values()), {}
            self._wanted.clear()
        for watched in every:
            watched.stop()

    def informer_count(self, worker: str | None = None) -> int:
        with self._lock:
            return sum(len(w.informers) for (name, _), w in self._watched.items() if worker in (None, name))

    def cached_objects(self) -> int:
        with self._lock:
            informers = [i for w in self._watched.values() for i in w.informers.values()]
        return sum(len(i) for i in informers)


class WorkerIndex:
    """One worker's watched copy as an ObjectSource (jobs.supervision.grouping)."""

    def __init__(self, watches: WorkerWatches, worker: str) -> None:
        self._watches = watches
        self.worker = worker

    def named(self, kind: str, namespace: str, name: str) -> list[Mapping[str, Any]]:
        return unique(i.by_index("name", name) for i in self._watches.informers(self.worker, namespace, kind))

    def owned_by(self, kind: str, namespace: str, owner_uid: str) -> list[Mapping[str, Any]]:
        informers = self._watches.informers(self.worker, namespace, kind)
        return unique(i.by_index("owner", owner_uid) for i in informers)

    def events_about(self, namespace: str, uid: str) -> list[Mapping[str, Any]]:
        informers = self._watches.informers(self.worker, namespace, EVENT)
        return unique(i.by_index("involved", uid) for i in informers)

    def events_named(self, namespace: str, name_prefix: str) -> list[Mapping[str, Any]]:
        informers = self._watches.informers(self.worker, namespace, EVENT)
        return unique(i.by_index("prefix", name_prefix) for i in informers)

    def events_of_pod(self, namespace: str, name: str) -> list[Mapping[str, Any]]:
        return unique(i.by_index("pod", name) for i in self._watches.informers(self.worker, namespace, EVENT))

    def labelled(self, kind: str, domain: str, job_id: str, attempt: int) -> list[Mapping[str, Any]]:
        informers = self._watches.of_worker(self.worker, kind, domain)
        return unique(i.by_index("job", f"{job_id}/{attempt}") for i in informers)


def watch_kinds(
    cache: Hooks,
    watched: Watches,
    namespace: str,
    domain: str,
    *,
    cluster: str,
    on_synced: Callable[[], None],
) -> None:
    """The informers of the namespace's Events and, for `domain`, of its labelled kinds, on `cluster`
    (the manager "", or a MultiKueue worker: jobs.supervision.worker_watch). Lock held."""
    if (EVENT, "") not in watched.informers:
        watched.informers[(EVENT, "")] = cache._informer(
            gateway.EVENTS,
            namespace,
            trim=trim_event,
            keep=cache._keep_event,
            indexers={
                "involved": lambda e: [str(involved(e).get("uid") or "")],
                # events_named: only Events without the UID of their object
                "prefix": lambda e: [] if involved(e).get("uid") else [event_prefix(e) or ""],
                "trainjob": lambda e: [event_prefix(e) or ""],
                "pod": lambda e: (
                    [str(involved(e).get("name") or "")] if involved(e).get("kind") == POD else []
                ),
            },
            on_change=cache._event_changed(namespace),
            on_synced=on_synced,
            relist_seconds=cache.relist_seconds,
            cluster=cluster,
        ).start()
    for kind, resource in LABELLED.items():
        if (kind, domain) in watched.informers:
            continue
        watched.informers[(kind, domain)] = cache._informer(
            resource,
            namespace,
            label_selector=f"{domain}/job",
            trim=TRIMS[kind],
            keep=cache._keeper(domain),
            indexers={
                "name": lambda o: [str((o.get("metadata") or {}).get("name") or "")],
                "owner": owner_uids,
                "job": job_index(domain),
            },
            on_change=cache._changed(domain),
            on_delete=cache._pod_deleted(domain) if kind == POD else None,
            on_synced=on_synced,
            relist_seconds=cache.relist_seconds,
            cluster=cluster,
        ).start()


def purge(watched: Watches, keys: Iterable[Key]) -> None:
    """The objects of these executions leave the namespace's copy (by index: no scan of the copy)."""
    for job_id, attempt in keys:
        for (kind, _), informer in list(watched.informers.items()):
            if kind == EVENT:
                informer.purge_indexed("trainjob", f"{job_id}-{attempt}")
            else:
                informer.purge_indexed("job", f"{job_id}/{attempt}")


def unique(groups: Iterable[list[Any]]) -> list[Any]:
    out: list[Any] = []
    seen: set[str] = set()
    for group in groups:
        for obj in group:
            uid = uid_of(obj)
            if uid not in seen:
                seen.add(uid)
                out.append(obj)
    return out
