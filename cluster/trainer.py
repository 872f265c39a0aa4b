"""The Trainer's objects: ClusterTrainingRuntimes and TrainingRuntimes read (with a short per-process cache),
TrainJobs created, read, patched, deleted and listed, all through cluster.calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client

from cluster.calls import call_api, call_json, custom, target
from cluster.errors import NotFound
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
            body = call_json(target(kind, "", name), ("get", kind), "GET", f"{_BASE}/{PLURALS[kind]}/{name}")
        except NotFound:
            return None
    else:
        body = get_namespaced(kind, namespace, name)
        if body is None:
            return None
    return RuntimeObject.from_body(kind, body)


# ---------------------------------------------------------------- namespaced trainer objects


_BASE = f"/apis/{TRAINER_GROUP}/{TRAINER_VERSION}"


def _path(kind: str, namespace: str, name: str = "") -> str:
    path = f"{_BASE}/namespaces/{namespace}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


def create_namespaced(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    what = target(kind, meta["namespace"], meta["name"])
    created: dict[str, Any] = call_json(what, ("create", kind), "POST", _path(kind, meta["namespace"]), body)
    return created


def get_namespaced(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        body: dict[str, Any] = call_json(
            target(kind, namespace, name), ("get", kind), "GET", _path(kind, namespace, name)
        )
    except NotFound:
        return None
    return body


def patch_namespaced(kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = call_json(
        target(kind, namespace, name),
        ("patch", kind),
        "PATCH",
        _path(kind, namespace, name),
        patch,
        content_type="application/merge-patch+json",
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
