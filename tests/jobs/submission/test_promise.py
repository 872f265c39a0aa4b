"""The promise under contention, submission's side (issue 18, items 2, 4, 5 and 6), against PostgreSQL and the
real control plane.

- 2: attempt 2 meets a TrainingRuntime a namespace member pre-created under its name: never adopted, never
  deleted, the job fails config-error naming the object and what differs, nothing runs on it.
- 4: a change of the site's label domain changes nothing already submitted: a redelivery adopts its own
  objects (it does not refuse them), and a cancel removes them.
- 5: a cancel while a start's TrainJob create is in flight: the objects are recorded removed only once no
  start can create any more and a read shows them gone; the create that lands after the cancel's delete is
  removed (by the start itself, or by the sweep when the start died before its bookkeeping).
- 6: a delivery paused past its lease while another took over and attempt 2 started: its creates are fenced,
  and what it made is removed; the cluster shows attempt 2's TrainJob only.

Two deliveries are two threads, each on its own database connection, as two worker processes would be. A
delivery is held at a precise point by wrapping a gateway call with a pause (no behaviour changes); "the
worker died" is a BaseException raised in the delivery thread right after a call, so no code of the delivery
runs after it, as after a SIGKILL. Waits are on the state that shows the interleaving (a paused call reached,
a lease run out in the database, objects gone from the API server), never a sleep that hopes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from celery.exceptions import Retry
from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase
from django.utils import timezone
from rest_framework.test import APIClient

from cluster import gateway
from cluster.guard import RESUMED_ANNOTATION
from dispatch_site import roles
from dispatch_site.services import user_create
from jobs import enqueue
from jobs.models import Execution, Job, JobState
from jobs.spec import JobSpec
from jobs.submission import claim, submit, sweeps
from jobs.submission import start as starting
from jobs.supervision import cycle
from tests.support.cluster import KueueQueue
from tests.support.dispatch import GROUP, VERSION, runtime_body, trainer_job, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _require_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.fail(f"these races need PostgreSQL row locks; the database is {connection.vendor}")


@pytest.fixture
def held_submits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Start tasks are recorded, not run: the test delivers them itself, at the moment it chooses. Every other
    task (the delete a cancel enqueues) runs in-process, as a worker would run it; a retry it asks for is
    left to the sweep (a worker would run it a few seconds later)."""
    ids: list[int] = []
    send = enqueue.send

    def record_submits(name: str, *args: Any, countdown: float | None = None) -> None:
        if name == enqueue.EXECUTION_SUBMIT:
            ids.append(args[0])
            return
        with contextlib.suppress(Retry):
            send(name, *args, countdown=countdown)

    monkeypatch.setattr(enqueue, "send", record_submits)
    return ids


class Delivery(threading.Thread):
    """One delivery on its own database connection; its exception (if any) is kept for the test."""

    def __init__(self, name: str, target: Callable[[], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._target_fn()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            connection.close()


class WorkerKilled(BaseException):
    """Raised in a delivery thread to stop it dead, as a SIGKILL would: no except or finally of the delivery
    catches a BaseException that is not an Exception."""


class Pause:
    """Holds the thread named "held" at its gateway create of one kind until the test lets it go; optionally
    kills it right after its create of a kind returns (the worker died before any bookkeeping)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hold: str, kill_after: str = "") -> None:
        self.reached, self.go, self.returned = threading.Event(), threading.Event(), threading.Event()
        self.calls: list[tuple[str, str]] = []  # (kind, name) of every create the held thread sent
        real = gateway.create_namespaced

        def create(kind: str, body: dict[str, Any]) -> dict[str, Any]:
            if threading.current_thread().name != "held":
                return real(kind, body)
            if kind == hold and not self.reached.is_set():
                self.reached.set()
                assert self.go.wait(120), "the test never released the held delivery"
            self.calls.append((kind, body["metadata"]["name"]))
            result = real(kind, body)
            if kind == hold:
                self.returned.set()
            if kind == kill_after:
                raise WorkerKilled(f"killed right after the {kind} create returned")
            return result

        monkeypatch.setattr(gateway, "create_namespaced", create)


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


def _spec(namespace: str, **extra: Any) -> dict[str, Any]:
    return {
        "runtime": {"kind": "TrainingRuntime", "name": "team-runtime", "namespace": namespace},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
        "env": {"KWOK_STAY_RUNNING": "1"},
    } | extra


def _submit(owner: User, namespace: str, **extra: Any) -> Execution:
    job = submit.job_submit(owner=owner, spec=JobSpec.from_dict(_spec(namespace, **extra))).job
    assert job.state == JobState.PENDING, job.message
    return Execution.objects.get(job=job, attempt=1)


def _held_start(execution: Execution, holder: str = "chain-1") -> Delivery:
    """The execution's start delivery, on a thread named "held" (what Pause holds), not started yet."""
    return Delivery("held", lambda: starting.execution_submit(execution_id=execution.pk, holder=holder))


def _submitted_and_killed_after_its_creates(
    owner: User, namespace: str, monkeypatch: pytest.MonkeyPatch, **extra: Any
) -> Execution:
    """A job submitted, and its start delivery killed right after its TrainJob create returned (before any
    bookkeeping): the runtime copy and the TrainJob exist, the job is still pending."""
    execution = _submit(owner, namespace, **extra)
    pause = Pause(monkeypatch, hold="TrainJob", kill_after="TrainJob")
    pause.go.set()
    first = _held_start(execution)
    first.start()
    first.join(60)
    assert isinstance(first.error, WorkerKilled), first.error
    return execution


def _names(kube: Any, namespace: str, plural: str) -> list[str]:
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
    return sorted(i["metadata"]["name"] for i in items if not i["metadata"].get("deletionTimestamp"))


def _all_names(kube: Any, namespace: str, plural: str) -> list[str]:
    """Including objects being deleted: what still exists for the API server."""
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
    return sorted(i["metadata"]["name"] for i in items)


def _supervise_until(predicate: Callable[[], Any], what: str, timeout: float = 120) -> Any:
    """Supervision cycles (the beat task's code) until `predicate` holds; what a cycle enqueues on commit
    (start attempt A+1, remove objects) runs as a worker would run it."""

    def check() -> Any:
        with TestCase.captureOnCommitCallbacks(execute=True):
            cycle.supervise()
        return predicate()

    return wait_for(check, timeout=timeout, interval=0.5, what=what)


# ------------------------------------------------------------------------------------------ item 2


RETRY_APP_ERROR = {"retry": {"app-error": 1}, "budgets": {"user": 1}, "backoff_seconds": {"app-error": 0}}


def test_attempt_2_neither_adopts_nor_deletes_a_runtime_a_namespace_member_made_under_its_name(
    kube: Any, namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any]
) -> None:
    """The real retry path: attempt 1's rank exits 3 (app-error), the job's policy retries it once, and the
    supervisor starts attempt 2, whose runtime copy `<job>-2` a namespace member made first."""
    namespaced_runtime()
    api = _api(submitter[1])
    body = _spec(
        namespace,
        env={"KWOK_EXIT_CODE": "3", "KWOK_RUN_DURATION": "1s"},
        recovery_policy=RETRY_APP_ERROR,
    )
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = api.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED

    # Before attempt 2 starts, a namespace member creates `<job>-2` with another spec (an image nobody
    # reviewed), labelled with the job's id and attempt as dispatch labels its copies.
    foreign = runtime_body("TrainingRuntime", f"{job_id}-2", namespace)
    foreign["metadata"]["labels"] = {"dispatch.dev/job": job_id, "dispatch.dev/attempt": "2"}
    node = trainer_job(foreign)["template"]["spec"]["template"]["spec"]["containers"][0]
    node["image"] = "registry.example/unreviewed:1"
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", foreign)

    data = _supervise_until(
        lambda: (lambda d: d if d["current_attempt"] == 2 and d["state"] == "failed" else None)(
            api.get(f"/api/v1/jobs/{job_id}").json()
        ),
        what="attempt 2 to start and fail",
    )
    assert data["cause"] == "config-error", data
    assert f"TrainingRuntime {namespace}/{job_id}-2" in data["message"]
    assert "already exists and was not created by dispatch" in data["message"]
    # What differs is named: the label and annotation dispatch puts on what it makes, and the content.
    assert "app.kubernetes.io/managed-by" in data["message"]
    assert "dispatch.dev/body-hash" in data["message"]
    assert "spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers[0]" in data["message"]
    # Never adopted (no TrainJob owns it), never deleted; nothing runs on it.
    still = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", f"{job_id}-2"
    )
    assert still["metadata"]["uid"] and not still["metadata"].get("ownerReferences")
    assert f"{job_id}-2" not in _all_names(kube, namespace, "trainjobs")
    pods = kube.core.list_namespaced_pod(
        namespace, label_selector=f"dispatch.dev/job={job_id},dispatch.dev/attempt=2"
    )
    assert pods.items == []


def test_a_redelivery_adopts_only_the_body_it_would_create(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    held_submits: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delivery created the copy and the TrainJob and died before its bookkeeping; its redelivery adopts
    both (they carry the hash of exactly the bodies it would create) and the job is queued."""
    namespaced_runtime()
    execution = _submitted_and_killed_after_its_creates(submitter[0], namespace, monkeypatch)
    assert Job.objects.get(pk=execution.job_id).state == JobState.PENDING
    trainjob = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs", execution.trainjob_name
    )
    assert trainjob["metadata"]["annotations"]["dispatch.dev/body-hash"]

    starting.execution_submit(execution_id=execution.pk, holder="chain-1")  # the broker redelivers it
    job = Job.objects.get(pk=execution.job_id)
    assert job.state == JobState.QUEUED, job.message
    again = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs", execution.trainjob_name
    )
    assert again["metadata"]["uid"] == trainjob["metadata"]["uid"]
    # The adopted TrainJob's UID is the one recorded (the adoption's answer is the object).
    assert Execution.objects.get(pk=execution.pk).trainjob_uid == trainjob["metadata"]["uid"]


def test_a_redelivery_adopts_the_trainjob_kueue_resumed_under_the_guards_mark(
    kube: Any,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    held_submits: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delivery created the TrainJob on a Kueue queue and died before its bookkeeping; Kueue admitted and
    resumed it, and the guard's MutatingAdmissionPolicy (deploy/guard/kueue.yaml, policy 4) marked it
    resumed. The redelivery must adopt it: the mark is the cluster's, not a change to dispatch's body. Seen
    in `make chaos` seed 1 at 5c08c8e: the Kueue wave's high job failed `config-error` ("its content differs
    from what dispatch would create at metadata.annotations.guard.dispatch.dev/resumed")."""
    namespace = kueue_queue.namespace
    namespaced_runtime()
    execution = _submitted_and_killed_after_its_creates(
        submitter[0], namespace, monkeypatch, queue_name=kueue_queue.name
    )

    def marked() -> dict[str, Any] | None:
        trainjob = kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainjobs", execution.trainjob_name
        )
        return trainjob if (trainjob["metadata"].get("annotations") or {}).get(RESUMED_ANNOTATION) else None

    trainjob = wait_for(marked, timeout=60, what="Kueue resuming the TrainJob under the guard's mark")
    starting.execution_submit(execution_id=execution.pk, holder="chain-1")  # the broker redelivers it
    job = Job.objects.get(pk=execution.job_id)
    assert (job.state, job.cause) == (JobState.QUEUED, ""), job.message
    assert Execution.objects.get(pk=execution.pk).trainjob_uid == trainjob["metadata"]["uid"]


# ------------------------------------------------------------------------------------------ item 4


def test_a_label_domain_change_changes_nothing_already_submitted(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    held_submits: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start created the objects and the worker died before its bookkeeping; the platform then changes the
    site's label domain (PATCH /api/v1/settings); the redelivery must adopt its own objects, made under the
    job's domain, not refuse them; and the cancel removes them."""
    namespaced_runtime()
    _, platform_token = user_create(username="pat-domain", role=roles.PLATFORM, namespaces=["*"])
    execution = _submitted_and_killed_after_its_creates(submitter[0], namespace, monkeypatch)

    patched = _api(platform_token).patch(
        "/api/v1/settings", {"label_domain": "platform.example"}, format="json"
    )
    assert patched.status_code == 200, patched.json()

    starting.execution_submit(execution_id=execution.pk, holder="chain-1")  # the broker redelivers it
    job = Job.objects.get(pk=execution.job_id)
    assert (job.state, job.cause) == (JobState.QUEUED, ""), job.message
    trainjob = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs", execution.trainjob_name
    )
    assert trainjob["metadata"]["labels"]["dispatch.dev/job"] == job.id
    assert "platform.example/job" not in trainjob["metadata"]["labels"]
    # The plan recorded at start shows the objects as made: in the job's domain.
    assert job.plan is not None
    assert job.plan["objects"]["train_job"]["metadata"]["labels"]["dispatch.dev/job"] == job.id

    response = _api(submitter[1]).post(f"/api/v1/jobs/{job.id}/cancel")
    assert response.status_code in (200, 202), response.content
    wait_for(
        lambda: (
            execution.trainjob_name not in _all_names(kube, namespace, "trainjobs")
            and execution.trainjob_name not in _all_names(kube, namespace, "trainingruntimes")
        ),
        timeout=30,
        what="the cancelled job's TrainJob and copy to be deleted",
    )


# ------------------------------------------------------------------------------------------ item 5


def _cancel_while_a_start_is_in_flight(
    kube: Any, namespace: str, submitter: tuple[User, str], pause: Pause
) -> tuple[Execution, Delivery]:
    """A start delivery passes its fence and is held at its copy create; the user cancels, and the delete task
    runs while nothing exists yet; then the held create lands."""
    execution = _submit(submitter[0], namespace)
    held = _held_start(execution)
    held.start()
    assert pause.reached.wait(60), "the start never reached its create"
    response = _api(submitter[1]).post(f"/api/v1/jobs/{execution.job_id}/cancel")  # runs the delete task
    assert response.status_code in (200, 202), response.content
    assert _all_names(kube, namespace, "trainingruntimes") == ["team-runtime"]  # the delete found nothing
    execution.refresh_from_db()
    assert execution.objects_removed_at is None, "recorded removed while a start could still create"
    pause.go.set()
    assert pause.returned.wait(60), "the held create never returned"
    held.join(60)
    return execution, held


def test_a_start_in_flight_during_a_cancel_leaves_no_trainjob_under_the_cancelled_job(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    held_submits: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The copy create lands after the cancel's delete. The start must not go on to create the TrainJob
    (had it done so, the worker is killed right after, before any bookkeeping: the TrainJob would run on
    under a cancelled job, recorded as removed)."""
    namespaced_runtime()
    pause = Pause(monkeypatch, hold="TrainingRuntime", kill_after="TrainJob")
    execution, held = _cancel_while_a_start_is_in_flight(kube, namespace, submitter, pause)
    assert ("TrainJob", execution.trainjob_name) not in pause.calls, "a TrainJob create after the cancel"
    assert held.error is None, held.error
    assert execution.trainjob_name not in _all_names(kube, namespace, "trainjobs")
    wait_for(
        lambda: execution.trainjob_name not in _all_names(kube, namespace, "trainingruntimes"),
        timeout=30,
        what="the copy that landed after the cancel to be deleted",
    )
    sweeps.executions_resubmit_stale(older_than_seconds=0)  # the delete is finished and recorded
    wait_for(
        lambda: Execution.objects.get(pk=execution.pk).objects_removed_at is not None,
        timeout=30,
        what="the removal to be recorded",
    )
    assert Job.objects.get(pk=execution.job_id).state == JobState.CANCELLED


def test_what_a_start_that_died_created_after_the_cancels_delete_is_removed_by_the_sweep(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    held_submits: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The create lands after the cancel's delete and the worker dies before its bookkeeping. The sweep keeps
    deleting; the removal is recorded only once the dead start's lease ran out and a read shows it gone."""
    namespaced_runtime()
    pause = Pause(monkeypatch, hold="TrainingRuntime", kill_after="TrainingRuntime")
    execution, held = _cancel_while_a_start_is_in_flight(kube, namespace, submitter, pause)
    assert isinstance(held.error, WorkerKilled), held.error
    assert execution.trainjob_name in _names(kube, namespace, "trainingruntimes")  # it landed

    # The sweep runs while the dead start's lease still runs: nothing is recorded as removed.
    sweeps.executions_resubmit_stale(older_than_seconds=0)
    execution.refresh_from_db()
    assert execution.objects_removed_at is None
    # The lease runs out (time passes: moved in the database, where the lease is kept).
    Execution.objects.filter(pk=execution.pk).update(claim_until=timezone.now())
    wait_for(
        lambda: (
            sweeps.executions_resubmit_stale(older_than_seconds=0) is not None
            and Execution.objects.get(pk=execution.pk).objects_removed_at is not None
        ),
        timeout=60,
        what="the sweep to remove the copy and record it",
    )
    assert execution.trainjob_name not in _all_names(kube, namespace, "trainjobs")
    assert execution.trainjob_name not in _all_names(kube, namespace, "trainingruntimes")


# ------------------------------------------------------------------------------------------ item 6


def test_a_delivery_that_outlived_its_lease_creates_nothing_beside_attempt_2(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    held_submits: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Delivery 1 of attempt 1 is held at its first create past its (shortened) lease; delivery 2 takes
    over and starts attempt 1, which fails (app-error) and is retried: attempt 1's objects are deleted and
    attempt 2 runs. Then delivery 1's create lands: the TrainJob create after it is refused by the fence,
    and the copy it made is removed. The cluster shows no TrainJob of attempt 1 any more."""
    namespaced_runtime()
    monkeypatch.setattr(claim, "SUBMIT_LEASE_SECONDS", 1)
    execution = _submit(
        submitter[0],
        namespace,
        env={"KWOK_EXIT_CODE": "3", "KWOK_RUN_DURATION": "1s"},
        recovery_policy=RETRY_APP_ERROR,
    )
    first_name = execution.trainjob_name
    pause = Pause(monkeypatch, hold="TrainingRuntime")
    stale = _held_start(execution, holder="delivery-1")
    stale.start()
    assert pause.reached.wait(60), "delivery 1 never reached its create"
    wait_for(
        lambda: Execution.objects.filter(pk=execution.pk, claim_until__lt=timezone.now()).exists(),
        timeout=30,
        what="delivery 1's lease to run out",
    )
    starting.execution_submit(execution_id=execution.pk, holder="delivery-2")  # the sweep's delivery
    execution.refresh_from_db()
    assert execution.state == JobState.QUEUED and execution.claim_holder == ""
    job_id = execution.job_id
    second = _supervise_until(
        lambda: Execution.objects.filter(job_id=job_id, attempt=2).first(),
        what="attempt 1 to fail and the supervisor to start attempt 2",
    )
    assert held_submits[-1] == second.pk
    starting.execution_submit(execution_id=second.pk, holder="attempt-2")  # its start task
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED
    wait_for(
        lambda: (
            first_name not in _all_names(kube, namespace, "trainjobs")
            and first_name not in _all_names(kube, namespace, "trainingruntimes")
        ),
        timeout=60,
        what="attempt 1's objects to be removed",
    )

    pause.go.set()  # delivery 1's create of attempt 1's copy lands now
    stale.join(60)
    assert stale.error is None, stale.error
    assert ("TrainJob", first_name) not in pause.calls, "the stale delivery sent a TrainJob create"
    wait_for(
        lambda: first_name not in _all_names(kube, namespace, "trainingruntimes"),
        timeout=30,
        what="the stale delivery's copy to be removed",
    )
    # Attempt 2 fails like attempt 1 (same ranks) and its TrainJob may already be gone too: attempt 1's never
    # comes back.
    assert set(_all_names(kube, namespace, "trainjobs")) <= {f"{job_id}-2"}
    assert Job.objects.get(pk=job_id).current_attempt == 2


# ------------------------------------------------------------------------------- a JobSet rebuilt at delete


def test_the_jobset_the_trainer_rebuilds_during_the_delete_runs_no_rank_again(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    held_submits: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Trainer v2.3.0 rebuilds the JobSet of a TrainJob that has not completed whenever the JobSet goes
    (status-facts §12). A background delete of the TrainJob lets the garbage collector remove the JobSet
    while the Trainer's cache may still hold the TrainJob: seen in a chaos run, the Trainer rebuilt the
    JobSet of a failed attempt and both ranks ran again for 30 ms under the same identity (the identity
    observer caught it). Here the interleaving is made certain: right before dispatch's delete of the
    TrainJob, the test deletes the JobSet and waits until the real Trainer has rebuilt it from the
    TrainJob that still exists. dispatch stops the TrainJob first (spec.suspend, and waits for the
    Trainer's Suspended condition), so the rebuilt JobSet is suspended and its Jobs make no pod. Without
    the stop, the rebuilt JobSet's pods run rank 0 of attempt 1 a second time."""
    namespaced_runtime()
    execution = _submit(submitter[0], namespace)
    starting.execution_submit(execution_id=execution.pk, holder="chain-1")
    selector = f"dispatch.dev/job={execution.job_id},dispatch.dev/attempt=1"

    def running() -> list[Any]:
        pods = kube.core.list_namespaced_pod(namespace, label_selector=selector).items
        return [p for p in pods if p.status.phase == "Running"]

    [first] = wait_for(running, timeout=90, what="rank 0 of attempt 1 running")
    first_jobset = first.metadata.labels["jobset.sigs.k8s.io/jobset-uid"]
    rebuilt: list[str] = []
    ran_again: list[str] = []  # pods of the rebuilt JobSet: rank 0 of attempt 1 a second time
    real_delete = gateway.delete_namespaced

    def jobset_uid() -> str:
        try:
            obj = kube.custom.get_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", execution.trainjob_name
            )
        except Exception:  # 404 while the Trainer has not rebuilt it yet
            return ""
        return str(obj["metadata"]["uid"])

    def second_runs() -> list[str]:
        pods = kube.core.list_namespaced_pod(
            namespace, label_selector=f"jobset.sigs.k8s.io/jobset-uid={rebuilt[0]}"
        ).items
        return [p.metadata.name for p in pods]

    def delete(kind: str, ns: str, name: str, *, uid: str = "") -> bool:
        if kind == "TrainJob" and not rebuilt:
            kube.custom.delete_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name, propagation_policy="Background"
            )
            rebuilt.append(
                wait_for(
                    lambda: (u := jobset_uid()) and u != first_jobset and u,
                    timeout=30,
                    what="the Trainer to rebuild the JobSet of the TrainJob that still exists",
                )
            )
            wait_for(
                lambda: (
                    kube.batch.list_namespaced_job(
                        ns, label_selector=f"jobset.sigs.k8s.io/jobset-uid={rebuilt[0]}"
                    ).items
                ),
                timeout=30,
                what="the rebuilt JobSet's Job",
            )
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and not ran_again:  # an unsuspended Job makes its pods at once
                ran_again.extend(second_runs())
                time.sleep(0.1)
        return real_delete(kind, ns, name, uid=uid)

    monkeypatch.setattr(gateway, "delete_namespaced", delete)
    response = _api(submitter[1]).post(f"/api/v1/jobs/{execution.job_id}/cancel")
    assert response.status_code in (200, 202), response.content
    wait_for(
        lambda: execution.trainjob_name not in _all_names(kube, namespace, "trainjobs"),
        timeout=60,
        what="the cancelled job's TrainJob to be deleted",
    )
    assert rebuilt, "the test never saw dispatch delete the TrainJob"
    assert ran_again == [], "rank 0 of attempt 1 ran again under the rebuilt JobSet"

    # The rebuilt JobSet's Jobs, if any are left before the garbage collector takes them, make no pod.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # an absence: watched for a while, not proven by one read
        assert second_runs() == [], "rank 0 of attempt 1 ran again under the rebuilt JobSet"
        time.sleep(0.1)
