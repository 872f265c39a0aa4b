"""Supervision from watches (issue 21) and reads that fail (issue 18 item 13), on the real control plane.

- a quiet cycle of `manage.py supervise` makes no API call and derives nothing; a change derives the one
  execution it touched;
- an informer lists once, then watches; a 410 Gone (injected: the API server keeps old resource versions for
  minutes, so it cannot be made to answer 410 on demand) lists afresh;
- a finished execution leaves the cache, and a namespace without active executions is no longer watched;
- two supervisors at once (a rolling update): one transition, one retry, no tombstone lost;
- one read forbidden by RBAC (dispatch's reads made as a ServiceAccount whose Role the test edits) is named,
  and the other reads still count: Events forbidden -> derived without them, said; Pods forbidden ->
  `unknown` naming them; allowed again -> back by itself.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from kubernetes import client

from cluster import gateway
from cluster import kueue as cluster_kueue
from cluster.errors import Expired
from cluster.informer import Informer
from jobs.models import Execution, Job, JobEvent, JobState, PodTombstone, SupervisorCycle
from jobs.supervision import cycle, tasks
from jobs.supervision.cache import CacheSource
from jobs.supervision.watch import ALIVE
from tests.jobs.supervision.support import (
    api,
    body,
    get,
    pods_of,
    running_pods,
    supervise_until,
    supervisor_process,
    transitions,
    wait_job,
)
from tests.support.deploy import token_kubeconfig
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster]


def _post(token: str, namespace: str, env: dict[str, str], **extra: Any) -> str:
    response = api(token).post("/api/v1/jobs", body(namespace, env, **extra), format="json")
    assert response.status_code == 202, response.json()
    job_id: str = response.json()["id"]
    return job_id


def _evict(kube: Any, namespace: str, pod: Any) -> None:
    kube.core.create_namespaced_pod_eviction(
        pod.metadata.name,
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.metadata.name, "namespace": namespace},
        },
    )


class Reports:
    """The cycle reports of a supervisor, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[cycle.CycleReport] = []

    def __call__(self, report: cycle.CycleReport) -> None:
        with self._lock:
            self.items.append(report)

    def since(self, count: int) -> list[cycle.CycleReport]:
        with self._lock:
            return [r for r in self.items[count:] if r.ran]

    def __len__(self) -> int:
        with self._lock:
            return len(self.items)


@contextlib.contextmanager
def watching(**options: Any) -> Iterator[tuple[CacheSource, Reports]]:
    source, reports = CacheSource(), Reports()
    try:
        with supervisor_process(source=source, on_cycle=reports, **options):
            yield source, reports
    finally:
        source.close()


# ---------------------------------------------------------------- quiet cycles


@pytest.mark.django_db(transaction=True)
def test_a_quiet_cycle_makes_no_api_call_and_a_change_derives_only_its_execution(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any
) -> None:
    runtime_on(None)
    token = submitter[1]
    quiet_job = _post(token, namespace, {"KWOK_STAY_RUNNING": "1"})
    changing = _post(token, namespace, {"KWOK_STAY_RUNNING": "1"}, recovery_policy={"retry": {"evicted": 0}})
    with watching(interval=0.5) as (source, reports):
        for job_id in (quiet_job, changing):
            wait_job(job_id, lambda j: j.state == JobState.RUNNING, what="running")
        # Settled: cycles that derive nothing, read nothing.
        mark = len(reports)
        wait_for(lambda: len([r for r in reports.since(mark) if r.derived == 0]) >= 3, what="quiet cycles")
        quiet = [r for r in reports.since(mark) if r.derived == 0]
        assert all((r.lists, r.gets, r.api_requests, r.bytes_received) == (0, 0, 0, 0) for r in quiet), quiet
        assert all(r.executions == 2 for r in quiet)
        lists = {i.name: i.lists for ns in source._namespaces.values() for i in ns.informers.values()}
        assert lists and all(count == 1 for count in lists.values()), lists  # one list each, then watches
        # One pod of one job changes: the next cycles derive that execution alone.
        mark = len(reports)
        _evict(kube, namespace, pods_of(kube, namespace, changing)[0])
        wait_job(changing, lambda j: j.state == JobState.FAILED, what="failed")
        busy = [r for r in reports.since(mark) if r.derived]
        assert busy and all(r.derived == 1 for r in busy), busy
        assert all(r.lists == 0 for r in busy)  # the watches brought the change
        assert any(r.gets for r in busy)  # the evicted pod's node, read by name
        assert Job.objects.get(pk=quiet_job).state == JobState.RUNNING
    assert Job.objects.get(pk=changing).cause == "evicted"


# ---------------------------------------------------------------- the informer


@pytest.mark.django_db
def test_an_informer_lists_once_then_watches_and_lists_afresh_after_410_gone(
    namespace: str, kube: Any, dispatch_on_cluster: str, monkeypatch: Any
) -> None:
    """The API server keeps old resource versions for minutes (etcd compaction every 5 minutes here), so a
    410 cannot be had on demand: the first watch is answered by an injected 410, as a real one would end."""
    real_open = gateway.open_watch
    injected: list[str] = []
    gone = threading.Event()

    class Gone:
        def events(self) -> Iterator[tuple[str, dict[str, Any]]]:
            gone.wait(30)
            raise Expired("Pods (watch)", "too old resource version", status=410)
            yield  # pragma: no cover

        def close(self) -> None:
            gone.set()

    def open_watch(*args: Any, **kwargs: Any) -> Any:
        if not injected:
            injected.append(kwargs["resource_version"])
            return Gone()
        return real_open(*args, **kwargs)

    monkeypatch.setattr(gateway, "open_watch", open_watch)
    changes: list[tuple[str, str]] = []
    informer = Informer(
        gateway.PODS,
        namespace,
        on_change=lambda kind, obj, old: changes.append((kind, obj["metadata"]["name"])),
        indexers={"name": lambda o: [o["metadata"]["name"]]},
    ).start()
    try:
        assert informer.synced.wait(30)
        # Made while the informer cannot watch: only the list after the 410 can bring it.
        kube.core.create_namespaced_pod(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "made-in-the-gap"},
                "spec": {"containers": [{"name": "c", "image": "localhost/x:v1"}]},
            },
        )
        gone.set()
        wait_for(lambda: informer.by_index("name", "made-in-the-gap"), timeout=30, what="the pod in the copy")
        assert informer.lists == 2 and injected and injected[0]
        kube.core.delete_namespaced_pod("made-in-the-gap", namespace, grace_period_seconds=0)
        wait_for(lambda: ("DELETED", "made-in-the-gap") in changes, timeout=30, what="the watch's DELETED")
        assert informer.lists == 2  # the rest came by the watch
        assert not informer.error
    finally:
        informer.stop()


@pytest.mark.django_db
def test_the_periodic_relist_runs_beside_the_watch_and_restores_what_the_copy_lost(
    namespace: str, kube: Any, dispatch_on_cluster: str
) -> None:
    """An event the watch missed cannot be had on demand: the copy loses a pod (dropped by hand), and the
    periodic re-list (asked for now) brings it back, while the watch goes on delivering."""
    changes: list[tuple[str, str]] = []
    informer = Informer(
        gateway.PODS,
        namespace,
        on_change=lambda kind, obj, old: changes.append((kind, obj["metadata"]["name"])),
        indexers={"name": lambda o: [o["metadata"]["name"]]},
    ).start()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {"containers": [{"name": "c", "image": "localhost/x:v1"}]},
    }
    try:
        kube.core.create_namespaced_pod(namespace, {**pod, "metadata": {"name": "kept"}})
        assert informer.synced.wait(30)
        wait_for(lambda: informer.by_index("name", "kept"), timeout=30, what="the pod in the copy")
        assert informer.purge(lambda o: o["metadata"]["name"] == "kept") == 1
        informer.relist_now()
        wait_for(lambda: informer.by_index("name", "kept"), timeout=30, what="the re-list restored it")
        assert informer.lists == 2 and not informer.error
        kube.core.create_namespaced_pod(namespace, {**pod, "metadata": {"name": "later"}})
        wait_for(lambda: ("ADDED", "later") in changes, timeout=30, what="the watch goes on")
        assert informer.lists == 2
    finally:
        informer.stop()


@pytest.mark.django_db(transaction=True)
def test_finished_executions_leave_the_cache_and_an_idle_namespace_is_not_watched(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any
) -> None:
    runtime_on(None)
    token = submitter[1]
    short = _post(token, namespace, {"KWOK_RUN_DURATION": "2s"})
    long = _post(token, namespace, {"KWOK_STAY_RUNNING": "1"})
    with watching(interval=0.5) as (source, _):
        wait_job(short, lambda j: j.state == JobState.SUCCEEDED, what="short succeeded")
        wait_job(long, lambda j: j.state == JobState.RUNNING, what="long running")
        # The completed TrainJob and its pods are still in the cluster; the cache keeps the running job's.
        assert kube.core.list_namespaced_pod(namespace, label_selector=f"dispatch.dev/job={short}").items
        wait_for(
            lambda: not any(source.labelled(kind, "dispatch.dev", short, 1) for kind in ("TrainJob", "Pod")),
            timeout=30,
            what="the finished job's objects dropped",
        )
        assert source.named("TrainJob", namespace, f"{long}-1")
        assert len(source.labelled("Pod", "dispatch.dev", long, 1)) == 2
        # TrainJobs, JobSets, Jobs, Pods, Events; and Workloads where Kueue's CRDs are served.
        assert source.active() == 1 and source.informer_count() == 5 + int(cluster_kueue.installed())
        response = api(token).post(f"/api/v1/jobs/{long}/cancel")
        assert response.status_code in (200, 202), response.json()
        wait_for(lambda: source.active() == 0, timeout=30, what="nothing tracked")
        wait_for(lambda: source.informer_count() == 0, timeout=30, what="the namespace no longer watched")
        assert source.cached_objects() == 0


@pytest.mark.django_db(transaction=True)
def test_a_pod_evicted_before_its_start_was_recorded_still_reads_evicted(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 200-job chaos run failed five evicted jobs as `unknown-failure` (never retried): under load the
    start task had created the TrainJob but not yet recorded it when a rank was evicted and its pod went. The
    watch saw the pod go, but no followed execution owned it, so its last state (the DisruptionTarget) was
    dropped. The supervisor now watches an execution's namespace and label domain while it is being started,
    and keeps such a pod's tombstone. Here the start is held between the TrainJob's create and its record (a
    paused call, released by the test) while a rank is evicted and its pod goes."""
    from jobs.submission import start

    runtime_on(None)
    reached, release = threading.Event(), threading.Event()
    real = start.own_copy

    def held(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        assert release.wait(90), "the test never released the start"
        return real(*args, **kwargs)

    monkeypatch.setattr(start, "own_copy", held)
    posted: dict[str, str] = {}
    poster = threading.Thread(
        target=lambda: posted.setdefault("id", _post(submitter[1], namespace, {"KWOK_STAY_RUNNING": "1"}))
    )
    with watching() as (source, _):
        poster.start()
        try:
            assert reached.wait(60), "the start never created its TrainJob"
            job = Job.objects.get(namespace=namespace)
            assert Execution.objects.get(job=job, attempt=1).submitted_at is None  # not recorded: held
            # The supervisor watches the namespace's pods before the start is recorded ...
            wait_for(
                lambda: any(i.synced.is_set() for i in source._informers(namespace, "Pod")),
                timeout=30,
                what="the namespace's pods watched while the job starts",
            )
            victim = sorted(running_pods(kube, namespace, job.id), key=lambda p: p.metadata.name)[0]
            _evict(kube, namespace, victim)
            wait_for(
                lambda: victim.metadata.uid not in {p.metadata.uid for p in pods_of(kube, namespace, job.id)},
                timeout=30,
                what="the evicted pod gone",
            )
            assert Execution.objects.get(job=job, attempt=1).submitted_at is None  # ... and it went meanwhile
        finally:
            release.set()
            poster.join(60)
        assert posted.get("id") == job.id
        wait_for(
            lambda: (
                Execution.objects.get(job=job, attempt=1).state
                not in (JobState.PENDING, JobState.QUEUED, JobState.RUNNING)
            ),
            timeout=60,
            what="attempt 1 judged",
        )
    execution = Execution.objects.get(job=job, attempt=1)
    assert (execution.state, execution.cause) == ("failed", "evicted"), (
        execution.message,
        execution.evidence,
    )
    assert execution.rank == int(victim.metadata.labels["batch.kubernetes.io/job-completion-index"])
    assert any("EvictionByEvictionAPI" in str(e["value"]) for e in execution.evidence)


# ---------------------------------------------------------------- two supervisors (a rolling update)


@pytest.mark.django_db(transaction=True)
def test_two_supervisors_during_a_rollout_retry_once_and_keep_the_tombstone(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any
) -> None:
    """Two `manage.py supervise` at once, each with its own watches: rank 0 is evicted (it vanishes within
    a moment: its DisruptionTarget is the only evidence). One transition, one retry, one attempt 2, the cause
    read from the tombstone; then the old supervisor stops and the new one carries attempt 2 on."""
    runtime_on(None)
    token = submitter[1]
    policy = {"retry": {"evicted": 1}, "backoff_seconds": {"evicted": 0}}
    job_id = _post(token, namespace, {"KWOK_STAY_RUNNING": "1"}, recovery_policy=policy)
    with contextlib.ExitStack() as new:
        _, new_reports = new.enter_context(watching(interval=1))
        with watching(interval=1) as (_, old_reports):
            wait_job(job_id, lambda j: j.state == JobState.RUNNING, what="running")
            wait_for(
                lambda: old_reports.since(0) and new_reports.since(0), what="both supervisors ran cycles"
            )
            _evict(
                kube, namespace, sorted(pods_of(kube, namespace, job_id), key=lambda p: p.metadata.name)[0]
            )
            wait_job(job_id, lambda j: j.current_attempt == 2, what="attempt 2")
        # The old supervisor has stopped (the rollout's second half): the new one carries on alone.
        wait_job(
            job_id, lambda j: j.state == JobState.RUNNING and j.current_attempt == 2, what="attempt 2 runs"
        )
    first = Execution.objects.get(job_id=job_id, attempt=1)
    assert (first.state, first.cause) == ("failed", "evicted"), (first.cause, first.message)
    assert any("EvictionByEvictionAPI" in str(e["value"]) for e in first.evidence)
    timeline = JobEvent.objects.filter(job_id=job_id).order_by("at", "id")
    events = list(timeline.values_list("kind", "attempt", "from_state", "to_state"))
    assert events.count(("retry", 1, "failed", "pending")) == 1, events
    assert [e for e in events if e[0] == "attempt"] == [("attempt", 2, "", "")], events
    moves = [(a, f, t) for kind, a, f, t in events if kind == "transition"]
    assert len(moves) == len(set(moves)), moves
    assert Execution.objects.filter(job_id=job_id).count() == 2
    assert not first.tombstones.exists()


@pytest.mark.django_db
def test_the_beats_cycle_leaves_the_work_to_a_live_supervisor(monkeypatch: Any) -> None:
    called: list[bool] = []

    def supervise(**_: Any) -> cycle.CycleReport:
        called.append(True)
        return cycle.CycleReport()

    monkeypatch.setattr(cycle, "supervise", supervise)
    tasks.supervise()
    assert called == [True]
    from datetime import timedelta

    from django.utils import timezone

    until = timezone.now() + timedelta(seconds=30)
    SupervisorCycle.objects.create(name=ALIVE, lease_holder="h:1:2", lease_until=until)
    tasks.supervise()
    assert called == [True]


# ---------------------------------------------------------------- one read forbidden (RBAC)


READS = {
    ("trainer.kubeflow.org", "trainjobs"),
    ("jobset.x-k8s.io", "jobsets"),
    ("batch", "jobs"),
    ("", "pods"),
    ("", "events"),
    ("kueue.x-k8s.io", "workloads"),  # listed once Kueue's CRDs are served (deploy/rbac grants it)
}


def _role(namespace: str, name: str, without: set[str]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": [
            {"apiGroups": [group], "resources": [resource], "verbs": ["get", "list", "watch"]}
            for group, resource in sorted(READS)
            if resource not in without
        ],
    }


@pytest.fixture
def supervisor_account(kube: Any, namespace: str, kubeconfig: str, tmp_path: Path) -> Any:
    """A ServiceAccount of the test namespace whose reads a Role grants (`allow(without=...)` rewrites it),
    and a kubeconfig holding only its token."""
    rbac: Any = client.RbacAuthorizationV1Api(kube.api_client)
    name = "t-supervisor"
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac.create_namespaced_role(namespace, _role(namespace, name, set()))
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    token = kube.core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    path = token_kubeconfig(kubeconfig, token, tmp_path / "supervisor.kubeconfig")
    auth: Any = client.AuthorizationV1Api(kube.api_client)

    def allowed(group: str, resource: str) -> bool:
        review = auth.create_subject_access_review(
            {
                "spec": {
                    "user": f"system:serviceaccount:{namespace}:{name}",
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                    "resourceAttributes": {
                        "namespace": namespace,
                        "verb": "list",
                        "group": group,
                        "resource": resource,
                    },
                }
            }
        )
        return bool(review.status.allowed)

    class Account:
        kubeconfig = path

        @staticmethod
        def allow(without: set[str]) -> None:
            rbac.replace_namespaced_role(name, namespace, _role(namespace, name, without))
            for group, resource in READS:
                expected = resource not in without
                wait_for(
                    lambda: allowed(group, resource) == expected,  # noqa: B023 (called within the iteration)
                    timeout=30,
                    what=f"RBAC in force for {resource}",
                )

    Account.allow(set())
    return Account


@pytest.mark.parametrize("path", ["beat", "watch"])
@pytest.mark.django_db(transaction=True)
def test_a_forbidden_read_is_named_and_the_other_reads_still_count(
    path: str,
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    supervisor_account: Any,
    settings: Any,
) -> None:
    """dispatch reads the cluster as a ServiceAccount of the job's namespace. Before, every list was
    cluster-wide, and one that failed turned every job `unknown`."""
    runtime_on(None)
    token = submitter[1]
    job_id = _post(token, namespace, {"KWOK_STAY_RUNNING": "1"})  # created as dispatch (admin)
    settings.KUBECONFIG = supervisor_account.kubeconfig  # read as the ServiceAccount from now on

    def judged(predicate: Any, what: str) -> dict[str, Any]:
        if path == "beat":
            return supervise_until(token, job_id, predicate, what=what)
        with watching(interval=0.5):
            wait_job(job_id, lambda j: predicate(get(token, j.pk)), what=what)
        return get(token, job_id)

    # Events forbidden: derived without them, and said.
    supervisor_account.allow({"events"})
    data = judged(
        lambda d: d["state"] == "running" and d.get("supervision_warnings"), "running, Events unreadable"
    )
    [warning] = data["supervision_warnings"]
    assert warning["object"] == f"Events in {namespace}"
    assert "forbidden" in warning["message"] and "derived without Events" in warning["message"]
    # Pods forbidden: the job cannot be judged: unknown, naming the read.
    supervisor_account.allow({"pods"})
    data = judged(lambda d: d["state"] == "unknown", "unknown")
    assert data["last_known_state"] == "running"
    assert f"Pods in {namespace}" in data["message"] and "forbidden" in data["message"], data["message"]
    # Allowed again: back by itself, nothing left to say.
    supervisor_account.allow(set())
    data = judged(lambda d: d["state"] == "running" and not d.get("supervision_warnings"), "back to running")
    assert ("running", "unknown") in transitions(data) and ("unknown", "running") in transitions(data)
    assert data["unknown_since"] is None


@pytest.mark.django_db(transaction=True)
def test_the_supervisor_outlives_a_database_connection_it_loses() -> None:
    """`manage.py supervise` lost its connection when PostgreSQL restarted (seen in a chaos run: its loop died
    on "terminating connection due to administrator command" and nothing restarted it; supervision fell back
    to the beat's slower cycle). Here PostgreSQL itself ends every other backend of the test database
    (pg_terminate_backend, what a fast shutdown does to each): the loop keeps saying it is alive."""
    from django.db import connection
    from django.utils import timezone

    def lease() -> Any:
        return SupervisorCycle.objects.filter(name=ALIVE).values_list("lease_until", flat=True).first()

    with supervisor_process(source=CacheSource(), interval=1) as stop:
        wait_for(lease, timeout=30, what="the supervisor to say it is alive")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            ended = [row[0] for row in cursor.fetchall()]
        assert ended and all(ended), f"no backend of the supervisor was ended: {ended}"
        after = timezone.now()
        wait_for(
            lambda: (until := lease()) is not None and until - timedelta(seconds=3) > after,
            timeout=30,
            what="the supervisor to renew its alive lease after losing its connection",
        )
        assert not stop.is_set()


@pytest.mark.django_db
def test_tombstones_the_database_did_not_take_wait_for_the_next_cycle(
    plain_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deleted pod's last state is kept as a tombstone, written at the next cycle; when the database does
    not take them (a restart: injected here, since PostgreSQL cannot refuse one chosen INSERT on demand),
    they stay for the cycle after instead of being dropped with the evidence they hold."""
    from django.db.utils import OperationalError

    from tests.jobs.dashboard.test_job_pages import make_job

    job = make_job(plain_user[0])
    execution = Execution.objects.get(job=job, attempt=1)
    source = CacheSource()
    pod = {"kind": "Pod", "metadata": {"uid": "u-1", "name": f"{job.id}-1-node-0-1-x"}}
    source._dead.append((execution.pk, pod))
    real = PodTombstone.objects.bulk_create

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("terminating connection due to administrator command (injected)")

    monkeypatch.setattr(PodTombstone.objects, "bulk_create", refused)
    with pytest.raises(OperationalError):
        source.flush()
    assert not PodTombstone.objects.exists()
    monkeypatch.setattr(PodTombstone.objects, "bulk_create", real)
    source.flush()
    assert list(PodTombstone.objects.values_list("execution_id", "pod_uid")) == [(execution.pk, "u-1")]


@pytest.mark.django_db(transaction=True)
def test_a_job_started_while_the_supervisor_waits_is_followed_before_its_next_period(
    submitter: tuple[User, str], namespace: str, runtime_on: Any
) -> None:
    """The watches announce changes to what is tracked; a job started in a namespace nobody watches yet was
    first tracked at the next periodic cycle (10 s by default: seen in the Kueue bench as 6.9 s of lag before
    `running`). The supervisor now asks the database each second while it waits. With a period of 10
    minutes, the job must still be followed to `running`."""
    runtime_on(None)
    with watching(interval=600) as (_, reports):
        wait_for(lambda: len(reports) >= 1, what="the supervisor's first cycle")
        job_id = _post(submitter[1], namespace, {"KWOK_STAY_RUNNING": "1"})
        wait_job(job_id, lambda j: j.state == JobState.RUNNING, timeout=60, what="running")


def test_an_informer_retries_an_unreachable_api_server_within_seconds() -> None:
    """While the API server cannot be reached (nothing listens: the default unreachable kubeconfig of the
    tests), an informer tries again at most a few seconds apart, so once the server is back the copy is
    current within seconds: evidence of a pod evicted and gone after an outage is otherwise lost (a chaos run
    read such evictions `unknown-failure` when informers waited up to 30 s between tries)."""
    from cluster import informer as informer_module

    waits: list[float] = []
    inf = Informer(gateway.PODS, "nowhere")
    real_wait = inf._stop.wait

    def wait(timeout: float | None = None) -> bool:
        waits.append(float(timeout or 0))
        return real_wait(0.01) if len(waits) < 8 else real_wait(5)

    inf._stop.wait = wait  # type: ignore[method-assign]
    inf.start()
    try:
        wait_for(lambda: len(waits) >= 8, timeout=60, what="eight failed tries")
    finally:
        inf.stop()
    assert "unreachable" in (inf.error or ""), inf.error
    assert waits[:3] == [1.0, 2.0, 3.0] and max(waits) == informer_module.UNAVAILABLE_RETRY_MAX_SECONDS <= 3.0
