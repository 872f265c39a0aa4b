"""make bench, supervision parts 2 and 3: one cycle's derivation from recorded objects (pure, 5,000 / 50
executions) and the beat's cycle alone (see scripts/bench_supervision.py)."""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from scripts.bench_supervision_stack import ensure_namespace, kube_client

# ---------------------------------------------------------------- derivation scaling (pure)


def _recorded(count: int) -> tuple[Any, list[Any]]:
    """`count` executions' worth of objects as the API server would list them: a TrainJob, its JobSet, one
    Job, two running pods (the owner chain by UID) and two events each."""
    from jobs.supervision.cycle import Watched
    from jobs.supervision.grouping import StaticIndex

    objects: list[dict[str, Any]] = []
    watched = []
    for i in range(count):
        job_id = "j" + format(i, "010d").translate(str.maketrans("0123456789", "abcdefghij"))
        name = f"{job_id}-1"
        labels = {"dispatch.dev/job": job_id, "dispatch.dev/attempt": "1"}
        meta = {"namespace": "team", "labels": labels, "creationTimestamp": "2026-11-30T10:00:00Z"}

        def owner(kind: str, owner_name: str, uid: str) -> dict[str, Any]:
            return {"ownerReferences": [{"kind": kind, "name": owner_name, "uid": uid, "controller": True}]}

        objects.append(
            {
                "kind": "TrainJob",
                "metadata": {**meta, "name": name, "uid": f"tj-{i}"},
                "status": {"conditions": []},
            }
        )
        objects.append(
            {
                "kind": "JobSet",
                "metadata": {**meta, "name": name, "uid": f"js-{i}", **owner("TrainJob", name, f"tj-{i}")},
                "status": {"restarts": 0},
            }
        )
        objects.append(
            {
                "kind": "Job",
                "metadata": {
                    **meta,
                    "name": f"{name}-node-0",
                    "uid": f"job-{i}",
                    **owner("JobSet", name, f"js-{i}"),
                },
                "status": {"active": 2},
            }
        )
        for rank in range(2):
            pod_labels = {
                **labels,
                "batch.kubernetes.io/job-completion-index": str(rank),
                "jobset.sigs.k8s.io/restart-attempt": "0",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/job-index": "0",
            }
            pod_name = f"{name}-node-0-{rank}-abcde"
            objects.append(
                {
                    "kind": "Pod",
                    "metadata": {
                        **meta,
                        "name": pod_name,
                        "uid": f"{job_id}-{rank}",
                        "labels": pod_labels,
                        **owner("Job", f"{name}-node-0", f"job-{i}"),
                    },
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
            objects.append(
                {
                    "kind": "Event",
                    "metadata": {
                        "namespace": "team",
                        "name": f"e-{job_id}-{rank}",
                        "uid": f"e-{job_id}-{rank}",
                    },
                    "involvedObject": {
                        "kind": "Pod",
                        "namespace": "team",
                        "name": pod_name,
                        "uid": f"{job_id}-{rank}",
                    },
                    "reason": "Scheduled",
                    "message": f"Successfully assigned team/{pod_name} to kwok-node-0",
                    "type": "Normal",
                    "eventTime": "2026-11-30T10:00:01.000000Z",
                }
            )
        watched.append(
            Watched(key=(job_id, 1), namespace="team", trainjob_name=name, memory={}, identity_warned=False)
        )
    return StaticIndex(objects, ["dispatch.dev"]), watched


def derivation_scaling() -> dict[str, float]:
    from jobs.supervision.cycle import derive_all
    from jobs.waits import Thresholds

    now = datetime.now(UTC)
    nodes = [{"kind": "Node", "metadata": {"name": "kwok-node-0"}, "status": {"conditions": []}}]

    def timed(count: int, repeat: int) -> float:
        index, watched = _recorded(count)
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            statuses = derive_all(index, watched, now=now, thresholds=Thresholds(), nodes=nodes)
            samples.append(time.perf_counter() - started)
            assert all(s.state == "running" for s in statuses.values()), "the recorded jobs should be running"
        return statistics.median(samples)

    small = timed(50, 21)
    large = timed(5000, 3)
    return {"small_s": small, "large_s": large, "ratio": large / small}


# ---------------------------------------------------------------- the beat's cycle alone


BEAT_ROUNDS = int(os.environ.get("BENCH_BEAT_ROUNDS", "3"))


def beat_latency(kubeconfig: str, owner: Any, rounds: int = BEAT_ROUNDS) -> dict[str, Any]:
    """The beat's latency, judged on the median of `rounds` rounds (issue 34: never one lucky or unlucky
    failure); a round whose job never changed state counts as infinitely late."""
    interval = 2.0
    return beat_summary([_beat_round(kubeconfig, owner, interval) for _ in range(rounds)], interval)


def beat_summary(latencies: list[float], interval: float) -> dict[str, Any]:
    """The beat's figure from its rounds' latencies: their median (NaN, a round whose job never changed state,
    counts as infinitely late); the target is the interval + 1 s."""
    latencies = [x if x == x else float("inf") for x in latencies]
    return {
        "interval": interval,
        "latency_s": statistics.median(latencies),
        "rounds": latencies,
        "target_s": interval + 1.0,
    }


def _beat_round(kubeconfig: str, owner: Any, interval: float) -> float:
    """Seconds from a pod turning Failed (seen by our own watch) to the job's state change in the database,
    with the beat's periodic cycle alone (plain list reads every `interval` s); NaN when either never came."""
    from django.db import connection, transaction
    from kubernetes import client, watch

    from jobs.models import Execution, Job, JobState
    from jobs.spec import JobSpec, RuntimeRef
    from jobs.submission import start
    from jobs.supervision import cycle

    api_client = kube_client(kubeconfig)
    core: Any = client.CoreV1Api(api_client)
    namespace = f"bench-latency-{uuid.uuid4().hex[:6]}"
    ensure_namespace(api_client, namespace)
    try:
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

        def beat() -> None:
            try:
                while not stop.is_set():
                    cycle.supervise(name="bench-beat")
                    stop.wait(interval)
            finally:
                connection.close()

        thread = threading.Thread(target=beat, daemon=True)
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
        return (changed_at - failed_at) if failed_at and changed_at else float("nan")
    finally:
        Job.objects.filter(namespace=namespace).delete()
        core.delete_namespace(namespace, propagation_policy="Background")
        api_client.close()
