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
import functools
import re
import threading
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
from jobs.models import Execution, Job, WorkerRead
from jobs.submission.cancel import execution_delete
from jobs.submission.errors import TransientSubmitError
from jobs.submission.leftovers import worker_leftovers_sweep
from jobs.supervision import cycle
from runtimes.models import AllowListEntry
from scripts.identity_observer import IdentityObserver
from scripts.identity_verdict import ranks_seen
from tests.jobs.supervision.support import _evict, watching
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
    on the other worker), and so does the identity observer (scripts/identity_observer.py, which imports
    nothing of dispatch) watching both workers through the outage: no violation, both attempts' ranks seen,
    and the lost worker's watch errors recorded (it was watching while the worker was down)."""
    body = _multi_body()
    recorders = {w: Recorder(kube, NAMESPACE).start(kinds=("Pod",)) for w, kube in multikueue_planes.items()}
    observer = IdentityObserver([str(STATE / "workers" / f"{w}.kubeconfig") for w in WORKERS]).start()
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
    observer.stop()
    verdict = observer.verdict(namespaces={NAMESPACE})
    assert verdict["ok"], verdict["violations"] + verdict["anomalies"]
    assert verdict["watch"]["clusters"] == sorted(WORKERS)
    attempts = (str(lost_attempt), str(second["current_attempt"]))
    seen = ranks_seen(observer.records(), {(NAMESPACE, job_id, attempt): 2 for attempt in attempts})
    assert all(seen[(NAMESPACE, job_id, attempt)] == 2 for attempt in attempts), seen
    assert any(f" {lost} pods" in error for error in verdict["watch"]["errors"]), verdict["watch"]["errors"]


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


# ---------------------------------------------------------------- the supervisor's watches of the workers


class _ListSpy:
    """Every list call through the gateway, with the cluster it went to (cluster.where) and whether an
    informer's thread made it (its first list, a 410, a periodic re-list) or a cycle did."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from cluster import gateway
        from cluster.where import current_cluster

        self.calls: list[tuple[str, str, bool]] = []  # (cluster, kind, by an informer)
        self._lock = threading.Lock()
        real = gateway.list_objects

        def spied(resource: Any, namespace: Any, **kwargs: Any) -> Any:
            name = threading.current_thread().name
            with self._lock:
                self.calls.append(
                    (current_cluster(), resource.kind, name.startswith(("informer ", "relist ")))
                )
            return real(resource, namespace, **kwargs)

        monkeypatch.setattr(gateway, "list_objects", spied)

    def mark(self) -> int:
        with self._lock:
            return len(self.calls)

    def on(self, cluster: str, *, since: int = 0, by_informer: bool) -> list[str]:
        with self._lock:
            return [
                kind for c, kind, informer in self.calls[since:] if c == cluster and informer == by_informer
            ]


def _admitted(job_id: str, predicate: Any, what: str, timeout: float = 240) -> Execution:
    """The job's current execution once it names its worker and satisfies `predicate` (the supervisor, in its
    thread, does the work)."""

    def probe() -> Execution | None:
        job = Job.objects.get(pk=job_id)
        execution = Execution.objects.filter(job_id=job_id, attempt=job.current_attempt).first()
        return (
            execution if execution is not None and execution.cluster and predicate(job, execution) else None
        )

    def state() -> Any:
        job = Job.objects.get(pk=job_id)
        return (
            job.state,
            [
                (e.attempt, e.state, e.cause, e.cluster, len(e.pods_seen or {}), e.message[:200])
                for e in Execution.objects.filter(job_id=job_id).order_by("attempt")
            ],
        )

    found: Execution = wait_for(what, probe, timeout=timeout, state=state)
    return found


def _cancel(token: str, job_id: str) -> None:
    """The job cancelled and its current TrainJob deleted on the manager (quota back for the next test)."""
    api_as(token).post(f"/api/v1/jobs/{job_id}/cancel")
    job = Job.objects.get(pk=job_id)

    def deleted() -> bool:
        for pk in Execution.objects.filter(job_id=job_id, attempt__lte=job.current_attempt).values_list(
            "pk", flat=True
        ):
            try:
                execution_delete(execution_id=pk)
            except TransientSubmitError:
                return False
        return True

    with contextlib.suppress(Exception):
        wait_for("the job's TrainJobs deleted", deleted, timeout=60)


@pytest.mark.django_db(transaction=True)
def test_the_supervisor_watches_the_worker_a_job_runs_on_and_lists_nothing_there_once_synced(
    manager: Kube,  # noqa: F811
    multikueue_planes: dict[str, Kube],  # noqa: F811
    token: str,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`manage.py supervise` (the CacheSource): a job on `multi` runs on a worker and is derived from that
    worker's watched objects, which its informers list on the worker (their threads on the worker's cluster);
    once they are synced, cycles that derive the job make no list call at all, and a pod evicted on the worker
    leaves its tombstone (the watch saw it deleted) as on the manager."""
    from jobs.supervision import cache as cache_module

    spy = _ListSpy(monkeypatch)
    kept: list[dict[str, Any]] = []
    real_keep = cache_module.keep_tombstones

    def keep(dead: Any) -> None:
        kept.extend(pod for _, pod in dead)
        real_keep(dead)

    monkeypatch.setattr(cache_module, "keep_tombstones", keep)
    job_id = ""
    with watching(interval=0.5) as (source, reports):
        try:
            job_id = submit_job(token, _multi_body(), django_capture_on_commit_callbacks)
            execution = _admitted(
                job_id,
                lambda job, e: job.state == "running" and len(e.pods_seen or {}) == 2,
                "the job running on a worker, its two rank pods seen",
            )
            worker = execution.cluster
            name = f"{job_id}-{execution.attempt}"
            running = _running_pods(multikueue_planes[worker], name)
            assert {p["name"] for p in execution.pods_seen.values()} == {p.metadata.name for p in running}
            assert _running_pods(manager, name) == []  # the pods exist on the worker only
            # The worker's informers: Events, and per label domain its TrainJob copy, JobSets, Jobs and pods,
            # each listed once on the worker by its own thread; no cycle listed anything there.
            assert spy.on(worker, by_informer=False) == [], spy.calls
            assert sorted(spy.on(worker, by_informer=True)) == sorted(
                ["Event", "TrainJob", "JobSet", "Job", "Pod"]
            ), spy.calls
            assert source.workers.informer_count(worker) == 5
            # Cycles that derive the job (made due by hand, as a change would) read nothing by list.
            listed = spy.mark()

            def derived_since(count: int) -> list[Any]:
                return [r for r in reports.since(count) if r.derived]

            for _ in range(3):
                start = len(reports)
                source._due_again([execution.pk])
                busy = wait_for("a cycle deriving the job", functools.partial(derived_since, start))
                assert all(r.lists == 0 for r in busy), busy
            assert [c for c in spy.calls[listed:]] == [], spy.calls[listed:]
            # A rank pod evicted on the worker: the watch keeps its last state as a tombstone.
            victim = running[0]
            _evict(multikueue_planes[worker], NAMESPACE, victim)
            wait_for(
                f"a tombstone of {victim.metadata.name} from {worker}",
                lambda: any(p["metadata"]["uid"] == victim.metadata.uid for p in kept),
                timeout=90,
            )
            ended = wait_for(
                "the attempt ended evicted",
                lambda: Execution.objects.filter(pk=execution.pk, state="failed").first(),
                timeout=120,
            )
            assert ended.cause == "evicted", (ended.cause, ended.message, ended.evidence)
        finally:
            if job_id:
                _cancel(token, job_id)


@pytest.mark.django_db(transaction=True)
def test_a_rank_failing_on_a_worker_is_derived_from_the_supervisors_watch_of_that_worker(
    manager: Kube,  # noqa: F811
    multikueue_planes: dict[str, Kube],  # noqa: F811
    token: str,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1 exits with code 3 on the worker: the supervisor's cycles end the attempt app-error naming rank 1
    and the code, from what the worker's watches brought (no cycle lists anything on the worker), and the
    worker's watches stop once no supervised execution is left there."""
    spy = _ListSpy(monkeypatch)
    env = {"KWOK_EXIT_CODE": "3", "KWOK_FAIL_RANK": "1", "KWOK_RUN_DURATION": "8s"}
    body = _multi_body(env=env, recovery_policy={"retry": {"evicted": 5}, "backoff_seconds": {"evicted": 0}})
    job_id = ""
    with watching(interval=0.5) as (source, _):
        try:
            job_id = submit_job(token, body, django_capture_on_commit_callbacks)
            failed = _admitted(
                job_id, lambda job, e: e.state == "failed", "the attempt failed on its worker", timeout=300
            )
            worker = failed.cluster
            assert (failed.cause, failed.rank, failed.exit_code) == ("app-error", 1, 3), (
                failed.cause,
                failed.message,
                failed.evidence,
            )
            assert "rank 1 exited with code 3" in failed.message, failed.message
            # Its pods were the worker's: the evidence names a pod the worker's watch saw.
            pods = {p["name"] for p in (failed.pods_seen or {}).values()}
            assert pods and any(str(e.get("object", "")).split("/")[-1] in pods for e in failed.evidence), (
                pods,
                failed.evidence,
            )
            assert spy.on(worker, by_informer=True), spy.calls  # the worker's watches listed there
            assert spy.on(worker, by_informer=False) == [], spy.calls  # and no cycle did
            assert Job.objects.get(pk=job_id).state == "failed"
            wait_for(
                f"the watches of {worker} stopped (no supervised execution left there)",
                lambda: source.workers.informer_count(worker) == 0,
                timeout=90,
            )
        finally:
            if job_id and Job.objects.get(pk=job_id).state != "failed":
                _cancel(token, job_id)


@pytest.mark.django_db(transaction=True)
def test_a_worker_the_supervisor_cannot_watch_makes_its_job_unknown_naming_it_until_it_can_again(
    manager: Kube,  # noqa: F811
    multikueue_planes: dict[str, Kube],  # noqa: F811
    token: str,
    django_capture_on_commit_callbacks: Any,
    settings: Any,
    tmp_path: Any,
) -> None:
    """The supervisor's watches of the worker a job runs on fail (dispatch's credentials for it gone, its
    watches opened again): the job goes `unknown` naming the worker, the worker's read is recorded failing
    (the overview's worker health), and once the credentials are back the watches resume and the job runs
    again."""
    job_id = submit_job(token, _multi_body(), django_capture_on_commit_callbacks)
    with watching(interval=0.5) as (source, _):
        try:
            execution = _admitted(
                job_id,
                lambda job, e: job.state == "running" and len(e.pods_seen or {}) == 2,
                "the job running on a worker",
            )
            worker = execution.cluster
            settings.WORKER_KUBECONFIG_DIR = str(tmp_path)  # no kubeconfig for any worker
            for informer in [
                i
                for (w, _), ws in source.workers._watched.items()
                if w == worker
                for i in ws.informers.values()
            ]:
                informer.relist_now()
            # (Closed, the watches read as failing at once, "Response ended prematurely"; then for want of
            # credentials, which the worker's recorded read says.)
            unknown = _admitted(
                job_id,
                lambda job, e: (
                    job.state == "unknown"
                    and "no credentials" in WorkerRead.objects.get(name=worker).error
                    # the reason it reads now, not the first one (the closed watch's)
                    and "no credentials" in job.message
                ),
                f"the job unknown, {worker} unread",
            )
            message = Job.objects.get(pk=job_id).message  # the job's: it keeps the execution's last state
            assert f"the cluster could not be read: {worker}: " in message, message
            assert unknown.state == "running"
            assert WorkerRead.objects.get(name=worker).failed_at is not None
            settings.WORKER_KUBECONFIG_DIR = str(STATE / "workers")
            _admitted(
                job_id, lambda job, e: job.state == "running", f"the job running again, {worker} watched"
            )
        finally:
            _cancel(token, job_id)
