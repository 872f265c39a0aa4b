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
from cluster.errors import AlreadyExists, ClusterError, ClusterUnavailable, Conflict, NotFound, Rejected
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


@dataclass(frozen=True)
class Observed:
    """Everything the supervisor reads in one cycle: dispatch's objects across the cluster (label-selected)
    plus the Events and Nodes that explain them. Each item is plain data with its `kind` set."""

    trainjobs: list[dict[str, Any]]
    jobsets: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    events: list[dict[str, Any]]
    nodes: list[dict[str, Any]]


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


def list_supervised(label_key: str, namespace: str | None = None) -> Observed:
    """Six list calls however many jobs there are: TrainJobs, JobSets, Jobs and Pods carrying `label_key`,
    and the Events and Nodes. With `namespace` the namespaced kinds are read from it alone."""
    api_custom, api_core = custom(), core()
    batch = client.BatchV1Api(api_client())
    selector = label_key
    where = f" in {namespace}" if namespace else ""

    def custom_list(plural: str, kind: str, group: str, version: str) -> list[dict[str, Any]]:
        if namespace:
            return raw_list(
                f"{kind}s{where}",
                kind,
                api_custom.list_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                label_selector=selector,
            )
        return raw_list(
            f"{kind}s",
            kind,
            api_custom.list_cluster_custom_object,
            group,
            version,
            plural,
            label_selector=selector,
        )

    trainjobs = custom_list("trainjobs", "TrainJob", TRAINER_GROUP, TRAINER_VERSION)
    jobsets = custom_list("jobsets", "JobSet", JOBSET_GROUP, JOBSET_VERSION)
    if namespace:
        jobs = raw_list(f"Jobs{where}", "Job", batch.list_namespaced_job, namespace, label_selector=selector)
        pods = raw_list(
            f"Pods{where}", "Pod", api_core.list_namespaced_pod, namespace, label_selector=selector
        )
        events = raw_list(f"Events{where}", "Event", api_core.list_namespaced_event, namespace)
    else:
        jobs = raw_list("Jobs", "Job", batch.list_job_for_all_namespaces, label_selector=selector)
        pods = raw_list("Pods", "Pod", api_core.list_pod_for_all_namespaces, label_selector=selector)
        events = raw_list("Events", "Event", api_core.list_event_for_all_namespaces)
    nodes = raw_list("Nodes", "Node", api_core.list_node)
    return Observed(trainjobs=trainjobs, jobsets=jobsets, jobs=jobs, pods=pods, events=events, nodes=nodes)


def watch_pods(
    label_key: str, *, timeout_seconds: int, resource_version: str = ""
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Pod changes across the cluster for pods carrying `label_key`: (ADDED|MODIFIED|DELETED|BOOKMARK, pod).
    Ends after timeout_seconds (the server closes the watch). A DELETED event carries the pod's last state:
    the evidence of a preemption, eviction or lost node that a periodic list can miss."""
    from kubernetes import watch

    api = core()
    stream = watch.Watch()
    requests_made.add()
    kwargs: dict[str, Any] = {
        "label_selector": label_key,
        "timeout_seconds": timeout_seconds,
        "_request_timeout": (request_timeout()[0], timeout_seconds + 10),
        "allow_watch_bookmarks": True,
    }
    if resource_version:
        kwargs["resource_version"] = resource_version
    with counted("watch", "Pod"), calling("Pods (watch)"):
        for event in stream.stream(api.list_pod_for_all_namespaces, _preload_content=False, **kwargs):
            raw = event.get("raw_object") or {}
            if isinstance(raw, dict):
                raw["kind"] = "Pod"
                yield str(event.get("type", "")), raw
