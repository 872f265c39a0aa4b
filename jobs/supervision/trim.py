"""What the supervisor's informer cache (jobs.supervision.cache) keeps of an object (pure): the fields status
derivation reads, trimmed per kind, and the execution key, (job id, attempt), an object or Event names.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jobs.naming import KUEUE_MARK, PREBUILT_WORKLOAD, trainjob_name_prefix
from jobs.podresources import compute_resources
from jobs.supervision.grouping import involved, label_key

Key = tuple[str, int]


def _strings(mapping: Any) -> dict[str, Any]:
    return {sys.intern(str(k)): v for k, v in (mapping or {}).items()}


def _meta(obj: Mapping[str, Any], *, annotations: Sequence[str] = ()) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    kept: dict[str, Any] = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
        "creationTimestamp": meta.get("creationTimestamp"),
        "labels": _strings(meta.get("labels")),
    }
    if meta.get("deletionTimestamp"):
        kept["deletionTimestamp"] = meta["deletionTimestamp"]
        if meta.get("deletionGracePeriodSeconds") is not None:
            # deletionTimestamp is the request's time plus this grace: when the deletion was asked for.
            kept["deletionGracePeriodSeconds"] = meta["deletionGracePeriodSeconds"]
    if meta.get("ownerReferences"):
        kept["ownerReferences"] = [
            {k: r.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
            for r in meta["ownerReferences"]
        ]
    notes = meta.get("annotations") or {}
    chosen = {k: notes[k] for k in annotations if k in notes}
    if chosen:
        kept["annotations"] = chosen
    return kept


def _containers(rows: Any) -> list[dict[str, Any]]:
    return [
        {k: r.get(k) for k in ("name", "restartCount", "state", "lastState", "ready", "started") if k in r}
        for r in rows or ()
    ]


def trim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    return {
        "kind": "Pod",
        "metadata": _meta(pod, annotations=("batch.kubernetes.io/job-completion-index",)),
        "spec": {
            "nodeName": spec.get("nodeName"),
            "initContainers": [
                {
                    "name": c.get("name"),
                    "restartPolicy": c.get("restartPolicy"),
                    "resources": compute_resources(c.get("resources") or {}),
                }
                for c in spec.get("initContainers") or ()
            ],
            # What the pod holds while it runs (jobs.podresources.pod_compute: usage).
            "containers": [
                {"name": c.get("name"), "resources": compute_resources(c.get("resources") or {})}
                for c in spec.get("containers") or ()
            ],
        },
        "status": {
            "phase": status.get("phase"),
            "reason": status.get("reason"),
            "message": status.get("message"),
            "conditions": status.get("conditions") or [],
            "containerStatuses": _containers(status.get("containerStatuses")),
            "initContainerStatuses": _containers(status.get("initContainerStatuses")),
        },
    }


def trim_owned(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A TrainJob, JobSet or Job: what status derivation reads (spec.suspend, the status); of a TrainJob,
    also MultiKueue's prebuilt-workload annotation (on a worker's copy: grouping.worker_copy)."""
    spec = obj.get("spec") or {}
    notes = (PREBUILT_WORKLOAD,) if obj.get("kind") == "TrainJob" else ()
    kept: dict[str, Any] = {"kind": obj.get("kind"), "metadata": _meta(obj, annotations=notes)}
    kept["status"] = obj.get("status") or {}
    if "suspend" in spec:
        kept["spec"] = {"suspend": spec["suspend"]}
    return kept


def trim_event(event: Mapping[str, Any]) -> dict[str, Any]:
    meta = event.get("metadata") or {}
    keys = ("reason", "message", "note", "type", "eventTime", "firstTimestamp", "lastTimestamp", "count")
    kept = {k: event[k] for k in keys if event.get(k) is not None}
    kept["kind"] = "Event"
    kept["metadata"] = {
        k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
    }
    ref = involved(event)
    kept["involvedObject"] = {k: ref.get(k) for k in ("kind", "name", "namespace", "uid")}
    if event.get("series"):
        kept["series"] = event["series"]
    return kept


def trim_workload(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A Kueue Workload: what status derivation reads (spec.active and queueName, the status) and dispatch's
    mark among its annotations (`<domain>/kueue-deactivated`)."""
    meta = obj.get("metadata") or {}
    notes = meta.get("annotations") or {}
    kept: dict[str, Any] = {
        "kind": "Workload",
        "metadata": _meta(obj, annotations=[k for k in notes if str(k).endswith(f"/{KUEUE_MARK}")]),
    }
    spec = obj.get("spec") or {}
    kept["spec"] = {k: spec[k] for k in ("active", "queueName", "priority") if k in spec}
    kept["status"] = obj.get("status") or {}
    return kept


def _workload_owner(obj: Mapping[str, Any]) -> str:
    """The name of the TrainJob that controls the Workload (one of dispatch's names), else ""."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == "TrainJob" and ref.get("controller"):
            return str(ref.get("name") or "") if trainjob_name_prefix(str(ref.get("name") or "")) else ""
    return ""


def workload_key(obj: Mapping[str, Any]) -> Key | None:
    return key_of_trainjob_name(_workload_owner(obj))


TRIMS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "TrainJob": trim_owned,
    "JobSet": trim_owned,
    "Job": trim_owned,
    "Pod": trim_pod,
    "Event": trim_event,
}


def key_of_trainjob_name(name: str) -> Key | None:
    job_id, _, attempt = name.rpartition("-")
    return (job_id, int(attempt)) if job_id and attempt.isdigit() else None


def event_prefix(event: Mapping[str, Any]) -> str | None:
    return trainjob_name_prefix(str(involved(event).get("name", "")))


def job_index(domain: str) -> Callable[[Mapping[str, Any]], list[str]]:
    def index(obj: Mapping[str, Any]) -> list[str]:
        key = label_key(obj, domain)
        return [f"{key[0]}/{key[1]}"] if key else []

    return index
