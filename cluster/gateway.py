"""Typed reads, creates and deletes against the Kubernetes API.

Every call passes an explicit timeout; every ApiException and connection error becomes one of the
errors in cluster.errors, naming the object as "Kind namespace/name".
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError

from cluster.client import api_client, request_timeout
from cluster.errors import (
    AlreadyExists,
    ClusterError,
    ClusterUnavailable,
    Conflict,
    Expired,
    NotFound,
    Rejected,
)
from dispatch_site import metrics
from dispatch_site.readcache import ReadCache

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
PLURALS = {
    "ClusterTrainingRuntime": "clustertrainingruntimes",
    "TrainingRuntime": "trainingruntimes",
    "TrainJob": "trainjobs",
}


@dataclass(frozen=True)
class RuntimeObject:
    """A ClusterTrainingRuntime or TrainingRuntime as read from the cluster."""

    kind: str
    namespace: str  # "" for a ClusterTrainingRuntime
    name: str
    resource_version: str
    generation: int | None
    body: dict[str, Any]  # the whole object as plain data, for the rule checker

    @classmethod
    def from_body(cls, kind: str, body: dict[str, Any]) -> RuntimeObject:
        meta = body.get("metadata") or {}
        # Server-side apply bookkeeping: noise on every page and in every stored snapshot.
        meta.pop("managedFields", None)
        body.setdefault("kind", kind)
        body.setdefault("apiVersion", f"{TRAINER_GROUP}/{TRAINER_VERSION}")
        return cls(
            kind=kind,
            namespace=meta.get("namespace") or "",
            name=meta.get("name", ""),
            resource_version=str(meta.get("resourceVersion", "")),
            generation=meta.get("generation"),
            body=body,
        )


def target(kind: str, namespace: str | None, name: str) -> str:
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
        return str(body.get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.body or exc.reason)


def translate(exc: ApiException, what: str) -> ClusterError:
    status = exc.status or 0
    message = _api_message(exc)
    reason = ""
    with suppress(ValueError, AttributeError):
        reason = json.loads(exc.body or "{}").get("reason", "")
    if status == 404:
        return NotFound(what, message, status=status)
    if status == 409 and reason == "AlreadyExists":
        return AlreadyExists(what, message, status=status)
    if status == 409:
        return Conflict(what, message, status=status)
    if status == 410:
        return Expired(what, message, status=status)
    if status == 429 or status >= 500 or status == 0:
        return ClusterUnavailable(what, message or "no answer", status=status)
    return Rejected(what, message, status=status)


def _unreachable(exc: Exception) -> str:
    """One line for a connection failure, e.g. 'cannot connect to 127.0.0.1:6443: Connection refused'."""
    if isinstance(exc, MaxRetryError):
        cause = exc.reason
        text = str(cause.args[-1] if isinstance(cause, NewConnectionError) and cause.args else cause)
        text = text.split("] ")[-1].rstrip(")\"'") if "] " in text else text
        return f"unreachable: cannot connect to {exc.pool.host}:{exc.pool.port}: {text}"
    return f"unreachable: {exc}"


@contextmanager
def calling(what: str) -> Iterator[None]:
    try:
        yield
    except ApiException as exc:
        raise translate(exc, what) from None
    except (HTTPError, OSError) as exc:
        raise ClusterUnavailable(what, _unreachable(exc)) from None


class _RequestCounter:
    """API requests made by this process, counted at the gateway (make bench reports them per sync cycle)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0

    def add(self) -> None:
        with self._lock:
            self.total += 1


requests_made = _RequestCounter()


def call_api(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # The generated client types custom-object results as `object`; they are plain dicts.
    requests_made.add()
    with counted(*request_labels(getattr(fn, "__name__", ""), args)), calling(what):
        return fn(*args, _request_timeout=request_timeout(), **kwargs)


# The kinds behind the plurals a custom-object call names, and the success status of each verb.
_KINDS = {
    "trainjobs": "TrainJob",
    "trainingruntimes": "TrainingRuntime",
    "clustertrainingruntimes": "ClusterTrainingRuntime",
    "jobsets": "JobSet",
    "workloads": "Workload",
    "localqueues": "LocalQueue",
    "clusterqueues": "ClusterQueue",
}
_VERBS = {
    "read": "get",
    "get": "get",
    "list": "list",
    "create": "create",
    "patch": "patch",
    "delete": "delete",
    "replace": "update",
    "connect": "connect",
    "watch": "watch",
}
_SUCCESS = {"create": "201"}


def request_labels(method: str, args: tuple[Any, ...]) -> tuple[str, str]:
    """(verb, kind) of a generated client method, e.g. ("list", "Pod") for list_pod_for_all_namespaces and
    ("create", "TrainJob") for create_namespaced_custom_object(group, version, ns, "trainjobs", body): a few
    fixed values each, so the request counter's series stay bounded."""
    head, _, rest = method.partition("_")
    verb = _VERBS.get(head, "other")
    if rest.endswith("custom_object"):
        plural = next((a for a in args[2:4] if isinstance(a, str) and a in _KINDS), "")
        return verb, _KINDS.get(plural, "custom")
    if method == "get_code":
        return "get", "version"
    rest = rest.removeprefix("get_").removeprefix("namespaced_").removesuffix("_for_all_namespaces")
    return verb, "".join(part.capitalize() for part in rest.split("_")) or "other"


@contextmanager
def counted(verb: str, kind: str) -> Iterator[None]:
    """Counts one API request in dispatch_kubernetes_requests_total{verb,kind,code}."""
    code = "error"
    try:
        yield
        code = _SUCCESS.get(verb, "200")
    except ClusterError as exc:
        code = str(exc.status) if exc.status else "error"
        raise
    finally:
        metrics.KUBERNETES_REQUESTS.labels(verb, kind, code).inc()


def custom() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client())


def core() -> client.CoreV1Api:
    return client.CoreV1Api(api_client())


def server_version() -> str:
    info = call_api("apiserver", client.VersionApi(api_client()).get_code)
    return str(info.git_version)


# ---------------------------------------------------------------- runtimes


def list_runtimes() -> list[RuntimeObject]:
    """Every ClusterTrainingRuntime and TrainingRuntime: one list call per kind, not one call per runtime."""
    api = custom()
    cluster_wide = call_api(
        "ClusterTrainingRuntimes",
        api.list_cluster_custom_object,
        TRAINER_GROUP,
        TRAINER_VERSION,
        "clustertrainingruntimes",
    )
    namespaced = call_api(
        "TrainingRuntimes", api.list_cluster_custom_object, TRAINER_GROUP, TRAINER_VERSION, "trainingruntimes"
    )
    return [
        RuntimeObject.from_body("ClusterTrainingRuntime", item) for item in cluster_wide.get("items", [])
    ] + [RuntimeObject.from_body("TrainingRuntime", item) for item in namespaced.get("items", [])]


_runtime_cache: ReadCache[RuntimeObject | None] = ReadCache()


def get_runtime(kind: str, namespace: str, name: str, *, max_age: float = 0.0) -> RuntimeObject | None:
    """The runtime, or None when it does not exist.

    max_age > 0 accepts a read at most that many seconds old from this process (plan answers many requests
    for the same few runtimes); start always reads afresh, so a stale plan can never create anything.
    """
    return _runtime_cache.get((kind, namespace, name), max_age, lambda: _read_runtime(kind, namespace, name))


def forget_cached_runtimes() -> None:
    _runtime_cache.clear()


def _read_runtime(kind: str, namespace: str, name: str) -> RuntimeObject | None:
    if kind == "ClusterTrainingRuntime":
        try:
            body = call_api(
                target(kind, "", name),
                custom().get_cluster_custom_object,
                TRAINER_GROUP,
                TRAINER_VERSION,
                PLURALS[kind],
                name,
            )
        except NotFound:
            return None
    else:
        body = get_namespaced(kind, namespace, name)
        if body is None:
            return None
    return RuntimeObject.from_body(kind, body)


# ---------------------------------------------------------------- namespaced trainer objects


def create_namespaced(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    what = target(kind, meta["namespace"], meta["name"])
    created: dict[str, Any] = call_api(
        what,
        custom().create_namespaced_custom_object,
        TRAINER_GROUP,
        TRAINER_VERSION,
        meta["namespace"],
        PLURALS[kind],
        body,
    )
    return created


def get_namespaced(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        body: dict[str, Any] = call_api(
            target(kind, namespace, name),
            custom().get_namespaced_custom_object,
            TRAINER_GROUP,
            TRAINER_VERSION,
            namespace,
            PLURALS[kind],
            name,
        )
    except NotFound:
        return None
    return body


def patch_namespaced(kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = call_api(
        target(kind, namespace, name),
        custom().patch_namespaced_custom_object,
        TRAINER_GROUP,
        TRAINER_VERSION,
        namespace,
        PLURALS[kind],
        name,
        patch,
    )
    return body


def delete_namespaced(kind: str, namespace: str, name: str, *, uid: str = "") -> bool:
    """Delete with background propagation (the garbage collector removes dependents afterwards); False
    when it was already gone. With `uid`, only that object (a precondition: another object that took the
    name since is left alone, answered 409 Conflict).

    Not foreground: that parks a foregroundDeletion finalizer on the object, and removing it is an UPDATE
    which the Trainer's TrainJob webhook denies once the runtime the TrainJob names is gone.
    """
    try:
        call_api(
            target(kind, namespace, name),
            custom().delete_namespaced_custom_object,
            TRAINER_GROUP,
            TRAINER_VERSION,
            namespace,
            PLURALS[kind],
            name,
            body=client.V1DeleteOptions(
                propagation_policy="Background",
                preconditions=client.V1Preconditions(uid=uid) if uid else None,
            ),
        )
    except NotFound:
        return False
    return True


def list_namespaced(kind: str, namespace: str | None, label_selector: str = "") -> list[dict[str, Any]]:
    api = custom()
    if namespace:
        result = call_api(
            f"{kind}s in {namespace}",
            api.list_namespaced_custom_object,
            TRAINER_GROUP,
            TRAINER_VERSION,
            namespace,
            PLURALS[kind],
            label_selector=label_selector,
        )
    else:
        result = call_api(
            f"{kind}s",
            api.list_cluster_custom_object,
            TRAINER_GROUP,
            TRAINER_VERSION,
            PLURALS[kind],
            label_selector=label_selector,
        )
    items: list[dict[str, Any]] = result.get("items", [])
    return items


# ---------------------------------------------------------------- supervision reads


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


def _raw_get(api: client.ApiClient, path: str, query: list[tuple[str, Any]], timeout: Any) -> Any:
    """GET path?query, its answer not read yet (a urllib3 HTTPResponse); non-2xx raises ApiException."""
    params = api.param_serialize(
        method="GET",
        resource_path=path,
        query_params=query,
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*params, _request_timeout=timeout)
    if not 200 <= response.status <= 299:
        response.read()
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return response.response


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
            response = _raw_get(api, resource.path(namespace), query, request_timeout())
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
        response = _raw_get(api or api_client(), resource.path(namespace), query, timeout)
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
            data = _raw_get(api_client(), NODES.path(name=name), [], request_timeout()).data
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
