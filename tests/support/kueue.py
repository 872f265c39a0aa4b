"""Helpers for tests against the real Kueue of the local control plane (scripts/cluster up --kueue).

Raw objects through the tests' own kubernetes client; nothing here uses dispatch's code (the condition reads
and the list-then-watch threads are scripts/kueue_reads.py's, shared with the Kueue bench).

- ``queued_trainjob``: a TrainJob on dispatch-kind labelled with a LocalQueue (and a WorkloadPriorityClass).
- ``workload_name``: the Workload name Kueue v0.19.2 gives a TrainJob (verified against the real Kueue).
- ``workload_of`` / ``wait_workload``: a TrainJob's Workload, found by the label ``kueue.x-k8s.io/job-uid``
  and checked through its controller ownerReference (name and UID).
- ``pending_workloads``: the visibility API's answer for a LocalQueue or a ClusterQueue.
- ``Recorder``: watches Pods, Jobs, JobSets, TrainJobs, Workloads and Events of a namespace, so a test sees
  objects Kueue deletes within milliseconds (preempted pods) and the order in which things happened.
- ``record_fixture``: with DISPATCH_RECORD_KUEUE_FIXTURES=1, writes real objects to
  tests/jobs/supervision/kueue-fixtures/<name>.json (managedFields stripped); otherwise does nothing.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException

from scripts.kueue_reads import Source, condition, start_watches
from scripts.kueue_reads import is_true as is_true  # re-exported: the Kueue tests import it from here
from tests.support.cluster import Kube, KueueQueue
from tests.support.dispatch import job_body

KUEUE = ("kueue.x-k8s.io", "v1beta2")
TRAINER = ("trainer.kubeflow.org", "v1alpha1")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
KUEUE_MANAGER = "kueue.x-k8s.io/manager"  # the TrainJob runtimePatch Kueue owns
RUNTIME = "dispatch-kind"  # scripts/k8s/dispatch-kind.yaml: 2 nodes x (100m cpu, 32Mi)
# One GPU per node: a 2-node TrainJob takes the ClusterQueue's whole nvidia.com/gpu quota (2).
ONE_GPU_PER_NODE = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
FIXTURES = Path(__file__).resolve().parents[1] / "jobs" / "supervision" / "kueue-fixtures"
POLL = 0.2


def queued_trainjob(
    kube: Kube,
    queue: KueueQueue,
    name: str,
    *,
    env: dict[str, str] | None = None,
    priority: str | None = None,
    gpus: bool = False,
) -> dict[str, Any]:
    """Create a TrainJob on dispatch-kind in ``queue``; returns the object as admitted (webhooks applied)."""
    labels = {QUEUE_LABEL: queue.name} | ({PRIORITY_LABEL: priority} if priority else {})
    trainer: dict[str, Any] = {}
    if env:
        trainer["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if gpus:
        trainer["resourcesPerNode"] = ONE_GPU_PER_NODE
    spec: dict[str, Any] = {"runtimeRef": {"name": RUNTIME}} | ({"trainer": trainer} if trainer else {})
    body = {
        "apiVersion": "/".join(TRAINER),
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }
    created: dict[str, Any] = kube.custom.create_namespaced_custom_object(
        *TRAINER, queue.namespace, "trainjobs", body
    )
    return created


def get_trainjob(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(*TRAINER, namespace, "trainjobs", name)
    return obj


def queue_job_body(queue: KueueQueue, **extra: Any) -> dict[str, Any]:
    """A POST /api/v1/jobs body on dispatch-kind in `queue`, one GPU per node (a 2-node job takes the whole
    quota), with `extra` fields."""
    return job_body(queue.namespace, queue_name=queue.name, resources_per_node=ONE_GPU_PER_NODE) | extra


def admitted(workload: dict[str, Any]) -> bool:
    return is_true(workload, "QuotaReserved") and is_true(workload, "Admitted")


def workload_name(trainjob_name: str, trainjob_uid: str) -> str:
    """Kueue's name for a TrainJob's Workload: "trainjob-<name>-" + the first 5 hex digits of
    sha1("TrainJob\\ntrainer.kubeflow.org\\n<name>\\n<uid>"), the prefix cut to 247 characters
    (kueue v0.19.2 pkg/controller/jobframework/workload_names.go; ShortWorkloadNames off)."""
    digest = hashlib.sha1(f"TrainJob\n{TRAINER[0]}\n{trainjob_name}\n{trainjob_uid}".encode()).hexdigest()
    return f"{f'trainjob-{trainjob_name}'[:247]}-{digest[:5]}"


def workload_of(kube: Kube, trainjob: dict[str, Any]) -> dict[str, Any] | None:
    """The TrainJob's Workload: labelled with its UID and controlled by it (name and UID)."""
    meta = trainjob["metadata"]
    items = kube.custom.list_namespaced_custom_object(
        *KUEUE, meta["namespace"], "workloads", label_selector=f"{JOB_UID_LABEL}={meta['uid']}"
    )["items"]
    owned = [
        w
        for w in items
        if any(
            ref.get("controller")
            and (ref["kind"], ref["name"], ref["uid"]) == ("TrainJob", meta["name"], meta["uid"])
            for ref in w["metadata"].get("ownerReferences") or []
        )
    ]
    assert len(owned) <= 1, [w["metadata"]["name"] for w in owned]
    return owned[0] if owned else None


def present(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    """The condition, which must be there."""
    cond = condition(obj, type_)
    assert cond is not None, f"no {type_} condition: {conditions_summary(obj)}"
    return cond


def conditions_summary(obj: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    if not obj:
        return []
    return [
        (c["type"], c["status"], c.get("reason", ""))
        for c in (obj.get("status") or {}).get("conditions") or []
    ]


def wait_for(
    what: str, probe: Callable[[], Any], timeout: float = 30, state: Callable[[], Any] | None = None
) -> Any:
    """Poll probe() until it returns something truthy; fail with the observed state after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            observed = state() if state else value
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; last observed: {observed!r}"
            )
        time.sleep(POLL)


def wait_workload(
    kube: Kube,
    trainjob: dict[str, Any],
    predicate: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = 30,
) -> dict[str, Any]:
    """Wait until the TrainJob's Workload satisfies predicate; returns it."""

    def probe() -> dict[str, Any] | None:
        wl = workload_of(kube, trainjob)
        return wl if wl is not None and predicate(wl) else None

    result: dict[str, Any] = wait_for(
        f"Workload of {trainjob['metadata']['name']}: {what}",
        probe,
        timeout,
        state=lambda: conditions_summary(workload_of(kube, trainjob)),
    )
    return result


def pending_workloads(kube: Kube, queue: KueueQueue, *, cluster_queue: bool = False) -> dict[str, Any]:
    """GET .../localqueues/<lq>/pendingworkloads (or .../clusterqueues/<cq>/pendingworkloads)."""
    path = (
        f"{VISIBILITY}/clusterqueues/{queue.cluster_queue}/pendingworkloads"
        if cluster_queue
        else f"{VISIBILITY}/namespaces/{queue.namespace}/localqueues/{queue.name}/pendingworkloads"
    )
    return raw_get(kube, path)


def raw_get(kube: Kube, path: str) -> dict[str, Any]:
    """GET an API path as JSON (an aggregated API, a subresource the generated client lacks)."""
    method, url, headers, body, post = kube.api_client.param_serialize(
        "GET", path, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
    )
    response = kube.api_client.call_api(method, url, header_params=headers, body=body, post_params=post)
    response.read()
    if not 200 <= response.status < 300:
        raise ApiException(http_resp=response)
    result: dict[str, Any] = json.loads(response.data or b"{}")
    return result


def trainjob_pods(kube: Kube, namespace: str, name: str) -> list[Any]:
    pods = kube.core.list_namespaced_pod(
        namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}"
    ).items
    return sorted(pods, key=lambda p: p.metadata.name)


def running_pods(kube: Kube, namespace: str, name: str, count: int) -> list[Any] | None:
    pods = [p for p in trainjob_pods(kube, namespace, name) if not p.metadata.deletion_timestamp]
    return pods if len(pods) == count and all(p.status.phase == "Running" for p in pods) else None


# ---------------------------------------------------------------- recording


API_VERSIONS = {"Pod": "v1", "Event": "v1", "Job": "batch/v1"}


def to_dict(kube: Kube, obj: Any, kind: str) -> dict[str, Any]:
    """A generated-client model as the API server's JSON, with its kind and apiVersion (which list items
    of the generated client lack)."""
    out: dict[str, Any] = obj if isinstance(obj, dict) else kube.api_client.sanitize_for_serialization(obj)
    if not out.get("kind"):
        out = {"apiVersion": API_VERSIONS[kind], "kind": kind} | out
    return out


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out.get("metadata", {}).pop("managedFields", None)
    return out


def as_list(*objects: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": [strip(o) for o in objects]}


def record_fixture(name: str, obj: dict[str, Any]) -> None:
    """Write a recorded object to tests/jobs/supervision/kueue-fixtures/<name>.json
    (DISPATCH_RECORD_KUEUE_FIXTURES=1)."""
    if os.environ.get("DISPATCH_RECORD_KUEUE_FIXTURES") != "1":
        return
    FIXTURES.mkdir(parents=True, exist_ok=True)
    (FIXTURES / f"{name}.json").write_text(json.dumps(strip(obj), indent=2, sort_keys=False) + "\n")


@dataclass(frozen=True)
class Observed:
    seconds: float  # since the recorder started
    kind: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]

    @property
    def name(self) -> str:
        name: str = self.obj["metadata"]["name"]
        return name


@dataclass
class Recorder:
    """Watches a namespace's Pods, Jobs, JobSets, TrainJobs, Workloads and Events from the test's own client.

    Each kind is listed once, then watched from that list's resourceVersion, so every change after start()
    is seen once, in the API server's order for that kind."""

    kube: Kube
    namespace: str
    seen: list[Observed] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _errors: list[BaseException] = field(default_factory=list)
    _t0: float = field(default_factory=time.monotonic)

    def start(self, kinds: tuple[str, ...] = ()) -> Recorder:
        """Watch every kind above, or only `kinds` (a plane without Kueue serves no Workloads)."""
        ns, kube = self.namespace, self.kube
        sources: list[Source] = [
            ("Pod", kube.core.list_namespaced_pod, (ns,)),
            ("Job", kube.batch.list_namespaced_job, (ns,)),
            ("Event", kube.core.list_namespaced_event, (ns,)),
            ("TrainJob", kube.custom.list_namespaced_custom_object, (*TRAINER, ns, "trainjobs")),
            ("JobSet", kube.custom.list_namespaced_custom_object, (*JOBSET, ns, "jobsets")),
            ("Workload", kube.custom.list_namespaced_custom_object, (*KUEUE, ns, "workloads")),
        ]
        if kinds:
            sources = [source for source in sources if source[0] in kinds]
        self._threads.extend(start_watches(sources, self._record, stop=self._stop, errors=self._errors))
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)
        if self._errors:
            raise AssertionError(f"the recorder's watches failed: {self._errors!r}")

    def _record(self, kind: str, type_: str, raw: Any) -> dict[str, Any]:
        obj = to_dict(self.kube, raw, kind)
        with self._lock:
            self.seen.append(Observed(time.monotonic() - self._t0, kind, type_, obj))
        return obj

    def of(self, kind: str, name: str | None = None) -> list[Observed]:
        with self._lock:
            return [o for o in self.seen if o.kind == kind and (name is None or o.name == name)]

    def last(self, kind: str, name: str) -> dict[str, Any]:
        observed = self.of(kind, name)
        assert observed, f"the recorder saw no {kind} {name}"
        return observed[-1].obj

    def events_for(self, kind: str, name: str) -> list[dict[str, Any]]:
        """core/v1 Events about one object, in the order they were first seen (repeats dropped)."""
        out: dict[str, dict[str, Any]] = {}
        for o in self.of("Event"):
            inv = o.obj.get("involved_object") or o.obj.get("involvedObject") or {}
            if inv.get("kind") == kind and inv.get("name") == name:
                out.setdefault(o.name, o.obj)
        return list(out.values())
