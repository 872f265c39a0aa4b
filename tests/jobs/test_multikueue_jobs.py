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
import re
import time
import uuid
from typing import Any

import pytest
from django.test import Client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from cluster.fence import FENCE_LABEL
from dispatch_site import roles
from dispatch_site.services import user_create
from jobs.models import Execution
from jobs.submission.cancel import execution_delete
from jobs.submission.errors import TransientSubmitError
from jobs.submission.leftovers import worker_leftovers_sweep
from jobs.supervision import cycle
from runtimes.models import AllowListEntry
from tests.scripts.test_multikueue_planes import (  # noqa: F401 (fixtures)
    NAMESPACE,
    QUEUE,
    STATE,
    WORKERS,
    delete_everywhere,
    dispatched_to,
    manager,
    multikueue_planes,
    trainjob_or_none,
)
from tests.support.cluster import UP_TIMEOUT, Kube, _run_cluster
from tests.support.dispatch import api_as, get_job, submit_job
from tests.support.kueue import RUNTIME, TRAINER, Recorder, wait_for

SESSION_IMAGE = "localhost/dispatch-busybox:kind"  # as the sessions' tests

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("dispatch_kind_allowed")]


@pytest.fixture
def token(dispatch_on_cluster: str, settings: Any) -> str:
    """A plain user granted `default` (the namespace MultiKueue's queue is in), dispatch reading the local
    workers' kubeconfigs as `make up` does."""
    settings.WORKER_KUBECONFIG_DIR = str(STATE / "workers")
    _, api_token = user_create(username="mk-user", role=roles.USER, namespaces=[NAMESPACE], password="pw")
    return api_token


def _multi_body(**extra: Any) -> dict[str, Any]:
    """A long job (its pods stay running) on the LocalQueue `default/multi`."""
    return {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": RUNTIME},
        "namespace": NAMESPACE,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "queue_name": QUEUE,
        "env": {"KWOK_STAY_RUNNING": "1"},
        # The manager's Kueue evicts a Workload whose pods are not Ready 15 s after admission (the plane's
        # waitForPodsReady), dispatch to the worker included: on a loaded machine that happens, and the job
        # then runs as its next attempt. The tests follow whichever attempt runs.
        "recovery_policy": {
            "retry": {"evicted": 5, "cluster-lost": 1},
            "backoff_seconds": {"evicted": 0, "cluster-lost": 0},
            "budgets": {"infrastructure": 10},
        },
        **extra,
    }


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


def _worker_rows(username: str) -> dict[str, str]:
    """The overview's worker table (the cluster box htmx polls), as `username` sees it: worker -> its row's
    text."""
    client = Client()
    assert client.login(username=username, password="pw")
    response = client.get("/overview/cluster/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200, response.content
    rows = re.findall(r'<tr data-worker="([^"]+)">(.*?)</tr>', response.content.decode(), re.DOTALL)
    return {name: " ".join(re.sub(r"<[^>]+>", " ", row).split()) for name, row in rows}


def _worker_metrics(settings: Any) -> dict[tuple[str, str], float]:
    """(family, worker) -> value of the dispatch_worker_* series in a /metrics scrape from this host."""
    settings.METRICS_TOKEN = ""
    response = Client().get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200, response.content
    return {
        (sample.name, sample.labels["cluster"]): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
        if sample.name.startswith("dispatch_worker_")
    }


def _supervise_until(
    token: str, job_id: str, predicate: Any, what: str, capture: Any, timeout: float = 120
) -> dict[str, Any]:
    """Supervision cycles (their on-commit work run: A+1's start) and the delete task's retries (a worker runs
    them with a countdown; here, each round) until the job's answer satisfies `predicate`; on a timeout,
    every state the job read, in order."""
    history: list[tuple[Any, ...]] = []

    def probe() -> dict[str, Any] | None:
        with capture(execute=True):
            cycle.supervise()
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


@pytest.mark.django_db(transaction=True)
def test_a_job_on_a_multikueue_queue_runs_on_a_worker_with_its_runtime_copy_and_leaves_none_behind(
    manager: Kube,  # noqa: F811
    multikueue_planes: dict[str, Kube],  # noqa: F811
    token: str,
    django_capture_on_commit_callbacks: Any,
    settings: Any,
) -> None:
    body = _multi_body()
    planned = api_as(token).post("/api/v1/plan", body, format="json")
    assert planned.status_code == 200, planned.content
    plan = planned.json()
    assert not plan["refused"], plan["reasons"]
    assert plan["queue"]["workers"] == list(WORKERS), plan["queue"]
    assert not [w for w in plan["warnings"] if "no credentials" in w], plan["warnings"]

    job_id = submit_job(token, body, django_capture_on_commit_callbacks)
    # The copy is on every worker before MultiKueue picks one, with dispatch's labels.
    for worker, kube in multikueue_planes.items():
        copy = _copy_on(kube, f"{job_id}-1")
        assert copy is not None, f"no runtime copy {NAMESPACE}/{job_id}-1 on {worker}"
        assert copy["metadata"]["labels"].get("dispatch.dev/job") == job_id, copy["metadata"]

    # Supervision (the beat's cycle) reads the pods where they run: the job is running on a worker, its
    # rank pods seen, and the execution names the worker.
    data = _supervise_until(
        token,
        job_id,
        lambda d: d["state"] == "running",
        "the job running",
        django_capture_on_commit_callbacks,
    )
    attempt = data["current_attempt"]
    name = f"{job_id}-{attempt}"
    trainjob = trainjob_or_none(manager, name)
    assert trainjob is not None
    worker = dispatched_to(manager, trainjob)
    assert data["executions"][-1]["cluster"] == worker, data["executions"]
    on_worker = multikueue_planes[worker]
    running = _running_pods(on_worker, name)
    assert len(running) == 2, running
    assert _running_pods(manager, name) == []  # nothing runs on the manager
    seen = Execution.objects.get(job_id=job_id, attempt=attempt).pods_seen
    assert {p["name"] for p in seen.values()} == {p.metadata.name for p in running}

    # The overview's cluster box and /metrics show each worker: it answers, supervision read it, and the
    # job runs on the one it was dispatched to (the user's own job: counted for them).
    other = next(w for w in WORKERS if w != worker)
    rows = _worker_rows("mk-user")
    assert set(rows) >= set(WORKERS), rows
    assert "reachable" in rows[worker] and "unreachable" not in rows[worker], rows[worker]
    assert re.search(r"^\S+ reachable .* read \d\d:\d\d:\d\d UTC 1$", rows[worker]), rows[worker]
    assert "unreachable" not in rows[other] and rows[other].endswith(" 0"), rows[other]
    metrics = _worker_metrics(settings)
    assert metrics[("dispatch_worker_read_ok", worker)] == 1.0, metrics
    assert metrics[("dispatch_worker_jobs_running", worker)] == 1.0, metrics
    assert metrics[("dispatch_worker_last_read_age_seconds", worker)] < 120, metrics

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
    execution = Execution.objects.get(job_id=job_id, attempt=attempt)

    def cleaned() -> bool:
        try:
            execution_delete(execution_id=execution.pk)
        except TransientSubmitError:
            return False
        return all(
            _copy_on(kube, f"{job_id}-{a}") is None
            for kube in multikueue_planes.values()
            for a in range(1, attempt + 1)
        )

    wait_for("the attempt's objects gone on the manager and both workers", cleaned, timeout=180)
    assert trainjob_or_none(manager, name) is None
    assert all(trainjob_or_none(kube, name) is None for kube in multikueue_planes.values())
    assert get_job(token, job_id)["state"] == "cancelled"
    # The ended attempt is fenced where its pods ran, on the worker too: that worker's API server refuses a
    # pod of it, whoever asks (a stale JobSet or Job controller there would be refused the same way).
    refusal = _fenced_pod_refusal(on_worker, name)
    assert f"the attempt {NAMESPACE}/{name} ended (fenced by dispatch" in refusal, refusal


def _fenced_pod_refusal(kube: Kube, trainjob: str) -> str:
    """The API server's answer to a server-side dry run of a pod of `trainjob`'s JobSet ("" if admitted)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "fenced-", "labels": {FENCE_LABEL: trainjob}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "node", "image": "localhost/trainer:v1"}]},
    }
    try:
        kube.core.create_namespaced_pod(NAMESPACE, pod, dry_run="All")
    except ApiException as exc:
        return str(exc.body)
    return ""


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
    token: str,
    django_capture_on_commit_callbacks: Any,
    settings: Any,
) -> None:
    """The worker running a long job is stopped (`scripts/cluster down --worker`). While it cannot be read
    the job is unknown, the worker named; once Kueue evicts the Workload (workerLostTimeout, 30 s here,
    "Admitting remote lost"), supervision ends attempt 1 `cluster-lost` on the manager's word alone and
    attempt 2 runs as a new TrainJob on the other worker. The tests' own pod watches on both workers see
    every rank identity run on one pod only (MultiKueue would have run the same TrainJob, DISPATCH_ATTEMPT=1,
    on the other worker)."""
    body = _multi_body()
    recorders = {w: Recorder(kube, NAMESPACE).start(kinds=("Pod",)) for w, kube in multikueue_planes.items()}
    watched: list[tuple[str, Recorder]] = []
    job_id = ""
    capture = django_capture_on_commit_callbacks
    try:
        job_id = submit_job(token, body, capture)
        first = _supervise_until(
            token, job_id, lambda d: d["state"] == "running", "a running attempt", capture
        )
        lost_attempt = first["current_attempt"]
        lost = first["executions"][-1]["cluster"]
        other = next(w for w in WORKERS if w != lost)
        # Its watch would fail while the worker is down: stopped (what it saw is kept), watched once back.
        earlier = recorders.pop(lost)
        earlier.stop()
        watched.append((lost, earlier))
        down = _run_cluster("down", "--worker", lost, timeout=300)
        assert down.returncode == 0, down.stderr

        unknown = _supervise_until(
            token, job_id, lambda d: d["state"] == "unknown", f"the job unknown while {lost} is down", capture
        )
        assert lost in unknown["message"], unknown["message"]
        # The overview names the lost worker unreachable and its reads failing (the error's text is the
        # platform role's); /metrics says its last read failed.

        def lost_shown() -> dict[str, str] | None:
            rows = _worker_rows("mk-user")
            return rows if "unreachable" in rows.get(lost, "") else None

        rows = wait_for(f"the overview showing {lost} unreachable", lost_shown, timeout=60)
        assert "failing since" in rows[lost], rows[lost]
        assert "shown to the platform role" in rows[lost] and "refused" not in rows[lost], rows[lost]
        assert "unreachable" not in rows[other], rows[other]
        assert _worker_metrics(settings)[("dispatch_worker_read_ok", lost)] == 0.0
        second = _supervise_until(
            token,
            job_id,
            lambda d: d["current_attempt"] > lost_attempt and d["state"] == "running",
            "the next attempt running on the other worker",
            capture,
            timeout=240,
        )
        ended = next(e for e in second["executions"] if e["attempt"] == lost_attempt)
        assert (ended["state"], ended["cause"]) == ("failed", "cluster-lost"), ended
        assert "Admitting remote lost" in str(ended["evidence"]), ended["evidence"]
        assert second["executions"][-1]["cluster"] == other, second["executions"]
        lost_name, next_name = f"{job_id}-{lost_attempt}", f"{job_id}-{second['current_attempt']}"
        assert trainjob_or_none(manager, lost_name) is None
        assert trainjob_or_none(multikueue_planes[other], lost_name) is None  # MultiKueue never re-ran it
        pods_next = wait_for(
            "the next attempt's pods on the other worker",
            lambda: _running_pods(multikueue_planes[other], next_name),
        )
        assert len(pods_next) == 2
    finally:
        up = _run_cluster("up", "--multikueue", timeout=UP_TIMEOUT)
        for recorder in recorders.values():
            recorder.stop()
        assert up.returncode == 0, up.stderr[-4000:]
    # Back: attempt 1's TrainJob copy and pods leave the returned worker. Kueue's MultiKueue garbage
    # collector (gcInterval, 1 min here) removes a remote copy whose manager objects are gone once it reaches
    # the worker; dispatch's leftovers sweep does the same where that collector is off. Whichever comes first:
    # the test runs the sweep meanwhile, as the beat does, and says which one removed it.
    back = multikueue_planes[lost]
    swept = 0

    def gone_from_the_returned_worker() -> bool:
        nonlocal swept
        swept += worker_leftovers_sweep()["deleted"]
        return trainjob_or_none(back, lost_name) is None and not _running_pods(back, lost_name)

    wait_for(f"{lost_name}'s TrainJob and pods gone from {lost}", gone_from_the_returned_worker, timeout=150)
    print(f"{lost_name}'s copy on {lost} removed by {'dispatch' if swept else 'Kueue'}'s collector")
    assert worker_leftovers_sweep()["deleted"] == 0  # nothing left: the next pass deletes nothing
    watched += list(recorders.items())
    for worker in set(WORKERS) - set(recorders):
        again = Recorder(multikueue_planes[worker], NAMESPACE).start(kinds=("Pod",))
        time.sleep(2)
        again.stop()
        watched.append((worker, again))
    ran = _identities(watched, job_id)
    twice = {identity: runs for identity, runs in ran.items() if len(runs) > 1}
    assert twice == {}, f"rank identities run by more than one pod: {twice}"
    assert {str(lost_attempt), str(second["current_attempt"])} <= {attempt for attempt, _ in ran}, ran


@pytest.mark.django_db(transaction=True)
def test_a_session_on_a_multikueue_queue_runs_echo_on_its_workers_trainer_pod_and_closes_everywhere(
    manager: Kube,  # noqa: F811
    multikueue_planes: dict[str, Kube],  # noqa: F811
    token: str,
) -> None:
    """A session names its queue as a job does: on `multi` its TrainJob goes to the manager and MultiKueue
    copies it to a worker; the runtime copy is on every worker first. The session API names the worker
    (`cluster`), a command runs in the trainer pod there (no pod of it exists on the manager), and closing
    removes the TrainJob everywhere and the workers' runtime copies."""
    AllowListEntry.objects.update_or_create(
        kind="ClusterTrainingRuntime",
        namespace="",
        name=RUNTIME,
        defaults={"for_jobs": True, "for_sessions": True},
    )
    api = api_as(token)
    name = f"mks-{uuid.uuid4().hex[:6]}"
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": RUNTIME},
        "namespace": NAMESPACE,
        "image": SESSION_IMAGE,
        "name": name,
        "queue_name": QUEUE,
        # Quota on the manager, admission on a worker, the copy, the worker's controllers: a while on a busy
        # machine (and an eviction for PodsReadyTimeout makes MultiKueue dispatch it again).
        "timeout_seconds": 300,
    }
    try:
        opened = api.post("/api/v1/sessions?wait=280", body, format="json")
        assert opened.status_code == 200, opened.content
        session = opened.json()
        assert session["state"] == "running", session
        assert session["queue"] == QUEUE
        trainjob = trainjob_or_none(manager, name)
        assert trainjob is not None
        worker = dispatched_to(manager, trainjob)
        assert session["cluster"] == worker, session
        assert api.get(f"/api/v1/sessions/{session['id']}").json()["cluster"] == worker
        page = Client()
        assert page.login(username="mk-user", password="pw")
        shown = page.get(f"/sessions/{session['id']}/")
        assert shown.status_code == 200 and f"<code>{worker}</code>" in shown.content.decode(), shown.content
        for each, kube in multikueue_planes.items():
            copy = _copy_on(kube, name)
            assert copy is not None, f"no runtime copy {NAMESPACE}/{name} on {each}"
            assert copy["metadata"]["labels"].get("dispatch.dev/session") == session["id"], copy["metadata"]
        on_worker = multikueue_planes[worker]
        pod = on_worker.core.read_namespaced_pod(session["pod"], NAMESPACE)
        assert pod.status.phase == "Running"
        assert pod.metadata.labels["jobset.sigs.k8s.io/jobset-name"] == name
        assert _running_pods(manager, name) == []  # nothing of it runs on the manager

        ran = api.post(
            f"/api/v1/sessions/{session['id']}/exec", {"command": "echo hello from the worker"}, format="json"
        )
        assert ran.status_code == 200, ran.content
        assert (ran.json()["stdout"], ran.json()["returncode"]) == ("hello from the worker\n", 0), ran.json()
        assert ran.json()["pod"] == session["pod"]

        closed = api.delete(f"/api/v1/sessions/{session['id']}?wait=120")
        assert closed.status_code == 200, closed.content
        assert closed.json()["state"] == "closed", closed.json()
        assert closed.json()["cluster"] == worker
        assert trainjob_or_none(manager, name) is None
        assert all(trainjob_or_none(kube, name) is None for kube in multikueue_planes.values())
        assert all(_copy_on(kube, name) is None for kube in multikueue_planes.values())
        assert _running_pods(on_worker, name) == []
    finally:
        delete_everywhere(manager, multikueue_planes, name)
