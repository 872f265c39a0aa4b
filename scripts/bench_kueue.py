"""make bench, Kueue part (issue 19): from the moment quota frees to a job running, a dispatch job against a
bare TrainJob that Kueue admits alone (target: dispatch / bare <= 1.2, the median of paired rounds).

Setup, on the local control plane with Kueue (`scripts/cluster up --kueue`): a namespace of the bench's own
with a LocalQueue on a ClusterQueue of its own whose quota fits exactly one job (nvidia.com/gpu 2; every job
here, dispatch's or bare, is dispatch-kind with 2 nodes x 1 GPU, and its pods stay running under KWOK).
A real dispatch runs beside it: a gunicorn server (the REST API), a Celery worker (threads pool; it starts
the job) and `manage.py supervise` (watches; a cycle as soon as something changed).

One round, for one side (rounds interleave: dispatch, bare, dispatch, bare, ... so drift hits both):
1. a "blocker" TrainJob (bare, in the queue) is admitted and its pods run: it holds the whole quota;
2. the subject waits in the queue: dispatch's job is submitted with POST /api/v1/jobs (queue_name) and read
   `queued` through GET /api/v1/jobs/<id>; the bare TrainJob is created straight through the kubernetes
   client. Either way its Workload is pending (QuotaReserved False) before the clock can start;
3. the blocker TrainJob is deleted. The clock starts at t0, the instant quota frees as the cluster shows it:
   the first watch event of the blocker's Workload that carries a deletionTimestamp (or is DELETED); Kueue
   releases a Workload's quota as it sees it being deleted. The same instant, observed the same way, for both
   sides;
4. the clock stops: for dispatch, when GET /api/v1/jobs/<id> first answers state `running` (the path a user
   sees; polled every POLL seconds, the time the answer arrived); for the bare TrainJob, when the bench's own
   pod watch first shows all its 2 pods Running (no deletionTimestamp).
The same watches give the steps between, for both sides: quota freed -> the subject's Workload has
QuotaReserved -> all its pods Running (and, for dispatch, -> dispatch says running).

Run alone: `python scripts/bench_kueue.py` (BENCH_KUEUE_ROUNDS=n pairs, default 7; BENCH_KUEUE_FAULT=slowcycle
makes every supervision cycle start 1 s late, a deliberate fault the figure must show and the target fail on).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

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


def _log(message: str) -> None:
    print(f"[bench kueue] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the cluster side


def _apis(kubeconfig: str) -> tuple[Any, Any, Any]:
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
    api, _, _ = _apis(kubeconfig)
    try:
        if not kueue_on_plane(api):
            return False
    finally:
        api.close()
    if Path(kubeconfig).resolve() != local_kubeconfig().resolve():
        return False
    _log("starting Kueue on the local control plane (scripts/cluster up --kueue) ...")
    up = subprocess.run(
        [str(REPO / "scripts" / "cluster"), "up", "--kueue"], capture_output=True, text=True, check=False
    )
    if up.returncode != 0:
        _log(f"scripts/cluster up --kueue failed (the section will be skipped):\n{up.stderr[-2000:]}")
        return False
    return True


def kueue_down() -> None:
    subprocess.run([str(REPO / "scripts" / "cluster"), "down", "--kueue"], capture_output=True, check=False)


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def _true(obj: dict[str, Any], type_: str) -> bool:
    cond = _condition(obj, type_)
    return bool(cond and cond.get("status") == "True")


def _ensure_queue(api: Any, custom: Any, core: Any) -> None:
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
        if _true(got, "Active") and _true(local, "Active"):
            return
        time.sleep(0.2)
    raise Skip(f"Kueue did not make ClusterQueue {CLUSTER_QUEUE} Active within 20 s: is Kueue running?")


def _bare_trainjob(name: str) -> dict[str, Any]:
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
        sources: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
            ("Workload", self.custom.list_namespaced_custom_object, (*KUEUE, NAMESPACE, "workloads")),
            ("Pod", self.core.list_namespaced_pod, (NAMESPACE,)),
        ]
        ready = threading.Barrier(len(sources) + 1)
        for kind, lister, args in sources:
            thread = threading.Thread(target=self._watch, args=(kind, lister, args, ready), daemon=True)
            thread.start()
            self._threads.append(thread)
        ready.wait(timeout=30)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)

    def _rv(self, listed: Any) -> str:
        meta = listed["metadata"] if isinstance(listed, dict) else listed.metadata
        return str(meta["resourceVersion"] if isinstance(meta, dict) else meta.resource_version)

    def _watch(
        self, kind: str, lister: Callable[..., Any], args: tuple[Any, ...], ready: threading.Barrier
    ) -> None:
        from kubernetes import client, watch

        serialize = self.api.sanitize_for_serialization
        try:
            rv = self._rv(lister(*args))
            ready.wait(timeout=30)
            while not self._stop.is_set():
                stream = watch.Watch()
                try:
                    for event in stream.stream(
                        lister, *args, resource_version=rv, timeout_seconds=2, _request_timeout=(5, 10)
                    ):
                        at = time.monotonic()
                        obj = event["object"]
                        obj = obj if isinstance(obj, dict) else serialize(obj)
                        rv = obj["metadata"]["resourceVersion"]
                        with self._lock:
                            self.events.append((at, kind, event["type"], obj))
                        if self._stop.is_set():
                            stream.stop()
                except client.ApiException as exc:
                    if exc.status != 410:
                        raise
                    rv = self._rv(lister(*args))
        except BaseException as exc:  # reported by the round that waits on it
            self.errors.append(exc)
            if not ready.broken:
                ready.abort()

    def since(self, at: float, kind: str) -> list[tuple[float, str, dict[str, Any]]]:
        with self._lock:
            return [(t, typ, obj) for t, k, typ, obj in self.events if k == kind and t >= at]

    # What the events say, each the first instant (after `after`) at which it held.

    def workload_released(self, trainjob: str, after: float) -> float | None:
        """The blocker's Workload is being deleted (deletionTimestamp, or DELETED): quota frees."""
        for at, typ, obj in self.since(after, "Workload"):
            if _owner(obj) == trainjob and (typ == "DELETED" or obj["metadata"].get("deletionTimestamp")):
                return at
        return None

    def workload_gone(self, trainjob: str, after: float) -> float | None:
        """The blocker's Workload DELETED (its finalizer removed)."""
        for at, typ, obj in self.since(after, "Workload"):
            if _owner(obj) == trainjob and typ == "DELETED":
                return at
        return None

    def workload_state(
        self, trainjob: str, after: float, test: Callable[[dict[str, Any]], bool]
    ) -> float | None:
        for at, typ, obj in self.since(after, "Workload"):
            if _owner(obj) == trainjob and typ != "DELETED" and test(obj):
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


def _owner(workload: dict[str, Any]) -> str | None:
    for ref in (
        workload["metadata"].get("ownerReferences") or workload["metadata"].get("owner_references") or []
    ):
        if ref.get("kind") == "TrainJob" and ref.get("controller"):
            return str(ref["name"])
    return None


def _pending(workload: dict[str, Any]) -> bool:
    """Created and waiting for quota: QuotaReserved False (Kueue tried and it did not fit)."""
    cond = _condition(workload, "QuotaReserved")
    return bool(cond and cond.get("status") == "False")


def _reserved(workload: dict[str, Any]) -> bool:
    return _true(workload, "QuotaReserved")


def _empty(custom: Any, core: Any) -> None:
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


# ---------------------------------------------------------------- dispatch's side


class Api:
    """dispatch's REST API over one kept-alive connection, as the bench user."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, etag: str = ""
    ) -> tuple[int, dict[str, Any], str]:
        """(status, body, ETag); with `etag`, If-None-Match: a 304 (unchanged) answers an empty body."""
        headers = {"Authorization": f"Token {self.token}", "Content-Type": "application/json"}
        if etag:
            headers["If-None-Match"] = etag
        payload = json.dumps(body) if body is not None else None
        for attempt in (1, 2):
            try:
                self.conn.request(method, f"/api/v1/{path}", body=payload, headers=headers)
                response = self.conn.getresponse()
                data = response.read()
                return response.status, json.loads(data or b"{}"), response.getheader("ETag") or ""
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def job(self, job_id: str, etag: str = "") -> tuple[dict[str, Any] | None, str]:
        """GET /api/v1/jobs/<id>: (the job, its ETag), or (None, etag) when unchanged since `etag`."""
        status, body, tag = self.call("GET", f"jobs/{job_id}", etag=etag)
        if status == 304:
            return None, etag
        if status != 200:
            raise RuntimeError(f"GET /api/v1/jobs/{job_id}: {status} {body}")
        return body, tag

    def state(self, job_id: str) -> str:
        body, _ = self.job(job_id)
        assert body is not None
        return str(body["state"])

    def wait_observed(self, job_id: str, timeout: float = 60) -> None:
        """Until the job reads `queued` and supervision has observed its execution (observed_at set): it
        is tracked and watched, as any job is that has waited in a queue longer than one supervision
        interval (a new execution is first tracked at the supervisor's next periodic cycle)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body, _ = self.job(job_id)
            assert body is not None
            executions = body.get("executions") or []
            if body["state"] == "queued" and executions and executions[-1].get("observed_at"):
                return
            time.sleep(0.1)
        raise RuntimeError(f"job {job_id}: supervision did not observe it queued within {timeout} s")

    def wait_state(self, job_id: str, states: set[str], timeout: float = 90) -> tuple[float, str]:
        """Poll until the job's state is one of `states`: (the instant that answer arrived, the state). As a
        polite client polls: If-None-Match with the last ETag, so an unchanged job costs a 304."""
        deadline = time.monotonic() + timeout
        state, etag = "", ""
        while time.monotonic() < deadline:
            body, etag = self.job(job_id, etag)
            at = time.monotonic()
            if body is not None:
                state = str(body["state"])
            if state in states:
                return at, state
            if state in ("failed", "cancelled", "succeeded", "identity-violation"):
                raise RuntimeError(f"job {job_id} ended {state} while the bench waited for {states}")
            time.sleep(POLL)
        raise RuntimeError(f"job {job_id} not {states} within {timeout} s (last: {state})")


def supervisor_main(fault: str) -> None:
    """`python scripts/bench_kueue.py supervisor [slowcycle]`: `manage.py supervise`, as it runs, with the
    deliberate fault when asked (each cycle starts FAULT_DELAY seconds late)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")
    import django

    django.setup()
    if fault == "slowcycle":
        from jobs.supervision import cycle

        original = cycle.supervise

        def late(*args: Any, **kwargs: Any) -> Any:
            time.sleep(FAULT_DELAY)
            return original(*args, **kwargs)

        cycle.supervise = late
    elif fault:
        sys.exit(f"unknown BENCH_KUEUE_FAULT {fault!r} (known: slowcycle)")
    if os.environ.get("BENCH_KUEUE_STATS") == "1":
        from jobs.supervision import cycle as traced

        inner = traced.supervise

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.monotonic()
            report = inner(*args, **kwargs)
            line = {"began": began, "ended": time.monotonic(), "derived": report.derived}
            print(
                json.dumps(line | {"transitions": report.transitions, "phases": report.phases_ms}), flush=True
            )
            return report

        traced.supervise = timed
    from django.core.management import call_command

    call_command("supervise")


def _processes(env: dict[str, str], log: Path, port: int) -> list[subprocess.Popen[bytes]]:
    """gunicorn (one sync worker), a Celery worker (threads) and the supervisor, all on `env`."""
    out = log.open("ab")
    py = sys.executable
    commands = [
        [
            str(Path(py).parent / "gunicorn"),
            "dispatch_site.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--log-level",
            "warning",
        ],
        [
            py,
            "-m",
            "celery",
            "-A",
            "dispatch_site",
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            "4",
            "--without-gossip",
            "--without-mingle",
            "-n",
            "bench-kueue@%h",
            "--loglevel",
            "WARNING",
        ],
        [py, str(Path(__file__).resolve()), "supervisor", FAULT],
    ]
    return [
        subprocess.Popen(c, cwd=REPO, env=os.environ | env, stdout=out, stderr=subprocess.STDOUT)
        for c in commands
    ]


# ---------------------------------------------------------------- one round


def _round(
    side: str, number: int, custom: Any, core: Any, watches: Watches, api: Api | None
) -> dict[str, Any]:
    _empty(custom, core)
    blocker = f"blocker-{side[0]}{number}"
    began = time.monotonic()
    custom.create_namespaced_custom_object(*TRAINER, NAMESPACE, "trainjobs", _bare_trainjob(blocker))
    watches.wait(f"{blocker}'s pods running", lambda: watches.pods_running(blocker, began))
    job_id = ""
    if side == "bare":
        subject = f"bare-{number}"
        custom.create_namespaced_custom_object(*TRAINER, NAMESPACE, "trainjobs", _bare_trainjob(subject))
    else:
        assert api is not None
        status, body, _ = api.call(
            "POST",
            "jobs",
            {
                "runtime": {"kind": "ClusterTrainingRuntime", "name": RUNTIME},
                "namespace": NAMESPACE,
                "image": IMAGE,
                "num_nodes": RANKS,
                "env": {"KWOK_STAY_RUNNING": "1"},
                "resources_per_node": GPU_PER_NODE,
                "queue_name": LOCAL_QUEUE,
            },
        )
        if status != 202:
            raise RuntimeError(f"POST /api/v1/jobs: {status} {body}")
        job_id = str(body["id"])
        subject = f"{job_id}-1"
        api.wait_observed(job_id)
    watches.wait(f"{subject}'s Workload pending", lambda: watches.workload_state(subject, began, _pending))
    if api is not None and job_id:
        state = api.state(job_id)
        if state != "queued":
            raise RuntimeError(f"job {job_id} reads {state} while its Workload waits for quota")
    time.sleep(SETTLE)
    deleted_at = time.monotonic()
    custom.delete_namespaced_custom_object(
        *TRAINER, NAMESPACE, "trainjobs", blocker, propagation_policy="Background"
    )
    end: float
    if side == "bare":
        end = watches.wait(f"{subject}'s pods running", lambda: watches.pods_running(subject, deleted_at))
    else:
        assert api is not None
        end, _ = api.wait_state(job_id, {"running"})
    freed = watches.wait(
        "the blocker's Workload released", lambda: watches.workload_released(blocker, deleted_at)
    )
    admitted = watches.wait(
        f"{subject} admitted", lambda: watches.workload_state(subject, deleted_at, _reserved)
    )
    pods = watches.wait(f"{subject}'s pods running", lambda: watches.pods_running(subject, deleted_at))
    gone = watches.wait("the blocker's Workload gone", lambda: watches.workload_gone(blocker, deleted_at))
    row = {
        "side": side,
        "round": number,
        "seconds": end - freed,
        "admit_s": admitted - freed,
        "pods_s": pods - admitted,
        "after_pods_s": end - pods,  # dispatch: pods running -> GET says running; bare: 0
        "delete_to_freed_s": freed - deleted_at,
        "freed_to_gone_s": gone - freed,  # deletionTimestamp seen -> the Workload DELETED
        "after_admit_s": end - admitted,  # admitted -> running: what follows Kueue's admission
    }
    if os.environ.get("BENCH_KUEUE_STATS") == "1":
        _log(
            f"monotonic: deleted {deleted_at:.3f} freed {freed:.3f} admitted {admitted:.3f} "
            f"pods {pods:.3f} end {end:.3f}"
        )
    _log(
        f"round {number} {side}: {row['seconds']:.3f} s (admitted {row['admit_s']:.3f}, pods running "
        f"+{row['pods_s']:.3f}, then +{row['after_pods_s']:.3f})"
    )
    if job_id and api is not None:
        api.call("POST", f"jobs/{job_id}/cancel", {})
        with contextlib.suppress(RuntimeError):
            api.wait_state(job_id, {"cancelled"}, timeout=30)
    return row


STEPS = ("admit_s", "pods_s", "after_pods_s", "delete_to_freed_s", "freed_to_gone_s", "after_admit_s")


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered) + 0.5) - 1))]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per side, and over the rounds' pairs (dispatch's round n against bare's round n)."""
    dispatch = [r for r in rows if r["side"] == "dispatch"]
    bare = [r for r in rows if r["side"] == "bare"]
    ratios = [d["seconds"] / b["seconds"] for d, b in zip(dispatch, bare, strict=False)]
    after_admit = [d["after_admit_s"] / b["after_admit_s"] for d, b in zip(dispatch, bare, strict=False)]

    def med(side: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in side)

    return {
        "pairs": len(ratios),
        "ratios": ratios,
        "ratio": statistics.median(ratios),
        "ratio_p95": _p95(ratios),
        "after_admit_ratio": statistics.median(after_admit),
        "dispatch_s": med(dispatch, "seconds"),
        "bare_s": med(bare, "seconds"),
        "dispatch_p95_s": _p95([r["seconds"] for r in dispatch]),
        "bare_p95_s": _p95([r["seconds"] for r in bare]),
        "steps": {
            side: {k: med(group, k) for k in STEPS}
            for side, group in (("dispatch", dispatch), ("bare", bare))
        },
    }


def run(kubeconfig: str, rounds: int = ROUNDS) -> dict[str, Any]:
    """The section: Django is set up (DATABASE_URL, the bench's settings); returns the rows and the summary,
    or {"skipped": why} when Kueue is not on the plane."""
    from django.conf import settings
    from django.contrib.auth.models import User

    from dispatch_site import roles
    from dispatch_site.services import user_create
    from runtimes.models import AllowListEntry
    from scripts.bench_common import free_port, redis_url, wait_http

    api_client, custom, core = _apis(kubeconfig)
    why = kueue_on_plane(api_client)
    if why:
        return {"skipped": why, "fault": FAULT}
    try:
        _ensure_queue(api_client, custom, core)
    except Skip as exc:
        return {"skipped": str(exc), "fault": FAULT}
    settings.KUBECONFIG = kubeconfig
    AllowListEntry.objects.get_or_create(kind="ClusterTrainingRuntime", namespace="", name=RUNTIME)
    User.objects.filter(username=USER).delete()
    owner, token = user_create(username=USER, role=roles.USER, namespaces=[NAMESPACE])
    env = {
        "DATABASE_URL": os.environ["DATABASE_URL"],
        "REDIS_URL": redis_url(),
        "KUBECONFIG": kubeconfig,
        "LOG_LEVEL": "WARNING",
        "THROTTLE_API_USER": "off",
        "DEBUG": "false",
        "SECRET_KEY": "bench-only-not-a-secret-0123456789-abcdefghijklmnopqrstuvwxyz",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECURE_SSL_REDIRECT": "false",
        "SECURE_HSTS_SECONDS": "0",
        "METRICS_PORT": "",  # none: the supervisor and worker serve no metrics port here
    }
    port = free_port()
    log = REPO / "var" / "bench-kueue.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    processes = _processes(env, log, port)
    watches = Watches(api_client, custom, core).start()
    rows: list[dict[str, Any]] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        api = Api(port, token)
        _log(f"{rounds} paired rounds (dispatch, bare, ...); logs in {log}")
        for number in range(1, rounds + 1):
            for side in ("dispatch", "bare"):
                rows.append(_round(side, number, custom, core, watches, api if side == "dispatch" else None))
    finally:
        watches.stop()
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        with contextlib.suppress(Exception):
            _empty(custom, core)
        owner.jobs.all().delete()
        owner.delete()
        api_client.close()
    return {"fault": FAULT, "rows": rows, **summarize(rows)}


def met(result: dict[str, Any]) -> bool:
    return bool(result.get("pairs")) and result["ratio"] <= TARGET


def report_lines(result: dict[str, Any]) -> list[str]:
    fault = (
        f" (deliberate fault: {result['fault']}, each supervision cycle {FAULT_DELAY:.0f} s late)"
        if result.get("fault")
        else ""
    )
    lines = ["", f"## Kueue: quota frees -> the job runs, dispatch / a bare TrainJob{fault}", ""]
    if result.get("skipped"):
        return [*lines, f"Skipped: {result['skipped']}."]
    lines += [
        f"A ClusterQueue whose quota fits one job (nvidia.com/gpu {QUOTA_GPUS}; each job dispatch-kind, "
        f"{RANKS} nodes x 1 GPU); a blocker TrainJob holds it, the subject waits queued, the blocker is "
        "deleted. The clock starts when the bench's Workload watch sees the blocker's Workload being deleted "
        "(quota frees), and stops when GET /api/v1/jobs/<id> first answers `running` (dispatch: gunicorn, a "
        f"Celery worker, `manage.py supervise`; polled every {POLL * 1000:.0f} ms) or when the bench's pod "
        f"watch sees all {RANKS} pods of the bare TrainJob Running. Rounds interleave dispatch, bare, ...",
        "",
        "| round | dispatch s | bare s | ratio | dispatch: admitted / pods running / GET running (s after "
        "freed) | bare: admitted / pods running |",
        "|---|---|---|---|---|---|",
    ]
    dispatch = [r for r in result["rows"] if r["side"] == "dispatch"]
    bare = [r for r in result["rows"] if r["side"] == "bare"]
    for d, b, ratio in zip(dispatch, bare, result["ratios"], strict=False):
        lines.append(
            f"| {d['round']} | {d['seconds']:.3f} | {b['seconds']:.3f} | {ratio:.2f} "
            f"| {d['admit_s']:.3f} / {d['admit_s'] + d['pods_s']:.3f} / {d['seconds']:.3f} "
            f"| {b['admit_s']:.3f} / {b['admit_s'] + b['pods_s']:.3f} |"
        )
    d, b = result["steps"]["dispatch"], result["steps"]["bare"]
    lines += [
        "",
        f"Medians of the steps (s), dispatch / bare: quota freed -> the subject's Workload has "
        f"QuotaReserved {d['admit_s']:.3f} / {b['admit_s']:.3f} (Kueue alone; the blocker's Workload is "
        f"DELETED {d['freed_to_gone_s']:.3f} / {b['freed_to_gone_s']:.3f} after it starts being deleted); "
        f"admitted -> all pods Running {d['pods_s']:.3f} / {b['pods_s']:.3f}; pods Running -> dispatch's GET "
        f"says running {d['after_pods_s']:.3f}. From admission on (admitted -> running) dispatch / bare is "
        f"{result['after_admit_ratio']:.2f} (median of the pairs; no target: the issue's figure starts when "
        "quota frees).",
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| quota frees -> running, dispatch / bare TrainJob, median of {result['pairs']} paired rounds "
        f"(medians {result['dispatch_s']:.3f} / {result['bare_s']:.3f} s; p95 "
        f"{result['dispatch_p95_s']:.3f} / {result['bare_p95_s']:.3f} s; "
        f"ratio p95 {result['ratio_p95']:.2f}) "
        f"| {result['ratio']:.2f} | <= {TARGET} | {'yes' if met(result) else 'NO'} |",
    ]
    return lines


def main() -> None:
    """Alone: Django on DATABASE_URL, the local control plane with Kueue (KUBECONFIG or scripts/cluster up
    --kueue; Kueue started on the local plane if it is not there, and stopped again after). Writes
    var/bench/kueue[-fault].md and .json (or in BENCH_KUEUE_OUT); exits 1 when the target is not met."""
    if not os.environ.get("KUBECONFIG"):
        up = subprocess.run(
            [str(REPO / "scripts" / "cluster"), "up", "--kueue"], capture_output=True, text=True, check=False
        )
        if up.returncode != 0:
            sys.exit(f"scripts/cluster up --kueue failed:\n{up.stderr[-3000:]}")
        os.environ["KUBECONFIG"] = up.stdout.strip().splitlines()[-1]
    kubeconfig = os.environ["KUBECONFIG"]
    started = kueue_up(kubeconfig)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    try:
        result = run(kubeconfig)
    finally:
        if started:
            kueue_down()
    report = "\n".join(report_lines(result)) + "\n"
    out = Path(os.environ.get("BENCH_KUEUE_OUT", str(REPO / "var" / "bench")))
    out.mkdir(parents=True, exist_ok=True)
    name = f"kueue{'-' + FAULT if FAULT else ''}"
    (out / f"{name}.md").write_text(report)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
    print(report)
    if not result.get("skipped") and not met(result):
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "supervisor":
        supervisor_main(sys.argv[2] if len(sys.argv) > 2 else "")
    else:
        main()
