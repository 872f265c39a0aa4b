"""make bench, supervision part (called by scripts/bench.py once Django is set up on PostgreSQL).

1. API requests per sync cycle, counted at the gateway, with 10, 100 and 1,000 active jobs on the local
   control plane. The TrainJobs are created directly with `managedBy: kueue.x-k8s.io/multikueue`, which the
   Trainer's controller leaves alone (no JobSets, no pods); each has its job and execution rows. Target: the
   same small number for all, at most 6.
2. Derivation time of one cycle (jobs.supervision.derive_all, pure) for 5,000 executions from recorded
   objects, divided by the time for 50. Target <= 120 (linear; 100 is exactly linear).
3. The time from a pod failing to the job's state changing, through `manage.py supervise`'s loop (its pod
   watch) against a real job on the local control plane; target < 2 s. And through the beat's periodic cycle
   alone (interval 2 s here): target within one interval + 1 s.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
NAMESPACE = "bench-supervision"
SIZES = (10, 100, 1000)


def _kube(kubeconfig: str) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration)


def _ensure_namespace(api_client: Any, name: str) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(api_client)
    try:
        core.create_namespace({"metadata": {"name": name}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_service_account("default", name)
            return
        except client.ApiException:
            time.sleep(0.2)


def requests_per_cycle(kubeconfig: str, owner: Any) -> list[dict[str, Any]]:
    from kubernetes import client

    from cluster import gateway
    from jobs.models import Execution, Job, JobState
    from jobs.naming import new_job_id, trainjob_name
    from jobs.supervision.watch import cycle

    api_client = _kube(kubeconfig)
    custom = client.CustomObjectsApi(api_client)
    _ensure_namespace(api_client, NAMESPACE)
    rows = []
    made = 0
    try:
        for size in SIZES:
            while made < size:
                job_id = new_job_id()
                name = trainjob_name(job_id, 1)
                custom.create_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    NAMESPACE,
                    "trainjobs",
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "TrainJob",
                        "metadata": {
                            "name": name,
                            "labels": {"dispatch.dev/job": job_id, "dispatch.dev/attempt": "1"},
                        },
                        "spec": {
                            "runtimeRef": {"name": "dispatch-kind"},
                            "managedBy": "kueue.x-k8s.io/multikueue",
                        },
                    },
                )
                job = Job.objects.create(
                    id=job_id,
                    owner=owner,
                    namespace=NAMESPACE,
                    runtime_kind="ClusterTrainingRuntime",
                    runtime_name="dispatch-kind",
                    spec={},
                    state=JobState.RUNNING,
                    current_attempt=1,
                )
                Execution.objects.create(
                    job=job,
                    attempt=1,
                    trainjob_name=name,
                    state=JobState.RUNNING,
                    submitted_at=datetime.now(UTC),
                )
                made += 1
            cycle.supervise(name="bench")  # the first cycle writes each job's state once
            before = gateway.requests_made.total
            report = cycle.supervise(name="bench")
            rows.append(
                {
                    "jobs": size,
                    "executions": report.executions,
                    "requests": gateway.requests_made.total - before,
                    "cycle_ms": report.duration_ms,
                }
            )
    finally:
        Job.objects.filter(namespace=NAMESPACE).delete()
        client.CoreV1Api(api_client).delete_namespace(NAMESPACE, propagation_policy="Background")
        api_client.close()
    return rows


def _recorded(count: int) -> tuple[Any, list[Any]]:
    """`count` executions' worth of objects as the API server would list them: a TrainJob, its JobSet, one
    Job, two running pods and two events each."""
    from cluster.gateway import Observed
    from jobs.supervision.cycle import Watched

    trainjobs, jobsets, jobs, pods, events, watched = [], [], [], [], [], []
    for i in range(count):
        job_id = "j" + format(i, "010d").translate(str.maketrans("0123456789", "abcdefghij"))
        name = f"{job_id}-1"
        labels = {"dispatch.dev/job": job_id, "dispatch.dev/attempt": "1"}
        meta = {"namespace": "team", "labels": labels, "creationTimestamp": "2026-11-30T10:00:00Z"}
        trainjobs.append(
            {"kind": "TrainJob", "metadata": {**meta, "name": name}, "status": {"conditions": []}}
        )
        jobsets.append({"kind": "JobSet", "metadata": {**meta, "name": name}, "status": {"restarts": 0}})
        jobs.append({"kind": "Job", "metadata": {**meta, "name": f"{name}-node-0"}, "status": {"active": 2}})
        for rank in range(2):
            pod_labels = {
                **labels,
                "batch.kubernetes.io/job-completion-index": str(rank),
                "jobset.sigs.k8s.io/restart-attempt": "0",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/job-index": "0",
            }
            pod_name = f"{name}-node-0-{rank}-abcde"
            pods.append(
                {
                    "kind": "Pod",
                    "metadata": {**meta, "name": pod_name, "uid": f"{job_id}-{rank}", "labels": pod_labels},
                    "spec": {"nodeName": "kwok-node-0"},
                    "status": {
                        "phase": "Running",
                        "conditions": [{"type": "PodScheduled", "status": "True"}],
                        "containerStatuses": [
                            {"name": "node", "restartCount": 0, "state": {"running": {"startedAt": "x"}}}
                        ],
                    },
                }
            )
            events.append(
                {
                    "kind": "Event",
                    "involvedObject": {"kind": "Pod", "namespace": "team", "name": pod_name},
                    "reason": "Scheduled",
                    "message": f"Successfully assigned team/{pod_name} to kwok-node-0",
                    "type": "Normal",
                    "eventTime": "2026-11-30T10:00:01.000000Z",
                }
            )
        watched.append(
            Watched(key=(job_id, 1), namespace="team", trainjob_name=name, memory={}, identity_warned=False)
        )
    nodes = [{"kind": "Node", "metadata": {"name": "kwok-node-0"}, "status": {"conditions": []}}]
    return Observed(trainjobs, jobsets, jobs, pods, events, nodes), watched


def derivation_scaling() -> dict[str, float]:
    from jobs.supervision.cycle import derive_all
    from jobs.waits import Thresholds

    now = datetime.now(UTC)

    def timed(count: int, repeat: int) -> float:
        observed, watched = _recorded(count)
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            statuses = derive_all(observed, watched, domain="dispatch.dev", now=now, thresholds=Thresholds())
            samples.append(time.perf_counter() - started)
            assert all(s.state == "running" for s in statuses.values()), "the recorded jobs should be running"
        return statistics.median(samples)

    small = timed(50, 21)
    large = timed(5000, 3)
    return {"small_s": small, "large_s": large, "ratio": large / small}


def _watch_loop(stop: threading.Event, interval: float) -> None:
    from django.db import connection

    from jobs.supervision.watch import run_forever

    try:
        run_forever(stop.is_set, interval=interval)
    finally:
        connection.close()


def _beat_loop(stop: threading.Event, interval: float) -> None:
    from django.db import connection

    from jobs.supervision.watch import cycle

    try:
        while not stop.is_set():
            cycle.supervise(name="bench-beat")
            stop.wait(interval)
    finally:
        connection.close()


def failure_latency(kubeconfig: str, owner: Any) -> list[dict[str, Any]]:
    """Seconds from a pod turning Failed (seen by our own watch) to the job's state change in the database."""
    from django.conf import settings
    from django.db import transaction
    from kubernetes import client, watch

    from jobs.models import Execution, Job, JobState
    from jobs.spec import JobSpec, RuntimeRef
    from jobs.submission import start

    settings.KUBECONFIG = kubeconfig
    api_client = _kube(kubeconfig)
    core = client.CoreV1Api(api_client)
    namespace = f"bench-latency-{uuid.uuid4().hex[:6]}"
    _ensure_namespace(api_client, namespace)
    rows = []
    try:
        for mode, interval in (("watch (manage.py supervise)", 10.0), ("periodic cycle only (beat)", 2.0)):
            spec = JobSpec(
                runtime=RuntimeRef(kind="ClusterTrainingRuntime", name="dispatch-kind", namespace=None),
                namespace=namespace,
                image="localhost/trainer:v1",
                num_nodes=2,
                env=(("KWOK_EXIT_CODE", "3"), ("KWOK_FAIL_RANK", "0"), ("KWOK_RUN_DURATION", "6s")),
                recovery_policy={"retry": {}},
            )
            with transaction.atomic():
                job = Job.objects.create(
                    owner=owner,
                    namespace=namespace,
                    runtime_kind="ClusterTrainingRuntime",
                    runtime_name="dispatch-kind",
                    spec=spec.to_dict(),
                    state=JobState.PENDING,
                )
                execution = Execution.objects.create(job=job, attempt=1, trainjob_name=f"{job.id}-1")
            start.execution_submit(execution_id=execution.pk)
            stop = threading.Event()
            target = _watch_loop if mode.startswith("watch") else _beat_loop
            thread = threading.Thread(target=target, args=(stop, interval), daemon=True)
            thread.start()
            failed_at = None
            stream = watch.Watch()
            for event in stream.stream(
                core.list_namespaced_pod,
                namespace,
                label_selector=f"dispatch.dev/job={job.id}",
                timeout_seconds=60,
            ):
                if event["object"].status.phase == "Failed":
                    failed_at = time.monotonic()
                    stream.stop()
            changed_at = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if Job.objects.filter(pk=job.pk, state__in=[JobState.FAILED, JobState.PENDING]).exists():
                    changed_at = time.monotonic()
                    break
                time.sleep(0.02)
            stop.set()
            thread.join(timeout=30)
            latency = (changed_at - failed_at) if failed_at and changed_at else float("nan")
            target_s = 2.0 if mode.startswith("watch") else interval + 1.0
            rows.append({"mode": mode, "interval": interval, "latency_s": latency, "target_s": target_s})
    finally:
        Job.objects.filter(namespace=namespace).delete()
        core.delete_namespace(namespace, propagation_policy="Background")
        api_client.close()
    return rows


def run(kubeconfig: str) -> dict[str, Any]:
    from django.conf import settings
    from django.contrib.auth.models import User

    settings.KUBECONFIG = kubeconfig
    from dispatch_site import roles
    from dispatch_site.services import user_create

    User.objects.filter(username="bench-supervision").delete()
    owner, _ = user_create(username="bench-supervision", role=roles.USER, namespaces=["*"])
    try:
        return {
            "requests": requests_per_cycle(kubeconfig, owner),
            "derivation": derivation_scaling(),
            "latency": failure_latency(kubeconfig, owner),
        }
    finally:
        owner.jobs.all().delete()
        owner.delete()


def report_lines(result: dict[str, Any]) -> list[str]:
    lines = ["", "## Supervision", ""]
    lines += ["| active jobs | executions in the cycle | API requests per cycle | cycle ms | target <= 6 |"]
    lines += ["|---|---|---|---|---|"]
    counts = {r["requests"] for r in result["requests"]}
    for r in result["requests"]:
        met = "yes" if r["requests"] <= 6 and len(counts) == 1 else "NO"
        lines.append(f"| {r['jobs']} | {r['executions']} | {r['requests']} | {r['cycle_ms']} | {met} |")
    d = result["derivation"]
    met = "yes" if d["ratio"] <= 120 else "NO"
    lines += [
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| derivation of one cycle, 5,000 / 50 executions ({d['large_s'] * 1000:.1f} ms / "
        f"{d['small_s'] * 1000:.2f} ms) | {d['ratio']:.0f} | <= 120 | {met} |",
    ]
    for r in result["latency"]:
        ok = r["latency_s"] == r["latency_s"] and r["latency_s"] <= r["target_s"]
        lines.append(
            f"| pod failed -> job state changed, {r['mode']}, interval {r['interval']:.0f} s | "
            f"{r['latency_s']:.2f} s | <= {r['target_s']:.0f} s | {'yes' if ok else 'NO'} |"
        )
    return lines
