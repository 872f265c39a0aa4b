"""make bench, supervision part 1: watches at scale (10, 100, 1,000 running jobs on real KWOK pods, one
supervisor process; see scripts/bench_supervision.py)."""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from scripts.bench_supervision_stack import (
    FAIL,
    FAULT,
    INTERVAL,
    NAMESPACE,
    QUIET_CYCLES,
    RANKS,
    REPO,
    SIZES,
    Supervisor,
    ensure_namespace,
    kube_client,
    log,
    make_nodes,
)


def _start_jobs(owner: Any, count: int) -> list[str]:
    """`count` jobs of RANKS ranks, each started through dispatch's start path, 8 at a time."""
    from django.db import connection, transaction

    from jobs.models import Execution, Job, JobState
    from jobs.spec import JobSpec, RuntimeRef
    from jobs.submission import start

    spec = JobSpec(
        runtime=RuntimeRef(kind="ClusterTrainingRuntime", name="dispatch-kind", namespace=None),
        namespace=NAMESPACE,
        image="localhost/trainer:v1",
        num_nodes=RANKS,
        env=(("KWOK_STAY_RUNNING", "1"),),
        recovery_policy={"retry": {}},
    )
    executions = []
    with transaction.atomic():
        for _ in range(count):
            job = Job.objects.create(
                owner=owner,
                namespace=NAMESPACE,
                runtime_kind="ClusterTrainingRuntime",
                runtime_name="dispatch-kind",
                spec=spec.to_dict(),
                state=JobState.PENDING,
                label_domain="dispatch.dev",
            )
            executions.append(Execution.objects.create(job=job, attempt=1, trainjob_name=f"{job.id}-1").pk)

    def one(pk: int) -> None:
        try:
            for _ in range(5):
                try:
                    start.execution_submit(execution_id=pk)
                    return
                except Exception as exc:  # a transient error: the worker would retry it
                    log(f"start {pk}: {exc}; again")
                    time.sleep(1)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, executions))
    return list(Execution.objects.filter(pk__in=executions).values_list("job_id", flat=True))


def _wait_running(core: Any, jobs: set[str], timeout: float = 1800) -> None:
    """Until every pod of these jobs runs (KWOK) and dispatch reads every job running."""
    from jobs.models import Job, JobState

    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(
            NAMESPACE,
            label_selector="dispatch.dev/job",
            field_selector="status.phase=Running",
            _preload_content=False,
            _request_timeout=120,
        )
        items = json.loads(pods.data)["items"]
        running = sum(1 for p in items if p["metadata"]["labels"].get("dispatch.dev/job") in jobs)
        read = Job.objects.filter(pk__in=jobs, state=JobState.RUNNING).count()
        status = f"{running}/{len(jobs) * RANKS} pods running, {read}/{len(jobs)} jobs read running"
        if status != last:
            log(status)
            last = status
        if running == len(jobs) * RANKS and read == len(jobs):
            return
        time.sleep(3)
    raise RuntimeError(f"not all running after {timeout} s: {last}")


def _quiet(
    supervisor: Supervisor, timeout: float = 600, count: int = QUIET_CYCLES, since: float | None = None
) -> list[dict[str, Any]]:
    """`count` consecutive cycles (ended after `since`) of a settled cluster: nothing changed state, none was
    a tracking resync. (With watches such a cycle derives nothing; a list-reading one derives everything.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recent = supervisor.since(time.time() - 60 if since is None else since)[-count:]
        if len(recent) == count and all(
            r["transitions"] == 0 and not r["resynced"] and (r["derived"] == 0 or FAULT) for r in recent
        ):
            return recent
        time.sleep(INTERVAL)
    raise RuntimeError("no quiet cycles")


def _fail_pods(core: Any, jobs: list[str], count: int) -> dict[str, float]:
    """One pod of each of `count` jobs fails (its status written as a kubelet would: the container exited
    with code 1); the time each patch was answered."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    failed_at: dict[str, float] = {}
    chosen = jobs[:count]
    pods = json.loads(
        core.list_namespaced_pod(
            NAMESPACE, label_selector="dispatch.dev/job", _preload_content=False, _request_timeout=120
        ).data
    )["items"]
    by_job: dict[str, dict[str, Any]] = {}
    for pod in pods:
        job = pod["metadata"]["labels"].get("dispatch.dev/job")
        if job in chosen and pod["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "0":
            by_job[job] = pod
    for job in chosen:
        pod = by_job[job]
        container = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "node")
        core.patch_namespaced_pod_status(
            pod["metadata"]["name"],
            NAMESPACE,
            {
                "status": {
                    "phase": "Failed",
                    "containerStatuses": [
                        {
                            "name": "node",
                            "image": container["image"],
                            "imageID": container.get("imageID", ""),
                            "ready": False,
                            "restartCount": 0,
                            "started": False,
                            "state": {
                                "terminated": {
                                    "exitCode": 1,
                                    "reason": "Error",
                                    "startedAt": now,
                                    "finishedAt": now,
                                }
                            },
                        }
                    ],
                }
            },
        )
        failed_at[job] = time.monotonic()
    return failed_at


def _changed(failed_at: dict[str, float], timeout: float = 120) -> dict[str, float]:
    from jobs.models import Job, JobState

    changed: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(changed) < len(failed_at) and time.monotonic() < deadline:
        states = Job.objects.filter(pk__in=set(failed_at) - set(changed)).values_list("pk", "state")
        now = time.monotonic()
        for pk, state in states:
            if state != JobState.RUNNING:
                changed[pk] = now
        time.sleep(0.05)
    return changed


def _summary(cycles: list[dict[str, Any]]) -> dict[str, Any]:
    if not cycles:
        return {"cycles": 0}
    return {
        "cycles": len(cycles),
        "derived": sum(c["derived"] for c in cycles),
        "api_requests": sum(c["api_requests"] for c in cycles),
        "lists": sum(c["lists"] for c in cycles),
        "gets": sum(c["gets"] for c in cycles),
        "bytes": sum(c["bytes_received"] for c in cycles),
        "cpu_ms": sum(c["cpu_ms"] for c in cycles),
        "prepare_cpu_ms": sum(c["prepare_cpu_ms"] for c in cycles),
        "transitions": sum(c["transitions"] for c in cycles),
    }


def watch_bench(kubeconfig: str, owner: Any) -> list[dict[str, Any]]:
    from kubernetes import client

    from jobs.models import Job

    api_client = kube_client(kubeconfig)
    core: Any = client.CoreV1Api(api_client)
    ensure_namespace(api_client, NAMESPACE)
    nodes = make_nodes(api_client, max(1, -(-max(SIZES) * RANKS // 1000)))
    supervisor = Supervisor({"KUBECONFIG": kubeconfig, "LOG_LEVEL": "WARNING"})
    rows = []
    running: list[str] = []
    try:
        for size in SIZES:
            need = size - len(running)
            log(f"{size} jobs: starting {need} more through dispatch's start path ...")
            started = time.monotonic()
            running += _start_jobs(owner, need)
            _wait_running(core, set(running))
            log(f"{size} jobs running ({time.monotonic() - started:.0f} s); waiting for quiet cycles ...")
            quiet = _quiet(supervisor)
            cpu_window = supervisor.cpu_seconds()
            time.sleep(10)
            idle_cpu = (supervisor.cpu_seconds() - cpu_window) / 10
            rss = supervisor.rss_kib()
            traffic = quiet[-1].get("process_traffic", {})
            count = int(FAIL) if FAIL else max(1, round(size * RANKS / 100))
            log(f"{size} jobs: {count} pod(s) fail ...")
            mark = time.time()
            failed_at = _fail_pods(core, running, count)
            changed = _changed(failed_at)
            latencies = sorted(changed[j] - failed_at[j] for j in changed)
            _quiet(supervisor, count=1, since=time.time())  # the cycles that wrote the changes have reported
            after = supervisor.since(mark)
            states = dict(Job.objects.filter(pk__in=failed_at).values_list("pk", "state"))
            rows.append(
                {
                    "jobs": size,
                    "pods": size * RANKS,
                    "quiet": {
                        "api_requests": max(q["api_requests"] for q in quiet),
                        "lists": max(q["lists"] for q in quiet),
                        "gets": max(q["gets"] for q in quiet),
                        "bytes": max(q["bytes_received"] for q in quiet),
                        "cpu_ms": statistics.median(q["cpu_ms"] for q in quiet),
                        "prepare_cpu_ms": statistics.median(q["prepare_cpu_ms"] for q in quiet),
                        "informers": quiet[-1].get("informers", 0),
                        "cached": quiet[-1].get("cached", 0),
                    },
                    "idle_cpu_per_s": idle_cpu,
                    "process_traffic": traffic,
                    "rss_kib": rss,
                    "failures": count,
                    "changed": len(changed),
                    "failed_states": sorted(set(states.values())),
                    "latency_p50": statistics.median(latencies) if latencies else float("nan"),
                    "latency_p95": latencies[max(0, -(-95 * len(latencies) // 100) - 1)]
                    if latencies
                    else float("nan"),
                    "latency_max": latencies[-1] if latencies else float("nan"),
                    "after": _summary([c for c in after if c["derived"]]),
                    "resync": _summary([c for c in supervisor.since(0) if c["resynced"]][-1:]),
                }
            )
            log(f"{size} jobs: {json.dumps(rows[-1])}")
            running = [j for j in running if j not in failed_at]
    finally:
        supervisor.stop()
        out = REPO / "var" / "bench"
        out.mkdir(parents=True, exist_ok=True)
        supervisor.save(out / f"supervisor-cycles{'-' + FAULT if FAULT else ''}.jsonl")
        _cleanup(api_client, nodes)
    return rows


def _cleanup(api_client: Any, nodes: list[str]) -> None:
    from kubernetes import client

    from jobs.models import Job

    log("cleaning up: the namespace, the bench's nodes, the job rows ...")
    core: Any = client.CoreV1Api(api_client)
    Job.objects.filter(namespace=NAMESPACE).delete()
    try:
        core.delete_namespace(NAMESPACE, propagation_policy="Background")
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        try:
            core.read_namespace(NAMESPACE)
        except client.ApiException as exc:
            if exc.status == 404:
                break
        time.sleep(5)
    for name in nodes:
        with contextlib.suppress(client.ApiException):
            core.delete_node(name)
    api_client.close()
