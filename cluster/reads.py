"""Supervision's reads: lists in pages, watches and Node gets, their JSON parsed directly, with the traffic
(requests by verb, bytes received) that make bench reports."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from cluster.calls import call_api, calling, counted, raw_request, requests_made, target
from cluster.client import api_client, request_timeout
from cluster.errors import ClusterUnavailable, Expired, NotFound, Rejected
from cluster.trainer import JOBSET_GROUP, JOBSET_VERSION, TRAINER_GROUP, TRAINER_VERSION
from dispatch_site.readcache import ReadCache


def raw_list(what: str, kind: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """One list call, its JSON parsed directly (the generated models cost more than the call on big lists)."""
    response = call_api(what, fn, *args, _preload_content=False, **kwargs)
    try:
        items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
    except (ValueError, AttributeError) as exc:
        raise ClusterUnavailable(what, f"unreadable list answer: {exc}") from None
    for item in items:
        item["kind"] = kind
        (item.get("metadata") or {}).pop("managedFields", None)
    return items


@dataclass(frozen=True)
class Resource:
    """A kind supervision reads, addressed by its API path (one generic list, watch and get for all of them,
    so a Kueue Workload is one more Resource)."""

    kind: str
    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base

    def what(self, namespace: str | None = None) -> str:
        return f"{self.kind}s in {namespace}" if namespace else f"{self.kind}s"


TRAINJOBS = Resource("TrainJob", TRAINER_GROUP, TRAINER_VERSION, "trainjobs")
JOBSETS = Resource("JobSet", JOBSET_GROUP, JOBSET_VERSION, "jobsets")
JOBS = Resource("Job", "batch", "v1", "jobs")
PODS = Resource("Pod", "", "v1", "pods")
EVENTS = Resource("Event", "", "v1", "events")
NODES = Resource("Node", "", "v1", "nodes", namespaced=False)
# Kueue's Workloads (v1beta2, the storage version of v0.19): one more Resource to list and watch per namespace
# once Kueue is installed (jobs.supervision.grouping already counts those the TrainJob owns).
WORKLOADS = Resource("Workload", "kueue.x-k8s.io", "v1beta2", "workloads")


class Traffic:
    """What this process asked the API server, by verb, and the bytes it received (make bench reports a
    supervision cycle's share). `requests_made` keeps counting every request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lists = 0
        self.watches = 0
        self.gets = 0
        self.bytes_received = 0

    def add(self, verb: str, received: int = 0) -> None:
        with self._lock:
            if verb == "list":
                self.lists += 1
            elif verb == "watch":
                self.watches += 1
            elif verb == "get":
                self.gets += 1
            self.bytes_received += received

    def received(self, count: int) -> None:
        with self._lock:
            self.bytes_received += count

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "lists": self.lists,
                "watches": self.watches,
                "gets": self.gets,
                "bytes_received": self.bytes_received,
            }


traffic = Traffic()


def _selectors(label_selector: str, field_selector: str) -> list[tuple[str, Any]]:
    query: list[tuple[str, Any]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


@dataclass(frozen=True)
class Listed:
    items: list[dict[str, Any]]  # each with its `kind` set, managedFields dropped
    resource_version: str  # of the whole list: a watch from here misses nothing


LIST_PAGE = 500


def list_objects(
    resource: Resource,
    namespace: str | None,
    *,
    label_selector: str = "",
    field_selector: str = "",
    page: int = LIST_PAGE,
) -> Listed:
    """Every object of `resource` in `namespace` matching the selectors, read in pages of `page` (one
    consistent snapshot: the continue token keeps the first page's resourceVersion)."""
    what = resource.what(namespace)
    api = api_client()
    items: list[dict[str, Any]] = []
    token = ""
    version = ""
    while True:
        query = [*_selectors(label_selector, field_selector), ("limit", page)]
        if token:
            query.append(("continue", token))
        requests_made.add()
        with counted("list", resource.kind), calling(what):
            response = raw_request(
                api, "GET", resource.path(namespace), query=query, timeout=request_timeout()
            )
            data = response.data
        traffic.add("list", len(data))
        try:
            body = json.loads(data)
        except ValueError as exc:
            raise ClusterUnavailable(what, f"unreadable list answer: {exc}") from None
        for item in body.get("items") or []:
            item["kind"] = resource.kind
            (item.get("metadata") or {}).pop("managedFields", None)
            items.append(item)
        meta = body.get("metadata") or {}
        version = str(meta.get("resourceVersion") or version)
        token = str(meta.get("continue") or "")
        if not token:
            return Listed(items=items, resource_version=version)


class WatchStream:
    """One open watch: iterate `events()` for (type, object); `close()` from another thread ends it at once
    (the socket is shut down, so a blocked read returns)."""

    def __init__(self, what: str, response: Any, kind: str) -> None:
        self._what = what
        self._response = response
        self._kind = kind
        self._closed = False

    def events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        buffer = b""
        try:
            with calling(self._what):
                for chunk in self._response.stream(amt=None, decode_content=False):
                    if self._closed:
                        return
                    traffic.received(len(chunk))
                    buffer += chunk
                    start = 0
                    lines = []
                    while (end := buffer.find(b"\n", start)) >= 0:
                        lines.append(buffer[start:end])
                        start = end + 1
                    buffer = buffer[start:]
                    for line in lines:
                        if line.strip():
                            yield self._event(line)
        finally:
            self.close()

    def _event(self, line: bytes) -> tuple[str, dict[str, Any]]:
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise ClusterUnavailable(self._what, f"unreadable watch event: {exc}") from None
        kind = str(event.get("type", ""))
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            message = str(obj.get("message") or obj.get("reason") or "watch error")
            if code == 410:
                raise Expired(self._what, message, status=410)
            if code in (401, 403, 404):
                raise Rejected(self._what, message, status=code)
            raise ClusterUnavailable(self._what, message, status=code or None)
        if isinstance(obj, dict):
            obj["kind"] = self._kind
            (obj.get("metadata") or {}).pop("managedFields", None)
        return kind, obj

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with suppress(Exception):
            self._response.shutdown()
        with suppress(Exception):
            self._response.release_conn()


def open_watch(
    resource: Resource,
    namespace: str | None,
    *,
    resource_version: str,
    timeout_seconds: int,
    label_selector: str = "",
    field_selector: str = "",
    api: client.ApiClient | None = None,
) -> WatchStream:
    """A watch from `resource_version` with bookmarks; the server ends it after timeout_seconds. `api`: a
    client of its own for long-lived watches (they hold a connection each)."""
    what = f"{resource.what(namespace)} (watch)"
    query = [
        *_selectors(label_selector, field_selector),
        ("watch", "true"),
        ("allowWatchBookmarks", "true"),
        ("timeoutSeconds", timeout_seconds),
    ]
    if resource_version:
        query.append(("resourceVersion", resource_version))
    requests_made.add()
    traffic.add("watch")
    timeout = (request_timeout()[0], timeout_seconds + 30)
    with counted("watch", resource.kind), calling(what):
        response = raw_request(
            api or api_client(), "GET", resource.path(namespace), query=query, timeout=timeout
        )
    return WatchStream(what, response, resource.kind)


_node_cache: ReadCache[dict[str, Any] | None] = ReadCache(limit=10_000)


def get_node(name: str, *, max_age: float = 10.0) -> dict[str, Any] | None:
    """One Node by name (None when it does not exist), a read at most `max_age` seconds old: supervision
    reads only the nodes its pods ran on, and only when a pod's fate depends on its node."""
    return _node_cache.get(name, max_age, lambda: _read_node(name))


def _read_node(name: str) -> dict[str, Any] | None:
    what = target("Node", None, name)
    requests_made.add()
    try:
        with counted("get", "Node"), calling(what):
            data = raw_request(api_client(), "GET", NODES.path(name=name), timeout=request_timeout()).data
    except NotFound:
        traffic.add("get")
        return None
    traffic.add("get", len(data))
    try:
        node: dict[str, Any] = json.loads(data)
    except ValueError as exc:
        raise ClusterUnavailable(what, f"unreadable answer: {exc}") from None
    node["kind"] = "Node"
    (node.get("metadata") or {}).pop("managedFields", None)
    return node


def forget_cached_nodes() -> None:
    _node_cache.clear()
