"""Typed reads of Kueue (kueue.x-k8s.io/v1beta2) and its visibility API, beside cluster/gateway.py.

Every call passes the gateway's timeout and is counted with its requests; every error becomes one of
cluster.errors naming the object as "Kind namespace/name". A missing object is None. When the API server does
not serve kueue.x-k8s.io/v1beta2 at all (Kueue is not installed, or too old to serve v1beta2), a read raises
KueueNotInstalled: the API server answers 404 for the group itself, with no Status naming the object (a
missing object's 404 names it in `details`), so one call tells the two apart. The API server authorizes
before it routes: an account whose RBAC does not name kueue.x-k8s.io gets 403 (Rejected) instead, so the
404 needs deploy/rbac's Kueue rules, which an installation without Kueue may keep.

Objects come back as plain data (managedFields dropped); the pure code in jobs/ reads quotas and usage from
them. One write: `deactivate_workload` (spec.active=false with dispatch's mark), compare-and-set on the
Workload's resourceVersion.

Supervision lists Workloads per namespace (`list_workloads`); without Kueue that list answers 404 for the
group, and the answer is remembered for NOT_INSTALLED_SECONDS, so a cluster without Kueue pays one call per
that period, not one per namespace per cycle.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from cluster import gateway
from cluster.client import api_client, request_timeout
from cluster.errors import ClusterError, ClusterUnavailable, Conflict, NotFound

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSION = "v1beta2"
PLURALS = {
    "LocalQueue": "localqueues",
    "ClusterQueue": "clusterqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "ResourceFlavor": "resourceflavors",
    "AdmissionCheck": "admissionchecks",
    "MultiKueueConfig": "multikueueconfigs",
}


class KueueNotInstalled(ClusterError):
    """The API server does not serve kueue.x-k8s.io/v1beta2: Kueue is not installed (or older than v0.17,
    the first release dispatch runs with). Final, not transient."""


def not_installed_message() -> str:
    return (
        f"Kueue is not installed in the cluster: the API server does not serve {GROUP}/{VERSION} "
        "(dispatch needs Kueue v0.17 or later with the TrainJob integration)"
    )


def _object_missing(exc: ApiException, plural: str, name: str) -> bool:
    """A 404 about the object itself: a Status whose details name it (not the group's 404 page)."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return False
    details = body.get("details") if isinstance(body, dict) else None
    return isinstance(details, dict) and details.get("kind") == plural and details.get("name") == name


def _is_status(exc: ApiException) -> bool:
    """The answer is a Kubernetes Status object (an API's own error), not a plain-text page."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return False
    return isinstance(body, dict) and body.get("kind") == "Status"


def _read(what: str, plural: str, name: str, fn: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
    gateway.requests_made.add()
    with gateway.calling(what):
        try:
            body = fn(*args, _request_timeout=request_timeout())
        except ApiException as exc:
            if exc.status != 404:
                raise  # gateway.calling turns it into a ClusterError naming the object
            if _object_missing(exc, plural, name):
                return None
            raise KueueNotInstalled(what, not_installed_message(), status=404) from None
    if not isinstance(body, dict):
        raise ClusterUnavailable(what, "unreadable answer: not an object")
    (body.get("metadata") or {}).pop("managedFields", None)
    return body


def _namespaced(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    plural = PLURALS[kind]
    return _read(
        gateway.target(kind, namespace, name),
        plural,
        name,
        gateway.custom().get_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        plural,
        name,
    )


def _cluster_scoped(kind: str, name: str) -> dict[str, Any] | None:
    plural = PLURALS[kind]
    return _read(
        gateway.target(kind, None, name),
        plural,
        name,
        gateway.custom().get_cluster_custom_object,
        GROUP,
        VERSION,
        plural,
        name,
    )


def get_local_queue(namespace: str, name: str) -> dict[str, Any] | None:
    """The LocalQueue, or None when it does not exist. KueueNotInstalled without Kueue."""
    return _namespaced("LocalQueue", namespace, name)


def get_cluster_queue(name: str) -> dict[str, Any] | None:
    """The ClusterQueue (spec: resourceGroups with nominal quotas; status: flavorsReservation, flavorsUsage),
    or None when it does not exist."""
    return _cluster_scoped("ClusterQueue", name)


def get_priority_class(name: str) -> dict[str, Any] | None:
    """The WorkloadPriorityClass (cluster-scoped: `value`, `description`), or None."""
    return _cluster_scoped("WorkloadPriorityClass", name)


def get_admission_check(name: str) -> dict[str, Any] | None:
    """The AdmissionCheck (cluster-scoped: spec.controllerName, spec.parameters), or None."""
    return _cluster_scoped("AdmissionCheck", name)


def get_multikueue_config(name: str) -> dict[str, Any] | None:
    """The MultiKueueConfig (cluster-scoped: spec.clusters, the MultiKueueCluster names), or None."""
    return _cluster_scoped("MultiKueueConfig", name)


@dataclass(frozen=True)
class PendingWorkload:
    """One entry of the visibility API's pending workloads of a LocalQueue (positions count from 0)."""

    namespace: str
    name: str
    local_queue: str
    position_in_local_queue: int
    position_in_cluster_queue: int
    priority: int


def pending_workloads(namespace: str, local_queue: str) -> list[PendingWorkload]:
    """GET /apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/<ns>/localqueues/<lq>/pendingworkloads: the
    Workloads waiting in the LocalQueue, in queue order. An unknown LocalQueue is NotFound; without Kueue's
    visibility APIService the API server answers 404 (no such group) or 503 (its backend is down), raised as
    KueueNotInstalled or ClusterUnavailable. Authorization is delegated to the API server (RBAC on
    visibility.kueue.x-k8s.io localqueues/pendingworkloads in the namespace)."""
    what = f"LocalQueue {namespace}/{local_queue} (pending workloads)"
    path = (
        f"/apis/{VISIBILITY_GROUP}/{VISIBILITY_VERSION}/namespaces/{namespace}/localqueues/"
        f"{local_queue}/pendingworkloads"
    )
    api = api_client()
    gateway.requests_made.add()
    with gateway.calling(what):
        method, url, headers, body, post = api.param_serialize(
            "GET", path, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
        )
        response = api.call_api(
            method,
            url,
            header_params=headers,
            body=body,
            post_params=post,
            _request_timeout=request_timeout(),
        )
        response.read()
        if not 200 <= response.status < 300:
            exc = ApiException(http_resp=response)
            if response.status == 404 and not _is_status(exc):  # the group's "404 page not found"
                raise KueueNotInstalled(
                    what, f"the API server does not serve {VISIBILITY_GROUP}/{VISIBILITY_VERSION}", status=404
                )
            raise exc  # gateway.calling turns it into a ClusterError (NotFound: no such LocalQueue)
    try:
        answer = json.loads(response.data or b"{}")
        items = answer.get("items") or []
        return [
            PendingWorkload(
                namespace=str(item["metadata"].get("namespace") or namespace),
                name=str(item["metadata"]["name"]),
                local_queue=str(item.get("localQueueName") or local_queue),
                position_in_local_queue=int(item.get("positionInLocalQueue", 0)),
                position_in_cluster_queue=int(item.get("positionInClusterQueue", 0)),
                priority=int(item.get("priority", 0)),
            )
            for item in items
        ]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ClusterUnavailable(what, f"unreadable answer: {exc}") from None


# ---------------------------------------------------------------- Workloads (supervision)

NOT_INSTALLED_SECONDS = 60.0


class _Presence:
    """What the API server last said of kueue.x-k8s.io/v1beta2, kept NOT_INSTALLED_SECONDS (monotonic)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._absent_until = 0.0
        self._present_until = 0.0

    def absent(self) -> bool:
        with self._lock:
            return time.monotonic() < self._absent_until

    def present(self) -> bool:
        with self._lock:
            return time.monotonic() < self._present_until

    def note_absent(self, seconds: float = NOT_INSTALLED_SECONDS) -> None:
        with self._lock:
            self._absent_until = time.monotonic() + seconds
            self._present_until = 0.0

    def note_present(self, seconds: float = NOT_INSTALLED_SECONDS) -> None:
        with self._lock:
            self._present_until = time.monotonic() + seconds
            self._absent_until = 0.0

    def forget(self) -> None:
        with self._lock:
            self._absent_until = self._present_until = 0.0


presence = _Presence()


def installed() -> bool:
    """Kueue's Workloads are served, as far as this process knows (a 404 for the group is remembered for
    NOT_INSTALLED_SECONDS; otherwise one discovery GET of the group version)."""
    if presence.absent():
        return False
    if presence.present():
        return True
    what = f"{GROUP}/{VERSION}"
    api = api_client()
    gateway.requests_made.add()
    try:
        with gateway.calling(what):
            method, url, headers, _body, _post = api.param_serialize(
                "GET",
                f"/apis/{GROUP}/{VERSION}",
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = api.call_api(method, url, header_params=headers, _request_timeout=request_timeout())
            response.read()
            if response.status == 404:
                presence.note_absent()
                return False
            if 200 <= response.status < 300:
                presence.note_present()
                return True
            return False
    except ClusterError:
        return False


def list_workloads(namespace: str) -> list[dict[str, Any]] | None:
    """Every Workload of the namespace (one list call), or None when Kueue is not installed (remembered for
    NOT_INSTALLED_SECONDS: no call meanwhile). Other errors are raised (a ClusterError naming the read)."""
    if presence.absent():
        return None
    try:
        return gateway.list_objects(gateway.WORKLOADS, namespace).items
    except NotFound:  # a list in a namespace never 404s for its objects: the group is not served
        presence.note_absent()
        return None


DEACTIVATED = "deactivated"  # dispatch set spec.active=false now
ALREADY = "already"  # spec.active was false already (dispatch's mark, or a user's act: the caller reads it)
GONE = "gone"  # the Workload (that UID) no longer exists: its TrainJob is being deleted


def deactivate_workload(
    *, namespace: str, name: str, uid: str, annotations: dict[str, str], attempts: int = 5
) -> str:
    """Set the Workload's spec.active to false together with `annotations` (dispatch's mark: why it did so),
    in one merge patch whose metadata.resourceVersion makes it a compare-and-set: a Workload changed meanwhile
    (Kueue writes its status several times around an eviction) is read again and patched again. Idempotent:
    a Workload already inactive is left as it is (ALREADY); one gone, or replaced under its name by another
    UID, is GONE. Kueue then evicts it as `Deactivated` and never admits it again."""
    what = gateway.target("Workload", namespace, name)
    for _ in range(attempts):
        try:
            current: dict[str, Any] = gateway.call_api(
                what,
                gateway.custom().get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                "workloads",
                name,
            )
        except NotFound:
            return GONE
        meta = current.get("metadata") or {}
        if uid and meta.get("uid") != uid:
            return GONE
        if (current.get("spec") or {}).get("active") is False:
            return ALREADY
        patch = {
            "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": annotations},
            "spec": {"active": False},
        }
        try:
            gateway.call_api(
                what,
                gateway.custom().patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                "workloads",
                name,
                patch,
            )
        except Conflict:
            continue  # changed since the read: read it again
        except NotFound:
            return GONE
        return DEACTIVATED
    raise Conflict(what, f"the Workload kept changing: not deactivated after {attempts} attempts")
