"""Races of start, cancel and retry (issue 10), each driven through the real code path against PostgreSQL and
the real API server. Two deliveries are two threads, each on its own database connection, exactly as two
worker processes would be; where a test must hold one of them at a precise point it wraps a gateway call
(or the job's compare-and-set) with a pause, which changes no behaviour. Where a fault is injected (a 503
from the API server to one call) the test says so: the real API server cannot fail one chosen call on demand.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from cluster import gateway
from cluster.errors import ClusterUnavailable
from jobs import enqueue
from jobs.models import Execution, Job, JobEvent, JobState
from jobs.spec import JobSpec
from jobs.submission import start as starting
from jobs.submission import submit, sweeps
from jobs.submission.tasks import MAX_SUBMIT_RETRIES, execution_submit
from runtimes.models import SiteSettings
from tests.support.dispatch import GROUP, VERSION, trainer_job, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

UNREACHABLE = """apiVersion: v1
kind: Config
clusters: [{name: nowhere, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: nobody, user: {token: none}}]
contexts: [{name: nowhere, context: {cluster: nowhere, user: nobody}}]
current-context: nowhere
"""


@pytest.fixture(autouse=True)
def _require_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.fail(f"these races need PostgreSQL row locks; the database is {connection.vendor}")


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Submission tasks are recorded, not run: the test delivers them itself, at the moment it chooses."""
    ids: list[int] = []
    send = enqueue.send

    def record_submits(name: str, *args: Any, countdown: float | None = None) -> None:
        if name == enqueue.EXECUTION_SUBMIT:
            ids.append(args[0])
        else:
            send(name, *args, countdown=countdown)

    monkeypatch.setattr(enqueue, "send", record_submits)
    return ids


def _spec(namespace: str) -> JobSpec:
    return JobSpec.from_dict(
        {
            "runtime": {"kind": "TrainingRuntime", "name": "team-runtime", "namespace": namespace},
            "namespace": namespace,
            "image": "localhost/trainer:v1",
            "num_nodes": 1,
            "env": {"KWOK_STAY_RUNNING": "1"},
        }
    )


def _submit(owner: User, namespace: str) -> Execution:
    job = submit.job_submit(owner=owner, spec=_spec(namespace)).job
    assert job.state == JobState.PENDING, job.message
    return Execution.objects.get(job=job, attempt=1)


def _trainjob(kube: Any, namespace: str, name: str) -> dict[str, Any] | None:
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"]
    found = [i for i in items if i["metadata"]["name"] == name and not i["metadata"].get("deletionTimestamp")]
    return found[0] if found else None


def _listed(kube: Any, namespace: str, plural: str) -> list[str]:
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
    return sorted(i["metadata"]["name"] for i in items if not i["metadata"].get("deletionTimestamp"))


class Delivery(threading.Thread):
    """One delivery on its own database connection; its exception (if any) is kept for the test."""

    def __init__(self, name: str, target: Callable[[], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self.error: BaseException | None = None
        self.result: Any = None

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            connection.close()


def _lock_waits() -> int:
    """Backends of this test database waiting for a lock (a row lock held by another transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


@pytest.fixture
def pause_create(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The thread named "held" stops right before its first create call until `go` is set."""
    reached, go = threading.Event(), threading.Event()
    real = gateway.create_namespaced

    def create(kind: str, body: dict[str, Any]) -> dict[str, Any]:
        if threading.current_thread().name == "held" and not reached.is_set():
            reached.set()
            assert go.wait(60), "the test never released the held delivery"
        return real(kind, body)

    monkeypatch.setattr(gateway, "create_namespaced", create)
    yield reached, go
    go.set()


def test_two_deliveries_at_once_leave_the_trainjob_running(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    enqueued: list[int],
    pause_create: tuple[threading.Event, threading.Event],
) -> None:
    """The stale sweep re-enqueued an execution whose first delivery is still working: both run at once."""
    namespaced_runtime()
    execution = _submit(submitter[0], namespace)
    reached, go = pause_create
    held = Delivery("held", lambda: execution_submit.apply(args=(execution.pk,), task_id="delivery-1"))
    held.start()
    assert reached.wait(30), "the first delivery never reached the cluster"
    other = Delivery("other", lambda: execution_submit.apply(args=(execution.pk,), task_id="delivery-2"))
    other.start()
    other.join(60)
    # The race was reached: the second delivery ran to its end while the first was held inside its create.
    assert not other.is_alive(), "the second delivery did not finish within 60 s"
    assert not go.is_set() and held.is_alive()
    go.set()
    held.join(60)
    assert not held.is_alive(), "the first delivery did not finish within 60 s of its release"
    assert held.error is None and other.error is None, (held.error, other.error)

    job = Job.objects.get(pk=execution.job_id)
    assert job.state == JobState.QUEUED, job.message
    assert Execution.objects.get(pk=execution.pk).state == JobState.QUEUED
    assert _trainjob(kube, namespace, execution.trainjob_name) is not None, "the TrainJob of a queued job"
    assert JobEvent.objects.filter(job=job, kind="created").count() == 1


def test_a_second_chain_running_out_does_not_strand_the_one_that_succeeds(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    enqueued: list[int],
    pause_create: tuple[threading.Event, threading.Event],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chain 1 is creating the objects; chain 2 (from the sweep) sees the API server answer 503 to its create
    (an injected fault: the real server cannot fail one caller's request) on its last retry and gives up."""
    namespaced_runtime()
    execution = _submit(submitter[0], namespace)
    reached, go = pause_create
    held = Delivery("held", lambda: execution_submit.apply(args=(execution.pk,), task_id="chain-1"))
    held.start()
    assert reached.wait(30)
    create = gateway.create_namespaced

    def unavailable_to_chain_2(kind: str, body: dict[str, Any]) -> dict[str, Any]:
        if threading.current_thread().name == "chain-2":
            raise ClusterUnavailable(kind, "503 Service Unavailable (injected)", status=503)
        return create(kind, body)

    monkeypatch.setattr(gateway, "create_namespaced", unavailable_to_chain_2)
    last = Delivery(
        "chain-2",
        lambda: execution_submit.apply(args=(execution.pk,), retries=MAX_SUBMIT_RETRIES, task_id="chain-2"),
    )
    last.start()
    last.join(60)
    # The race was reached: chain 2 gave up while chain 1 was held inside its create.
    assert not last.is_alive(), "chain 2 did not finish within 60 s"
    assert not go.is_set() and held.is_alive()
    go.set()
    held.join(60)
    assert not held.is_alive(), "chain 1 did not finish within 60 s of its release"
    assert held.error is None and last.error is None, (held.error, last.error)

    job = Job.objects.get(pk=execution.job_id)
    execution.refresh_from_db()
    assert (job.state, execution.state) == (JobState.QUEUED, JobState.QUEUED), job.message
    assert job.current_attempt == 1  # so the supervisor watches it
    assert _trainjob(kube, namespace, execution.trainjob_name) is not None


def test_the_sweep_adds_no_chain_while_one_backs_off_and_resumes_the_job_after_the_outage(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    enqueued: list[int],
    settings: Any,
    tmp_path: Path,
) -> None:
    namespaced_runtime()
    execution = _submit(submitter[0], namespace)
    reachable = settings.KUBECONFIG
    (tmp_path / "nowhere").write_text(UNREACHABLE)
    settings.KUBECONFIG = str(tmp_path / "nowhere")  # the API server is down: a real connection refusal
    settings.KUBE_TIMEOUT_SECONDS = 2
    gateway.forget_cached_runtimes()
    from celery.exceptions import Retry

    with pytest.raises(Retry):
        execution_submit.apply(args=(execution.pk,), task_id="chain-1")
    # Two minutes later the chain is still backing off (its retries take about 3 minutes in all).
    Execution.objects.filter(pk=execution.pk).update(created_at=timezone.now() - timedelta(minutes=2))
    enqueued.clear()
    sweeps.executions_resubmit_stale()
    assert enqueued == [], "the sweep started a second retry chain beside the one backing off"

    # The chain runs out while the API server is still down: the job is unknown (it could not be started).
    execution_submit.apply(args=(execution.pk,), retries=MAX_SUBMIT_RETRIES, task_id="chain-1")
    job = Job.objects.get(pk=execution.job_id)
    assert job.state == JobState.UNKNOWN
    assert job.message.startswith("could not reach the cluster")

    # The API server is back: the sweep starts the execution again and the job reaches the cluster.
    settings.KUBECONFIG = reachable
    enqueued.clear()
    sweeps.executions_resubmit_stale()
    assert enqueued == [execution.pk]
    execution_submit.apply(args=(execution.pk,), task_id="sweep-1")
    job.refresh_from_db()
    assert job.state == JobState.QUEUED, job.message
    assert _trainjob(kube, namespace, execution.trainjob_name) is not None


def test_refused_at_start_removes_what_an_earlier_delivery_created(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    enqueued: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Delivery 1 created the copy and the TrainJob; the API server answered 503 to the ownerReference patch
    (an injected fault); then the platform broke the runtime; delivery 2 refuses the job."""
    namespaced_runtime()
    execution = _submit(submitter[0], namespace)
    patch = gateway.patch_namespaced

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise ClusterUnavailable("TrainingRuntime", "503 Service Unavailable (injected)", status=503)

    monkeypatch.setattr(gateway, "patch_namespaced", unavailable)
    from celery.exceptions import Retry

    with pytest.raises(Retry):
        execution_submit.apply(args=(execution.pk,), task_id="chain-1")
    assert _trainjob(kube, namespace, execution.trainjob_name) is not None
    monkeypatch.setattr(gateway, "patch_namespaced", patch)

    original = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime"
    )
    trainer_job(original)["template"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    kube.custom.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime", original
    )
    gateway.forget_cached_runtimes()
    execution_submit.apply(args=(execution.pk,), task_id="chain-1", retries=1)  # the chain's next delivery
    job = Job.objects.get(pk=execution.job_id)
    assert job.state == JobState.REFUSED
    wait_for(
        lambda: _trainjob(kube, namespace, execution.trainjob_name) is None,
        timeout=30,
        what="the refused job's TrainJob to be deleted",
    )
    wait_for(
        lambda: _listed(kube, namespace, "trainingruntimes") == ["team-runtime"],
        timeout=60,
        what="the refused job's runtime copy to be deleted",
    )


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


def _started(kube: Any, owner: User, namespace: str) -> Execution:
    execution = _submit(owner, namespace)
    execution_submit.apply(args=(execution.pk,))
    execution.refresh_from_db()
    assert execution.state == JobState.QUEUED, execution.job.message
    assert _trainjob(kube, namespace, execution.trainjob_name) is not None
    return execution


def test_cancel_deletes_the_trainjob_after_the_platform_changed_the_label_domain(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    enqueued: list[int],
) -> None:
    namespaced_runtime()
    execution = _started(kube, submitter[0], namespace)
    SiteSettings.objects.filter(pk=1).update(label_domain="platform.example")
    response = _api(submitter[1]).post(f"/api/v1/jobs/{execution.job_id}/cancel")
    assert response.status_code in (200, 202), response.content
    wait_for(
        lambda: _trainjob(kube, namespace, execution.trainjob_name) is None,
        timeout=30,
        what="the cancelled job's TrainJob to be deleted",
    )


def test_a_cancel_whose_delete_ran_out_of_retries_is_finished_by_the_sweep(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    enqueued: list[int],
    settings: Any,
    tmp_path: Path,
) -> None:
    namespaced_runtime()
    execution = _started(kube, submitter[0], namespace)
    reachable = settings.KUBECONFIG
    (tmp_path / "nowhere").write_text(UNREACHABLE)
    settings.KUBECONFIG = str(tmp_path / "nowhere")  # the API server is down while the job is cancelled
    settings.KUBE_TIMEOUT_SECONDS = 2
    response = _api(submitter[1]).post(f"/api/v1/jobs/{execution.job_id}/cancel")
    assert response.status_code in (200, 202), response.content
    assert Job.objects.get(pk=execution.job_id).state == JobState.CANCELLED
    assert _trainjob(kube, namespace, execution.trainjob_name) is not None  # the delete could not run
    settings.KUBECONFIG = reachable
    sweeps.executions_resubmit_stale(older_than_seconds=0)
    wait_for(
        lambda: _trainjob(kube, namespace, execution.trainjob_name) is None,
        timeout=30,
        what="the sweep to finish the lost cancel",
    )


def test_start_and_cancel_at_once_neither_deadlocks_nor_answers_500(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    enqueued: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Start's last step (record the created TrainJob) and a cancel request run at the same moment."""
    namespaced_runtime()
    execution = _submit(submitter[0], namespace)
    reached, go = threading.Event(), threading.Event()
    record = starting._record_start

    def held_record(**kwargs: Any) -> bool:
        if threading.current_thread().name == "start" and not reached.is_set():
            reached.set()
            assert go.wait(60)
        return record(**kwargs)

    monkeypatch.setattr(starting, "_record_start", held_record)
    start = Delivery("start", lambda: starting.execution_submit(execution_id=execution.pk))
    start.start()
    assert reached.wait(60), "start never reached its compare-and-set"
    cancel = Delivery("cancel", lambda: _api(submitter[1]).post(f"/api/v1/jobs/{execution.job_id}/cancel"))
    cancel.start()
    # The race is reached: the cancel answers while the start is held between its create and its
    # compare-and-set (the start holds no row lock there, so the cancel does not wait for it).
    cancel.join(60)
    assert not cancel.is_alive(), "the cancel did not answer within 60 s while the start was held"
    assert start.is_alive() and not go.is_set()
    assert _lock_waits() == 0
    go.set()
    start.join(60)
    cancel.join(60)
    assert not start.is_alive() and not cancel.is_alive(), "the start or the cancel hung after the release"
    assert start.error is None, start.error
    assert cancel.error is None, cancel.error
    assert cancel.result.status_code in (200, 202), cancel.result.content
    job = Job.objects.get(pk=execution.job_id)
    assert job.state == JobState.CANCELLED
    assert Execution.objects.get(pk=execution.pk).state == JobState.CANCELLED
    wait_for(
        lambda: _trainjob(kube, namespace, execution.trainjob_name) is None,
        timeout=30,
        what="the cancelled job's TrainJob to be deleted",
    )


def test_two_delete_deliveries_at_once_stop_then_delete_once_and_no_rank_runs_again(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    enqueued: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delete task can run twice at once (a redelivery beside the sweep's). Both pass through the stop
    path together: each is held at its stop of the TrainJob until the other has reached it too (a barrier
    around jobs.stopping.trainjob_stop, which changes no behaviour), so both suspend the same TrainJob, wait
    for the Trainer's Suspended and delete it. Each then retries as the task does until its objects are gone.
    The TrainJob and its copy go, the execution is recorded removed once, neither delivery fails, and no pod
    of the attempt appears after the stop (the cluster's own pod list)."""
    from jobs import stopping
    from jobs.submission import cancel
    from jobs.submission.errors import TransientSubmitError

    namespaced_runtime()
    execution = _started(kube, submitter[0], namespace)
    selector = f"dispatch.dev/job={execution.job_id},dispatch.dev/attempt=1"

    def pods() -> list[Any]:
        return list(kube.core.list_namespaced_pod(namespace, label_selector=selector).items)

    running = wait_for(
        lambda: found if (found := pods()) and all(p.status.phase == "Running" for p in found) else None,
        timeout=90,
        what="attempt 1's pod running",
    )
    before = {p.metadata.uid for p in running}
    Execution.objects.filter(pk=execution.pk).update(delete_requested_at=timezone.now())

    both_at_stop = threading.Barrier(2, timeout=60)
    reached: list[str] = []
    real_stop = stopping.trainjob_stop

    def stop(**kwargs: Any) -> None:
        reached.append(threading.current_thread().name)
        if len(reached) <= 2:
            both_at_stop.wait()  # both deliveries are in the stop path at once
        real_stop(**kwargs)

    monkeypatch.setattr(stopping, "trainjob_stop", stop)
    errors: list[BaseException] = []
    done: list[str] = []

    def deliver() -> None:
        try:
            for _ in range(60):  # the task's retries, without its backoff
                try:
                    cancel.execution_delete(execution_id=execution.pk)
                    done.append(threading.current_thread().name)
                    return
                except TransientSubmitError:
                    threading.Event().wait(0.5)
            errors.append(AssertionError("the delete never finished"))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    observed: set[str] = set()  # every pod of the attempt the cluster lists while the deliveries run
    threads = [threading.Thread(target=deliver, name=f"delivery-{i}") for i in (1, 2)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        observed |= {p.metadata.uid for p in pods()}
        threading.Event().wait(0.1)
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "a delivery is still running"
    assert errors == [], errors
    assert sorted(reached[:2]) == ["delivery-1", "delivery-2"], reached  # the race was reached
    assert sorted(done) == ["delivery-1", "delivery-2"]
    assert _trainjob(kube, namespace, execution.trainjob_name) is None
    assert execution.trainjob_name not in _listed(kube, namespace, "trainingruntimes")
    execution.refresh_from_db()
    assert execution.objects_removed_at is not None
    wait_for(lambda: not pods(), timeout=60, what="attempt 1's pods gone")
    assert observed <= before, f"new pods of attempt 1 during the deletes: {sorted(observed - before)}"
