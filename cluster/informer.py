"""An informer: a local copy of one kind's objects in one namespace, kept current by a list, then a watch.

Like client-go's reflector: list, then watch from the list's resourceVersion (with bookmarks, so a quiet watch
keeps its place); a watch that breaks (the API server unreachable, a 5xx, a refusal) is opened again from the
last resourceVersion seen, so what changed meanwhile arrives as the events it was, in order (a pod evicted and
gone during an outage is seen with its DisruptionTarget, then deleted); only a 410 Gone (the place expired)
lists afresh. A full re-list every `relist_seconds` guards against an event the watch could have missed. That
periodic re-list runs beside the watch, which goes on (a re-list of thousands of pods takes seconds on a busy
API server, and changes must not wait for it): it corrects only the objects the watch did not touch meanwhile.
Between re-lists nothing is listed: the copy follows the watch. Objects are kept in a store by UID with
indices (name, owner UID, ...), and each change is reported to `on_change` (ADDED, MODIFIED, DELETED with the
last state seen; a re-list reports what it finds changed).

Reads that fail are kept as `error` (e.g. "Pods in team-a (watch): forbidden"), so a caller can say which
read failed and go on with the others; `error` clears once a list or watch works again. Each informer runs
in a thread of its own, on one cluster (`cluster`: the manager, or a MultiKueue worker by name:
cluster.where); `stop()` closes its watch at once and drops its objects.

The module knows nothing of jobs: what to keep of an object (`trim`), which objects to keep (`keep`) and the
indices are the caller's.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any

from kubernetes import client

from cluster import gateway
from cluster.client import api_client
from cluster.errors import ClusterError, ClusterUnavailable, Expired
from cluster.where import cluster_label, current_cluster, on_cluster

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
Indexer = Callable[[Obj], Iterable[str]]
# (event type, the object now or its last state when DELETED, the object before or None)
OnChange = Callable[[str, Obj, Obj | None], None]
# An object leaves the store (its last state): called under the store's lock, before a reader can miss it.
OnDelete = Callable[[Obj], None]

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
WATCH_SECONDS = 240
RELIST_SECONDS = 600.0
RETRY_MAX_SECONDS = 30.0  # a refusal (403, a missing kind): nothing changes until somebody acts
# The API server unreachable or overloaded: tried again at most this far apart, so the copy is current again
# within seconds of its return (the watch resumes from its place; if that place expired meanwhile, only the
# re-list sees what changed, and a pod evicted and gone in the gap then leaves no last state behind).
UNAVAILABLE_RETRY_MAX_SECONDS = 3.0


@lru_cache(maxsize=32)
def _watch_client(kubeconfig_client_id: int) -> client.ApiClient:
    del kubeconfig_client_id  # the cache key: one watch client per configuration
    configuration = copy.deepcopy(api_client().configuration)
    configuration.connection_pool_maxsize = 256
    return client.ApiClient(configuration)


def watch_client() -> client.ApiClient:
    """A client of its own for watches, per cluster (the one the call path is on: cluster.where): each holds
    a connection for minutes, which must not take the pool that requests share."""
    return _watch_client(id(api_client()))


def uid_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def version_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Informer:
    def __init__(
        self,
        resource: gateway.Resource,
        namespace: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        trim: Callable[[Obj], Obj] | None = None,
        keep: Callable[[Obj], bool] | None = None,
        indexers: Mapping[str, Indexer] | None = None,
        on_change: OnChange | None = None,
        on_delete: OnDelete | None = None,
        on_synced: Callable[[], None] | None = None,
        relist_seconds: float = RELIST_SECONDS,
        watch_seconds: int = WATCH_SECONDS,
        cluster: str | None = None,
    ) -> None:
        self.resource = resource
        # The cluster it reads (cluster.where): the one the caller is on unless named. Its threads start on
        # the manager (a ContextVar), so each enters on_cluster(cluster) itself.
        self.cluster = current_cluster() if cluster is None else cluster
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self._trim = trim or (lambda obj: obj)
        self._keep = keep or (lambda obj: True)
        self._indexers = dict(indexers or {})
        self._on_change = on_change
        self._on_delete = on_delete
        self._on_synced = on_synced
        self.relist_seconds = relist_seconds
        self.watch_seconds = watch_seconds
        self._lock = threading.RLock()
        self._store: dict[str, Obj] = {}
        self._index: dict[str, dict[str, set[str]]] = {name: {} for name in self._indexers}
        self._version = ""
        self._listed_at = 0.0
        self._relisting = False
        self._touched: set[str] = set()  # objects the watch changed while a periodic re-list ran
        self._stop = threading.Event()
        self._stream: gateway.WatchStream | None = None
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()  # set once the first list has filled the store
        self.error = ""  # the last read that failed; "" once a list or watch works again
        self.lists = 0  # list calls made (the first, 410s, re-lists)

    @property
    def name(self) -> str:
        selector = f" [{self.label_selector}]" if self.label_selector else ""
        return f"{cluster_label(self.cluster)}{self.resource.what(self.namespace)}{selector}"

    # ---------------------------------------------------------------- reading the copy

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._store.values())

    def get(self, uid: str) -> Obj | None:
        with self._lock:
            return self._store.get(uid)

    def by_index(self, index: str, value: str) -> list[Obj]:
        with self._lock:
            return [self._store[uid] for uid in self._index[index].get(value, ())]

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    # ---------------------------------------------------------------- life

    def start(self) -> Informer:
        self._thread = threading.Thread(target=self._run, name=f"informer {self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching and drop every object (the thread ends on its own; its late events are ignored)."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.close()
        with self._lock:
            self._store.clear()
            self._index = {name: {} for name in self._indexers}

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def relist_now(self) -> None:
        """List afresh at the next chance (the current watch is closed)."""
        self._listed_at = 0.0
        stream = self._stream
        if stream is not None:
            stream.close()

    def purge_indexed(self, index: str, value: str) -> int:
        """Forget the objects an index lists under `value` (no scan of the whole copy)."""
        with self._lock:
            gone = list(self._index[index].get(value, ()))
            for uid in gone:
                self._remove(uid)
        return len(gone)

    def purge(self, drop: Callable[[Obj], bool]) -> int:
        """Forget the objects `drop` selects (no longer needed); a re-list may bring them back."""
        with self._lock:
            gone = [uid for uid, obj in self._store.items() if drop(obj)]
            for uid in gone:
                self._remove(uid)
        return len(gone)

    def _run(self) -> None:
        with on_cluster(self.cluster):
            self._loop()

    def _loop(self) -> None:
        wait = 1.0
        while not self._stop.is_set():
            try:
                if not self._version:
                    self._list()
                elif time.monotonic() - self._listed_at >= self.relist_seconds and not self._relisting:
                    self._relisting = True
                    threading.Thread(target=self._relist, name=f"relist {self.name}", daemon=True).start()
                self._watch()
                wait = 1.0
            except Expired:
                self._version = ""  # the watch's place expired: list afresh, at once
            except ClusterError as exc:
                if self._stop.is_set():
                    return
                self.error = str(exc)
                logger.info("informer %s: %s (again in %.0f s)", self.name, exc, wait)
                # The place is kept: the next watch resumes from it (a re-list would report a pod gone
                # meanwhile in its last state seen, e.g. Running without the eviction's DisruptionTarget).
                self._stop.wait(wait)
                cap = (
                    UNAVAILABLE_RETRY_MAX_SECONDS
                    if isinstance(exc, ClusterUnavailable)
                    else RETRY_MAX_SECONDS
                )
                wait = min(wait * 2, cap)
            except Exception as exc:  # a bug must not end the thread silently
                if self._stop.is_set():
                    return
                self.error = f"{self.name}: {type(exc).__name__}: {exc}"
                logger.exception("informer %s", self.name)
                self._version = ""  # the copy may be half-updated by the event that failed: list afresh
                self._stop.wait(wait)
                wait = min(wait * 2, RETRY_MAX_SECONDS)

    # ---------------------------------------------------------------- list and watch

    def _list(self) -> None:
        listed = gateway.list_objects(
            self.resource,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
        )
        self.lists += 1
        if self._stop.is_set():
            return
        fresh = {}
        for raw in listed.items:
            if self._keep(raw):
                obj = self._trim(raw)
                fresh[uid_of(obj)] = obj
        changes: list[tuple[str, Obj, Obj | None]] = []
        with self._lock:
            for uid, old in list(self._store.items()):
                if uid not in fresh:
                    self._deleted(old)
                    self._remove(uid)
                    changes.append((DELETED, old, old))  # gone while we were not watching: its last state
            for uid, obj in fresh.items():
                before = self._store.get(uid)
                if before is None or version_of(before) != version_of(obj):
                    self._put(uid, obj)
                    changes.append((ADDED if before is None else MODIFIED, obj, before))
        self._version = listed.resource_version
        self._listed_at = time.monotonic()
        self.error = ""
        first = not self.synced.is_set()
        self.synced.set()
        self._report(changes)
        if first and self._on_synced is not None and not self._stop.is_set():
            try:
                self._on_synced()
            except Exception:
                logger.exception("informer %s: on_synced failed", self.name)

    def _relist(self) -> None:
        """The periodic re-list, beside the watch: objects the watch touched meanwhile keep its word."""
        with on_cluster(self.cluster):
            self._relist_on_cluster()

    def _relist_on_cluster(self) -> None:
        try:
            with self._lock:
                self._touched = set()
            listed = gateway.list_objects(
                self.resource,
                self.namespace,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
            )
            self.lists += 1
            if self._stop.is_set():
                return
            fresh = {}
            for raw in listed.items:
                if self._keep(raw):
                    obj = self._trim(raw)
                    fresh[uid_of(obj)] = obj
            changes: list[tuple[str, Obj, Obj | None]] = []
            with self._lock:
                touched = self._touched
                for uid, old in list(self._store.items()):
                    if uid not in fresh and uid not in touched:
                        self._deleted(old)
                        self._remove(uid)
                        changes.append((DELETED, old, old))  # a deletion the watch missed: its last state
                for uid, obj in fresh.items():
                    before = self._store.get(uid)
                    if uid not in touched and (before is None or version_of(before) != version_of(obj)):
                        self._put(uid, obj)
                        changes.append((ADDED if before is None else MODIFIED, obj, before))
            self._report(changes)
        except ClusterError as exc:
            logger.info("informer %s: periodic re-list: %s (the watch goes on)", self.name, exc)
        except Exception:
            logger.exception("informer %s: periodic re-list", self.name)
        finally:
            self._listed_at = time.monotonic()
            self._relisting = False

    def _watch(self) -> None:
        remaining = self.relist_seconds - (time.monotonic() - self._listed_at)
        seconds = (
            self.watch_seconds if self._relisting else max(1, min(self.watch_seconds, int(remaining) + 1))
        )
        stream = gateway.open_watch(
            self.resource,
            self.namespace,
            resource_version=self._version,
            timeout_seconds=seconds,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            api=watch_client(),
        )
        self._stream = stream
        if self._stop.is_set():
            stream.close()
            return
        self.error = ""
        for kind, raw in stream.events():
            if self._stop.is_set():
                return
            version = version_of(raw)
            if kind == "BOOKMARK":
                self._version = version or self._version
                continue
            change = self._apply(kind, raw)
            self._version = version or self._version
            if change is not None:
                self._report([change])

    def _apply(self, kind: str, raw: Obj) -> tuple[str, Obj, Obj | None] | None:
        uid = uid_of(raw)
        with self._lock:
            if self._relisting:
                self._touched.add(uid)
            old = self._store.get(uid)
            if kind == DELETED or not self._keep(raw):
                if old is None and kind != DELETED:
                    return None
                last = self._trim(raw)
                if kind == DELETED:
                    self._deleted(last)
                self._remove(uid)
                return DELETED, last, old
            obj = self._trim(raw)
            self._put(uid, obj)
            return (ADDED if old is None else MODIFIED), obj, old

    def _report(self, changes: list[tuple[str, Obj, Obj | None]]) -> None:
        if self._on_change is None or self._stop.is_set():
            return
        for kind, obj, old in changes:
            try:
                self._on_change(kind, obj, old)
            except Exception:
                logger.exception("informer %s: on_change failed", self.name)

    # ---------------------------------------------------------------- the store and its indices (locked)

    def _deleted(self, last: Obj) -> None:
        if self._on_delete is not None and not self._stop.is_set():
            try:
                self._on_delete(last)
            except Exception:
                logger.exception("informer %s: on_delete failed", self.name)

    def _put(self, uid: str, obj: Obj) -> None:
        if uid in self._store:
            self._unindex(uid, self._store[uid])
        self._store[uid] = obj
        for name, indexer in self._indexers.items():
            for value in indexer(obj):
                self._index[name].setdefault(value, set()).add(uid)

    def _remove(self, uid: str) -> None:
        obj = self._store.pop(uid, None)
        if obj is not None:
            self._unindex(uid, obj)

    def _unindex(self, uid: str, obj: Obj) -> None:
        for name, indexer in self._indexers.items():
            entries = self._index[name]
            for value in indexer(obj):
                members = entries.get(value)
                if members is not None:
                    members.discard(uid)
                    if not members:
                        del entries[value]
