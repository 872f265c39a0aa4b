"""make bench, Kueue part (scripts/bench_kueue.py): its settings and the cluster side: Kueue on the plane, the
bench's queue, bare TrainJobs, and the bench's own watches of Workloads and Pods."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.kueue_reads import Source, condition, is_true, start_watches, workload_owner  # noqa: E402 - needs the repository on sys.path first

NAMESPACE = "bench-kueue"
CLUSTER_QUEUE = "bench-kueue"
LOCAL_QUEUE = "bench"
USER = "bench-kueue"
ROUNDS = int(os.environ.get("BENCH_KUEUE_ROUNDS", "7"))
FAULT = os.environ.get("BENCH_KUEUE_FAULT", "")
FAULT_DELAY = 1.0  # slowcycle: seconds each supervision cycle waits before it reads anything
TARGET = 1.2
RANKS = 2
GPU_PER_NODE = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
QUOTA_GPUS = "2"  # exactly one job's
RUNTIME = "dispatch-kind"
IMAGE = "localhost/trainer:v1"
POLL = float(os.environ.get("BENCH_KUEUE_POLL", "0.02"))  # the dispatch side's GET period (s)
SETTLE = 1.0  # seconds the subject waits queued (all quiet) before the blocker goes
KUEUE = ("kueue.x-k8s.io", "v1beta2")
TRAINER = ("trainer.kubeflow.org", "v1alpha1")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


class Skip(Exception):
    """Kueue is not on the plane: the section is skipped with this message."""


def log(message: str) -> None:
    print(f"[bench kueue] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the cluster side


def apis(kubeconfig: str) -> tuple[Any, Any, Any]:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    api = client.ApiClient(configuration)
    return api, client.CustomObjectsApi(api), client.CoreV1Api(api)


def kueue_on_plane(api: Any) -> str:
    """'' when Kueue serves and runs on the plane, else why not (the section's skip message)."""
    from kubernetes import client

    try:
        groups = client.ApisApi(api).get_api_versions().groups
    except client.ApiException as exc:
        return f"the API server did not list its API groups ({exc.status})"
    if not any(g.name == KUEUE[0] and any(v.version == KUEUE[1] for v in g.versions) for g in groups):
        return f"no {KUEUE[0]}/{KUEUE[1]} API on the plane (start it with `scripts/cluster up --kueue`)"
    hooks = client.AdmissionregistrationV1Api(api).list_mutating_webhook_configuration().items
    if not any(h.metadata and h.metadata.name == "kueue-mutating-webhook-configuration" for h in hooks):
        return "Kueue's CRDs are there but its webhooks are not registered (`scripts/cluster up --kueue`)"
    return ""


def local_kubeconfig() -> Path:
    """The local control plane's admin kubeconfig (scripts/cluster's state directory)."""
    state = Path(os.environ.get("DISPATCH_CLUSTER_STATE", str(REPO / "var" / "cluster")))
    return state / "admin.kubeconfig"


def kueue_up(kubeconfig: str) -> bool:
    """On the local control plane without Kueue: `scripts/cluster up --kueue` (as the Kueue tests' fixture
    does); True when this started it (the caller stops it again with kueue_down, so the other sections run
    on the plane they always ran on). Another cluster is left as it is."""
    api, _, _ = apis(kubeconfig)
    try:
        if not kueue_on_plane(api):
            return False
    finally:
        api.close()
    if Path(kubeconfig).resolve() != local_kubeconfig().resolve():
        return False
    log("starting Kueue on the local control plane (scripts/cluster up --kueue) ...")
    up = subprocess.run(
        [str(REPO / "scripts" / "cluster"), "up", "--kueue"], capture_output=True, text=True, check=False
    )
    if up.returncode != 0:
        log(f"scripts/cluster up --kueue failed (the section will be skipped):\n{up.stderr[-2000:]}")
        return False
    return True


def kueue_down() -> None:
    subprocess.run([str(REPO / "scripts" / "cluster"), "down", "--kueue"], capture_output=True, check=False)


def ensure_queue(api: Any, custom: Any, core: Any) -> None:
    """The bench's namespace, ClusterQueue (quota: one job) and LocalQueue; waits for Kueue to make the
    ClusterQueue Active (only a running Kueue does), else Skip."""
    from kubernetes import client

    from scripts.bench_sessions import _ensure_namespace

    _ensure_namespace(core, NAMESPACE)
    flavors = custom.list_cluster_custom_object(*KUEUE, "resourceflavors")["items"]
    if not any(f["metadata"]["name"] == "dispatch-kwok" for f in flavors):
        raise Skip(
            "no ResourceFlavor dispatch-kwok (scripts/k8s/kueue-queues.yaml, `scripts/cluster up --kueue`)"
        )
    cq = {
        "apiVersion": "/".join(KUEUE),
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE},
            },
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "dispatch-kwok",
                            "resources": [
                                {"name": "cpu", "nominalQuota": "4"},
                                {"name": "memory", "nominalQuota": "16Gi"},
                                {"name": "nvidia.com/gpu", "nominalQuota": QUOTA_GPUS},
                            ],
                        }
                    ],
                }
            ],
        },
    }
    lq = {
        "apiVersion": "/".join(KUEUE),
        "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE},
        "spec": {"clusterQueue": CLUSTER_QUEUE},
    }
    for create in (
        lambda: custom.create_cluster_custom_object(*KUEUE, "clusterqueues", cq),
        lambda: custom.create_namespaced_custom_object(*KUEUE, NAMESPACE, "localqueues", lq),
    ):
        try:
            create()
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        got = custom.get_cluster_custom_object(*KUEUE, "clusterqueues", CLUSTER_QUEUE)
        local = custom.get_namespaced_custom_object(*KUEUE, NAMESPACE, "localqueues", LOCAL_QUEUE)
        if is_true(got, "Active") and is_true(local, "Active"):
            return
        time.sleep(0.2)
    raise Skip(f"Kueue did not make ClusterQueue {CLUSTER_QUEUE} Active within 20 s: is Kueue running?")


def bare_trainjob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "/".join(TRAINER),
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: LOCAL_QUEUE}},
        "spec": {
            "runtimeRef": {"name": RUNTIME},
            "trainer": {
                "numNodes": RANKS,
                "image": IMAGE,
                "env": [{"name": "KWOK_STAY_RUNNING", "value": "1"}],
                "resourcesPerNode": GPU_PER_NODE,
            },
        },
    }


class Watches:
    """The bench's own watches of the namespace's Workloads and Pods: every event with the monotonic time it
    arrived (a list, then a watch from its resourceVersion, so nothing after start() is missed)."""

    def __init__(self, api: Any, custom: Any, core: Any) -> None:
        self.api, self.custom, self.core = api, custom, core
        self.events: list[tuple[float, str, str, dict[str, Any]]] = []  # (at, kind, type, object)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self) -> Watches:
        sources: list[Source] = [
            ("Workload", self.custom.list_namespaced_custom_object, (*KUEUE, NAMESPACE, "workloads")),
            ("Pod", self.core.list_namespaced_pod, (NAMESPACE,)),
        ]
        self._threads = start_watches(sources, self._record, stop=self._stop, errors=self.errors)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)

    def _record(self, kind: str, type_: str, raw: Any) -> dict[str, Any]:
        at = time.monotonic()
        obj = raw if isinstance(raw, dict) else self.api.sanitize_for_serialization(raw)
        with self._lock:
            self.events.append((at, kind, type_, obj))
        return obj

    def since(self, at: float, kind: str) -> list[tuple[float, str, dict[str, Any]]]:
        with self._lock:
            return [(t, typ, obj) for t, k, typ, obj in self.events if k == kind and t >= at]

    # What the events say, each the first instant (after `after`) at which it held.

    def workload_released(self, trainjob: str, after: float) -> float | None:
        """The blocker's Workload is being deleted (deletionTimestamp, or DELETED): quota frees."""
        for at, typ, obj in self.since(after, "Workload"):
            if workload_owner(obj) == trainjob and (
                typ == "DELETED" or obj["metadata"].get("deletionTimestamp")
            ):
                return at
        return None

    def workload_gone(self, trainjob: str, after: float) -> float | None:
        """The blocker's Workload DELETED (its finalizer removed)."""
        for at, typ, obj in self.since(after, "Workload"):
            if workload_owner(obj) == trainjob and typ == "DELETED":
                return at
        return None

    def workload_state(
        self, trainjob: str, after: float, test: Callable[[dict[str, Any]], bool]
    ) -> float | None:
        for at, typ, obj in self.since(after, "Workload"):
            if workload_owner(obj) == trainjob and typ != "DELETED" and test(obj):
                return at
        return None

    def pods_running(self, trainjob: str, after: float) -> float | None:
        """All RANKS pods of the TrainJob Running (none being deleted), replayed from every pod event."""
        state: dict[str, bool] = {}
        for at, typ, obj in self.since(0.0, "Pod"):
            meta = obj["metadata"]
            if (meta.get("labels") or {}).get(JOBSET_LABEL) != trainjob:
                continue
            if typ == "DELETED":
                state.pop(meta["name"], None)
            else:
                running = (obj.get("status") or {}).get("phase") == "Running" and not meta.get(
                    "deletion_timestamp", meta.get("deletionTimestamp")
                )
                state[meta["name"]] = running
            if at >= after and len(state) == RANKS and all(state.values()):
                return at
        return None

    def wait(self, what: str, probe: Callable[[], float | None], timeout: float = 90) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.errors:
                raise RuntimeError(f"the bench's watches failed: {self.errors!r}")
            found = probe()
            if found is not None:
                return found
            time.sleep(0.01)
        raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def pending(workload: dict[str, Any]) -> bool:
    """Created and waiting for quota: QuotaReserved False (Kueue tried and it did not fit)."""
    cond = condition(workload, "QuotaReserved")
    return bool(cond and cond.get("status") == "False")


def reserved(workload: dict[str, Any]) -> bool:
    return is_true(workload, "QuotaReserved")


def empty_namespace(custom: Any, core: Any) -> None:
    """No TrainJob, runtime copy, Workload or pod left in the namespace (the quota is free)."""
    from kubernetes.client import V1DeleteOptions

    for plural in ("trainjobs", "trainingruntimes"):
        custom.delete_collection_namespaced_custom_object(
            *TRAINER, NAMESPACE, plural, body=V1DeleteOptions(propagation_policy="Background")
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        left = (
            len(custom.list_namespaced_custom_object(*TRAINER, NAMESPACE, "trainjobs")["items"])
            + len(custom.list_namespaced_custom_object(*TRAINER, NAMESPACE, "trainingruntimes")["items"])
            + len(custom.list_namespaced_custom_object(*KUEUE, NAMESPACE, "workloads")["items"])
            + len(core.list_namespaced_pod(NAMESPACE).items)
        )
        if left == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"namespace {NAMESPACE} did not empty within 120 s")
