"""dispatch on MultiKueue (issue 35), the user's way, on the real planes (`scripts/cluster up --multikueue`:
this session's plane is the manager, worker-1 and worker-2 behind it; the fixtures of
tests/scripts/test_multikueue_planes.py start them once per session).

A job on the LocalQueue `default/multi` is planned with the workers its queue dispatches to, read from the
ClusterQueue's MultiKueue AdmissionCheck and its MultiKueueConfig. MultiKueue copies only the TrainJob to the
worker it picks; the runtime copy that TrainJob names must already be there, or the worker's Kueue refuses the
TrainJob (docs/local-plane.md). dispatch therefore puts the copy on every worker before it creates the
TrainJob, and removes the copies once the attempt's TrainJob is gone on the manager and the worker. What
happened on the workers is read with the tests' own clients of each plane, never through dispatch.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from dispatch_site import roles
from dispatch_site.services import user_create
from jobs.models import Execution
from jobs.submission.cancel import execution_delete
from jobs.submission.errors import TransientSubmitError
from jobs.supervision import cycle
from tests.scripts.test_multikueue_planes import (  # noqa: F401 (fixtures)
    NAMESPACE,
    QUEUE,
    STATE,
    WORKERS,
    dispatched_to,
    manager,
    multikueue_planes,
    trainjob_or_none,
)
from tests.support.cluster import UP_TIMEOUT, Kube, _run_cluster
from tests.support.dispatch import api_as, get_job, submit_job
from tests.support.kueue import RUNTIME, TRAINER, Recorder, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("dispatch_kind_allowed")]


def _copy_on(kube: Kube, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            *TRAINER, NAMESPACE, "trainingruntimes", name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def _running_pods(kube: Kube, trainjob: str) -> list[Any]:
    pods = kube.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"jobset.sigs.k8s.io/jobset-name={trainjob}"
    )
    return [p for p in pods.items if p.status.phase == "Running"]


@pytest.mark.django_db(transaction=True)
def test_a_job_on_a_multikueue_queue_runs_on_a_worker_with_its_runtime_copy_and_leaves_none_behind(
    manager: Kube,  # noqa: F811
    multikueue_planes: dict[str, Kube],  # noqa: F811
    dispatch_on_cluster: str,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.WORKER_KUBECONFIG_DIR = str(STATE / "workers")  # what `make up` picks up by itself
    _, token = user_create(username="mk-user", role=roles.USER, namespaces=[NAMESPACE], password="pw")
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": RUNTIME},
        "namespace": NAMESPACE,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "queue_name": QUEUE,
        "env": {"KWOK_STAY_RUNNING": "1"},
    }
    planned = api_as(token).post("/api/v1/plan", body, format="json")
    assert planned.status_code == 200, planned.content
    plan = planned.json()
    assert not plan["refused"], plan["reasons"]
    assert plan["queue"]["workers"] == list(WORKERS), plan["queue"]
    assert not [w for w in plan["warnings"] if "no credentials" in w], plan["warnings"]

    job_id = submit_job(token, body, django_capture_on_commit_callbacks)
    name = f"{job_id}-1"
    # The copy is on every worker before MultiKueue picks one, with dispatch's labels.
    for worker, kube in multikueue_planes.items():
        copy = _copy_on(kube, name)
        assert copy is not None, f"no runtime copy {NAMESPACE}/{name} on {worker}"
        assert copy["metadata"]["labels"].get("dispatch.dev/job") == job_id, copy["metadata"]
    trainjob = trainjob_or_none(manager, name)
    assert trainjob is not None
    worker = dispatched_to(manager, trainjob)
    assert worker in WORKERS
    on_worker = multikueue_planes[worker]
    pods = wait_for(f"the job's pods running on {worker}", lambda: len(_running_pods(on_worker, name)) == 2)
    assert pods
    assert _running_pods(manager, name) == []  # nothing runs on the manager

    # Supervision (the beat's cycle) reads the pods where they run: the job is running on that worker, its
    # rank pods seen, and the execution names the worker.
    def supervised_running() -> dict[str, Any] | None:
        cycle.supervise()
        data = get_job(token, job_id)
        return data if data["state"] == "running" else None

    data = wait_for("the job running, as supervision reads the worker", supervised_running, timeout=90)
    assert data["executions"][0]["cluster"] == worker, data["executions"]
    seen = Execution.objects.get(job_id=job_id, attempt=1).pods_seen
    assert {p["name"] for p in seen.values()} == {p.metadata.name for p in _running_pods(on_worker, name)}

    # Rank 0's log, read from the worker (no such pod exists on the manager).
    rank_0 = next(
        p.metadata.name
        for p in _running_pods(on_worker, name)
        if p.metadata.annotations.get("batch.kubernetes.io/job-completion-index") == "0"
        and "node-0" in p.metadata.name
    )
    log = api_as(token).get(f"/api/v1/jobs/{job_id}/logs?rank=0")
    assert log.status_code == 200, log.content
    assert log["X-Dispatch-Pod"] == rank_0, (log["X-Dispatch-Pod"], rank_0)
    assert log.content, "an empty log"

    # Cancelled: the manager's TrainJob goes, MultiKueue takes the worker's, and dispatch the copies.
    with django_capture_on_commit_callbacks(execute=False):
        response = api_as(token).post(f"/api/v1/jobs/{job_id}/cancel")
    assert response.status_code == 202, response.content
    execution = Execution.objects.get(job_id=job_id, attempt=1)

    def cleaned() -> bool:
        try:
            execution_delete(execution_id=execution.pk)
        except TransientSubmitError:
            return False
        return all(_copy_on(kube, name) is None for kube in multikueue_planes.values())

    wait_for("the attempt's objects gone on the manager and both workers", cleaned, timeout=180)
    assert trainjob_or_none(manager, name) is None
    assert all(trainjob_or_none(kube, name) is None for kube in multikueue_planes.values())
    assert get_job(token, job_id)["state"] == "cancelled"


def _identities(
    recorders: list[tuple[str, Recorder]], job_id: str
) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(attempt, replicated job/completion index) -> the (worker, pod UID)s that ran it, from the tests' own
    watches of each worker's pods."""
    ran: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for worker, recorder in recorders:
        for observed in recorder.of("Pod"):
            pod = observed.obj
            meta = pod["metadata"]
            labels = meta.get("labels") or {}
            if (
                labels.get("dispatch.dev/job") != job_id
                or (pod.get("status") or {}).get("phase") != "Running"
            ):
                continue
            rank = (
                f"{labels.get('jobset.sigs.k8s.io/replicatedjob-name')}/"
                f"{(meta.get('annotations') or {}).get('batch.kubernetes.io/job-completion-index')}"
            )
            ran.setdefault((str(labels.get("dispatch.dev/attempt")), rank), set()).add((worker, meta["uid"]))
    return ran


@pytest.mark.django_db(transaction=True)
def test_a_lost_worker_ends_the_attempt_cluster_lost_and_the_next_runs_as_a_new_trainjob_on_the_other(
    manager: Kube,  # noqa: F811
    multikueue_planes: dict[str, Kube],  # noqa: F811
    dispatch_on_cluster: str,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The worker running a long job is stopped (`scripts/cluster down --worker`). While it cannot be read
    the job is unknown, the worker named; once Kueue evicts the Workload (workerLostTimeout, 30 s here,
    "Admitting remote lost"), supervision ends attempt 1 `cluster-lost` on the manager's word alone and
    attempt 2 runs as a new TrainJob on the other worker. The tests' own pod watches on both workers see
    every rank identity run on one pod only (MultiKueue would have run the same TrainJob, DISPATCH_ATTEMPT=1,
    on the other worker)."""
    settings.WORKER_KUBECONFIG_DIR = str(STATE / "workers")
    _, token = user_create(username="mk-lost", role=roles.USER, namespaces=[NAMESPACE], password="pw")
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": RUNTIME},
        "namespace": NAMESPACE,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "queue_name": QUEUE,
        "env": {"KWOK_STAY_RUNNING": "1"},
        "recovery_policy": {"retry": {"cluster-lost": 1}, "backoff_seconds": {"cluster-lost": 0}},
    }
    recorders = {w: Recorder(kube, NAMESPACE).start(kinds=("Pod",)) for w, kube in multikueue_planes.items()}
    watched: list[tuple[str, Recorder]] = []
    job_id = ""
    try:
        job_id = submit_job(token, body, django_capture_on_commit_callbacks)

        history: list[tuple[Any, ...]] = []  # what the job read, each change once (shown on a timeout)

        def job_when(predicate: Any, what: str, timeout: float = 120) -> dict[str, Any]:
            def probe() -> dict[str, Any] | None:
                with django_capture_on_commit_callbacks(execute=True):
                    cycle.supervise()
                # The delete task's retries (a worker runs them with a countdown; here, each probe).
                for pk in Execution.objects.filter(
                    job_id=job_id, delete_requested_at__isnull=False, objects_removed_at__isnull=True
                ).values_list("pk", flat=True):
                    with contextlib.suppress(TransientSubmitError):
                        execution_delete(execution_id=pk)
                data = get_job(token, job_id)
                seen = (data["current_attempt"], data["state"], data["cause"], data["message"][:200])
                if not history or history[-1] != seen:
                    history.append(seen)
                return data if predicate(data) else None

            found: dict[str, Any] = wait_for(what, probe, timeout=timeout, state=lambda: history)
            return found

        first = job_when(lambda d: d["state"] == "running", "attempt 1 running on a worker")
        lost = first["executions"][0]["cluster"]
        other = next(w for w in WORKERS if w != lost)
        # Its watch would fail while the worker is down: stopped (what it saw is kept), watched once back.
        earlier = recorders.pop(lost)
        earlier.stop()
        watched.append((lost, earlier))
        down = _run_cluster("down", "--worker", lost, timeout=300)
        assert down.returncode == 0, down.stderr

        unknown = job_when(lambda d: d["state"] == "unknown", f"the job unknown while {lost} cannot be read")
        assert lost in unknown["message"], unknown["message"]
        second = job_when(
            lambda d: d["current_attempt"] == 2 and d["state"] == "running",
            "attempt 2 running on the other worker",
            timeout=240,
        )
        ended = second["executions"][0]
        assert (ended["attempt"], ended["state"], ended["cause"]) == (1, "failed", "cluster-lost"), ended
        assert "Admitting remote lost" in str(ended["evidence"]), ended["evidence"]
        assert second["executions"][1]["cluster"] == other, second["executions"]
        assert trainjob_or_none(manager, f"{job_id}-1") is None
        assert trainjob_or_none(multikueue_planes[other], f"{job_id}-1") is None  # MultiKueue never re-ran it
        pods_2 = wait_for(
            "attempt 2's pods on the other worker",
            lambda: _running_pods(multikueue_planes[other], f"{job_id}-2"),
        )
        assert len(pods_2) == 2
    finally:
        up = _run_cluster("up", "--multikueue", timeout=UP_TIMEOUT)
        for recorder in recorders.values():
            recorder.stop()
        assert up.returncode == 0, up.stderr[-4000:]
    # Back: what the lost worker holds now (its pods of attempt 1 never left it: the plane was stopped whole).
    watched += list(recorders.items())
    for worker in set(WORKERS) - set(recorders):
        again = Recorder(multikueue_planes[worker], NAMESPACE).start(kinds=("Pod",))
        time.sleep(2)
        again.stop()
        watched.append((worker, again))
    ran = _identities(watched, job_id)
    twice = {identity: runs for identity, runs in ran.items() if len(runs) > 1}
    assert twice == {}, f"rank identities run by more than one pod: {twice}"
    assert {attempt for attempt, _ in ran} == {"1", "2"}, ran
