"""make bench, MultiKueue part (issue 35): the supervisor's cycle with executions on two workers against one.

The production path as `make up` runs it: `manage.py supervise`'s CacheSource (jobs.supervision.cache, its
workers' watches jobs.supervision.worker_watch) and jobs.supervision.cycle.supervise, on PostgreSQL rows for
the executions (a job on the LocalQueue `multi`, running, admitted to a worker: Execution.cluster). Side "1
worker": N executions on worker-1; side "2 workers": N on worker-1 and N on worker-2 (2N, the work doubles).
Each round measures both sides back to back: a fresh CacheSource tracks the side's executions (prepare), one
cycle settles them (pods seen, running), then CYCLES cycles each with every execution due, as when every
object changed; the side's figure is the median CPU time of the cycle thread (CycleReport.cpu_ms) over them.
The target is judged on the median of the rounds' ratios (2 workers / 1), <= 2.2.

The cluster objects are recorded, not listed: the informers the CacheSource starts (on the manager: the
TrainJob and its Workload naming the worker in status.clusterName; on each worker: MultiKueue's TrainJob
copy, its JobSet, Job, two running pods and their Events) are cluster.informer.Informer with their store,
trim, keep and indices, filled from the recording instead of a list call. Why that measures the second
worker's cost honestly: once a worker's watches are synced, a supervisor cycle makes no API call there
(tests/jobs/test_multikueue_jobs.py asserts it on the real planes); what the worker costs a cycle is its
reads from the watched copy (WorkerIndex lookups), grouping and derivation, and the database work, all of
which run here as in production. Not measured: the informers' watch traffic between cycles, and the beat's
cycle (plain list calls on each worker, jobs.supervision.reads.read_workers).

Run alone: `python scripts/bench_multikueue.py` (Django on DATABASE_URL; BENCH_MULTIKUEUE_EXECUTIONS=N per
worker, default 100).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.bench_common import Target, log  # noqa: E402

NAMESPACE = "default"  # MultiKueue's queue `multi` is in `default` on the local planes
QUEUE = "multi"
DOMAIN = "dispatch.dev"
WORKERS = ("worker-1", "worker-2")
EXECUTIONS = int(os.environ.get("BENCH_MULTIKUEUE_EXECUTIONS", "100"))  # per worker
ROUNDS = int(os.environ.get("BENCH_MULTIKUEUE_ROUNDS", "5"))
CYCLES = int(os.environ.get("BENCH_MULTIKUEUE_CYCLES", "5"))  # measured cycles per side and round
TARGET = 2.2
OWNER = "bench-multikueue"
FIXTURE = REPO / "tests" / "jobs" / "supervision" / "kueue-fixtures" / "admitted-running.json"

Recording = dict[tuple[str, str, str], list[dict[str, Any]]]  # (cluster, namespace, kind) -> objects


# ---------------------------------------------------------------- the verdict (pure)


def verdict(rounds: Sequence[Mapping[str, float]]) -> Target:
    """2 workers / 1 worker: each round's ratio of its two sides' cycle CPU (measured back to back), judged
    on the median of the rounds' ratios (never the best round); a round with no figure is a miss."""
    ratios = [r["two_ms"] / r["one_ms"] for r in rounds if r.get("one_ms", 0) > 0 and r.get("two_ms", 0) > 0]
    measure = "supervision cycle, 2N executions on 2 workers / N on 1 (CPU of the cycle)"
    if not ratios or len(ratios) != len(rounds):
        return Target(measure, "a round measured nothing", f"<= {TARGET}", False)
    ratio = statistics.median(ratios)
    return Target(
        measure,
        f"{ratio:.2f}",
        f"<= {TARGET}",
        ratio <= TARGET,
        f"median of {len(ratios)} rounds' ratios ({', '.join(f'{x:.2f}' for x in ratios)})",
    )


# ---------------------------------------------------------------- the recorded objects


def _owner(kind: str, name: str, uid: str, api: str) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True}


def record(executions: Mapping[str, Sequence[tuple[str, str]]]) -> Recording:
    """worker -> [(job id, TrainJob UID)]: the objects each plane would list for those executions, as
    MultiKueue leaves them once a worker runs the attempt. The manager's TrainJob and Workload are the
    recorded Kueue v0.19.2 objects of tests/jobs/supervision/kueue-fixtures/admitted-running.json, renamed,
    the Workload's status.clusterName naming the worker."""
    from jobs.naming import PREBUILT_WORKLOAD

    items = json.loads(FIXTURE.read_text())["items"]
    trainjob0 = next(o for o in items if o["kind"] == "TrainJob")
    workload0 = next(o for o in items if o["kind"] == "Workload")
    out: Recording = {}
    trainer, jobset_api = "trainer.kubeflow.org/v1alpha1", "jobset.x-k8s.io/v1alpha2"
    for worker, jobs in executions.items():
        for job_id, uid in jobs:
            name = f"{job_id}-1"
            labels = {
                f"{DOMAIN}/job": job_id,
                f"{DOMAIN}/attempt": "1",
                "app.kubernetes.io/managed-by": "dispatch",
            }
            meta = {
                "namespace": NAMESPACE,
                "creationTimestamp": "2026-12-01T08:48:57Z",
                "resourceVersion": "1",
            }
            trainjob = copy.deepcopy(trainjob0)
            trainjob["metadata"] = {
                **meta,
                "name": name,
                "uid": uid,
                "labels": {**labels, "kueue.x-k8s.io/queue-name": QUEUE},
            }
            trainjob["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
            workload = copy.deepcopy(workload0)
            workload_name = f"trainjob-{name}-0a1b2"
            workload["metadata"] = {
                **meta,
                "name": workload_name,
                "uid": f"wl-{uid}",
                "labels": {"kueue.x-k8s.io/job-uid": uid},
                "ownerReferences": [_owner("TrainJob", name, uid, trainer)],
            }
            workload["status"]["clusterName"] = worker
            out.setdefault(("", NAMESPACE, "TrainJob"), []).append(trainjob)
            out.setdefault(("", NAMESPACE, "Workload"), []).append(workload)
            copy_uid, jobset_uid, job_uid = f"copy-{uid}", f"js-{uid}", f"job-{uid}"
            on_worker = out.setdefault((worker, NAMESPACE, "TrainJob"), [])
            on_worker.append(
                {
                    **copy.deepcopy(trainjob),
                    "metadata": {
                        **meta,
                        "name": name,
                        "uid": copy_uid,
                        "labels": {**labels, "kueue.x-k8s.io/queue-name": QUEUE},
                        "annotations": {PREBUILT_WORKLOAD: workload_name},
                    },
                }
            )
            on_worker[-1]["spec"]["managedBy"] = "trainer.kubeflow.org/trainjob-controller"
            out.setdefault((worker, NAMESPACE, "JobSet"), []).append(
                {
                    "apiVersion": jobset_api,
                    "kind": "JobSet",
                    "metadata": {
                        **meta,
                        "name": name,
                        "uid": jobset_uid,
                        "labels": labels,
                        "ownerReferences": [_owner("TrainJob", name, copy_uid, trainer)],
                    },
                    "status": {"restarts": 0},
                }
            )
            job_name = f"{name}-node-0"
            out.setdefault((worker, NAMESPACE, "Job"), []).append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        **meta,
                        "name": job_name,
                        "uid": job_uid,
                        "labels": {**labels, "jobset.sigs.k8s.io/jobset-name": name},
                        "ownerReferences": [_owner("JobSet", name, jobset_uid, jobset_api)],
                    },
                    "spec": {
                        "completionMode": "Indexed",
                        "backoffLimit": 0,
                        "completions": 2,
                        "parallelism": 2,
                    },
                    "status": {"active": 2, "ready": 2},
                }
            )
            for rank in range(2):
                pod_name, pod_uid = f"{job_name}-{rank}-abcde", f"pod-{uid}-{rank}"
                out.setdefault((worker, NAMESPACE, "Pod"), []).append(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            **meta,
                            "name": pod_name,
                            "uid": pod_uid,
                            "labels": {
                                **labels,
                                "batch.kubernetes.io/job-completion-index": str(rank),
                                "jobset.sigs.k8s.io/restart-attempt": "0",
                                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                                "jobset.sigs.k8s.io/job-index": "0",
                                "jobset.sigs.k8s.io/jobset-name": name,
                            },
                            "ownerReferences": [_owner("Job", job_name, job_uid, "batch/v1")],
                        },
                        "spec": {
                            "nodeName": "kwok-node-0",
                            "restartPolicy": "Never",
                            "containers": [{"name": "node", "image": "localhost/trainer:v1"}],
                        },
                        "status": {
                            "phase": "Running",
                            "conditions": [
                                {"type": "PodScheduled", "status": "True"},
                                {"type": "Ready", "status": "True"},
                            ],
                            "containerStatuses": [
                                {
                                    "name": "node",
                                    "restartCount": 0,
                                    "ready": True,
                                    "state": {"running": {"startedAt": "2026-12-01T08:49:00Z"}},
                                }
                            ],
                        },
                    }
                )
                out.setdefault((worker, NAMESPACE, "Event"), []).append(
                    {
                        "apiVersion": "v1",
                        "kind": "Event",
                        "metadata": {"namespace": NAMESPACE, "name": f"{pod_name}.1", "uid": f"ev-{pod_uid}"},
                        "involvedObject": {
                            "kind": "Pod",
                            "namespace": NAMESPACE,
                            "name": pod_name,
                            "uid": pod_uid,
                        },
                        "reason": "Scheduled",
                        "message": f"Successfully assigned {NAMESPACE}/{pod_name} to kwok-node-0",
                        "source": {"component": "default-scheduler"},
                        "reportingComponent": "default-scheduler",
                        "type": "Normal",
                        "eventTime": "2026-12-01T08:48:59.000000Z",
                    }
                )
    return out


def recorded_informer(recording: Recording) -> Any:
    """An informer factory for CacheSource: cluster.informer.Informer whose list is answered from
    `recording` (its store, trim, keep, indices and callbacks as in production; no thread, no watch)."""
    from cluster.informer import ADDED, Informer, uid_of

    class Recorded(Informer):
        def start(self) -> Informer:
            changes: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = []
            with self._lock:
                for raw in recording.get((self.cluster, self.namespace, self.resource.kind), ()):
                    raw = copy.deepcopy(raw)
                    if self._keep(raw):
                        obj = self._trim(raw)
                        self._put(uid_of(obj), obj)
                        changes.append((ADDED, obj, None))
            self._version = "recorded"
            self.synced.set()
            self._report(changes)
            if self._on_synced is not None:
                self._on_synced()
            return self

    return Recorded


# ---------------------------------------------------------------- the rows and the cycles


def _rows(owner: Any) -> dict[str, list[tuple[str, str]]]:
    """EXECUTIONS running executions per worker (jobs on the queue `multi`, admitted there)."""
    from django.utils import timezone

    from jobs.models import Execution, Job, JobState

    now = timezone.now()
    made: dict[str, list[tuple[str, str]]] = {}
    for worker in WORKERS:
        jobs = Job.objects.bulk_create(
            [
                Job(
                    owner=owner,
                    namespace=NAMESPACE,
                    runtime_kind="ClusterTrainingRuntime",
                    runtime_name="dispatch-kind",
                    spec={"namespace": NAMESPACE, "queue_name": QUEUE},
                    plan={"queue": QUEUE},
                    state=JobState.RUNNING,
                    current_attempt=1,
                    label_domain=DOMAIN,
                )
                for _ in range(EXECUTIONS)
            ]
        )
        Execution.objects.bulk_create(
            [
                Execution(
                    job=job,
                    attempt=1,
                    trainjob_name=f"{job.id}-1",
                    trainjob_uid=f"tj-{job.id}",
                    state=JobState.RUNNING,
                    submitted_at=now,
                    cluster=worker,
                )
                for job in jobs
            ]
        )
        made[worker] = [(job.id, f"tj-{job.id}") for job in jobs]
    return made


def _side(
    workers: Sequence[str], made: Mapping[str, Sequence[tuple[str, str]]], recording: Recording
) -> float:
    """The median cycle CPU (ms) with the executions of `workers` active (the others' jobs ended)."""
    from jobs.models import Execution, Job, JobState
    from jobs.supervision import cycle
    from jobs.supervision.cache import CacheSource

    for worker, jobs in made.items():
        state = JobState.RUNNING if worker in workers else JobState.SUCCEEDED
        ids = [job_id for job_id, _ in jobs]
        Job.objects.filter(pk__in=ids).update(state=state)
        Execution.objects.filter(job_id__in=ids).update(state=state)
    source = CacheSource(informer=recorded_informer(recording))
    try:
        source.prepare()
        pks = list(source._tracked)
        expected = sum(len(made[w]) for w in workers)
        assert len(pks) == expected, f"tracked {len(pks)} executions, not {expected}"
        settle = cycle.supervise(name="bench-multikueue", source=source)
        assert settle.ran and not settle.error, settle
        samples = []
        for _ in range(CYCLES):
            source.prepare()
            source._due_again(pks)
            report = cycle.supervise(name="bench-multikueue", source=source)
            assert report.ran and report.derived == expected, (report.derived, expected, report.error)
            assert report.lists == 0 and report.transitions == 0, report
            samples.append(report.cpu_ms)
        # Each derived from its worker's objects: running there, both rank pods seen.
        rows = Execution.objects.filter(pk__in=pks).values_list("state", "cluster", "pods_seen")
        seen = {(state, cluster, len(pods or {})) for state, cluster, pods in rows}
        assert seen == {(JobState.RUNNING, w, 2) for w in workers}, seen
        return statistics.median(samples)
    finally:
        source.close()


def run() -> dict[str, Any]:
    """Both sides, ROUNDS rounds, on rows of the bench's own (removed after)."""
    from scripts.bench_common import migrated_django

    migrated_django()
    from django.contrib.auth.models import User

    from dispatch_site import roles
    from dispatch_site.services import user_create

    User.objects.filter(username=OWNER).delete()
    owner, _ = user_create(username=OWNER, role=roles.USER, namespaces=[NAMESPACE])
    try:
        made = _rows(owner)
        recording = record(made)
        rounds = []
        for number in range(1, ROUNDS + 1):
            started = time.perf_counter()
            one = _side(WORKERS[:1], made, recording)
            two = _side(WORKERS, made, recording)
            rounds.append({"round": number, "one_ms": one, "two_ms": two})
            log(
                f"multikueue round {number}: {EXECUTIONS} on 1 worker {one:.1f} ms, {2 * EXECUTIONS} on 2 "
                f"workers {two:.1f} ms, ratio {two / one:.2f} ({time.perf_counter() - started:.1f} s)"
            )
        return {"executions": EXECUTIONS, "cycles": CYCLES, "rounds": rounds}
    finally:
        owner.jobs.all().delete()
        owner.delete()


def targets(result: dict[str, Any]) -> list[Target]:
    return [verdict(result["rounds"])]


def report_lines(result: dict[str, Any]) -> list[str]:
    n = result["executions"]
    lines = [
        "",
        "## MultiKueue: the supervisor's cycle, 2 workers / 1",
        "",
        f"`manage.py supervise`'s CacheSource and cycle on PostgreSQL rows; {n} running executions "
        f"admitted to worker-1 against {n} on each of worker-1 and worker-2; every execution due in each of "
        f"{result['cycles']} cycles per side (the median is the side's figure); the informers' objects "
        "recorded (scripts/bench_multikueue.py says why).",
        "",
        "| round | 1 worker: cycle CPU ms | 2 workers: cycle CPU ms | ratio |",
        "|---|---|---|---|",
    ]
    for r in result["rounds"]:
        lines.append(
            f"| {r['round']} | {r['one_ms']:.1f} | {r['two_ms']:.1f} | {r['two_ms'] / r['one_ms']:.2f} |"
        )
    t = verdict(result["rounds"])
    lines += [
        "",
        "| measure | value | target | met | judged on |",
        "|---|---|---|---|---|",
        f"| {t.measure} | {t.value} | {t.target} | {'yes' if t.met else 'NO'} | {t.judged_on} |",
    ]
    return lines


def main() -> int:
    result = run()
    print("\n".join(report_lines(result)))
    return 0 if verdict(result["rounds"]).met else 1


if __name__ == "__main__":
    sys.exit(main())
