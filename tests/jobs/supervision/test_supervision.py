"""Supervision against the real control plane: every started job reaches its true state and typed cause.

Each test takes the user's path: POST /api/v1/jobs (the submit task runs on commit), then supervision cycles
(the beat task's code, jobs.cycle.supervise, or the `manage.py supervise` loop with its pod watch),
then GET /api/v1/jobs/{id}. KWOK plays the kubelet (scripts/k8s/kwok-stages.yaml); the Job, JobSet, Trainer
controllers, the scheduler, PodGC and the eviction API are the real ones.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from kubernetes import client

from jobs.models import Execution, Job, JobEvent, JobState
from jobs.supervision.watch import cycle
from tests.jobs.supervision.support import api as _api
from tests.jobs.supervision.support import body as _body
from tests.jobs.supervision.support import get as _get
from tests.jobs.supervision.support import pods_of as _pods
from tests.jobs.supervision.support import running_pods as _running
from tests.jobs.supervision.support import submit as _submit
from tests.jobs.supervision.support import supervise_until, supervisor_process
from tests.jobs.supervision.support import trainjob_exists as _trainjob_exists
from tests.jobs.supervision.support import wait_job as _wait_job
from tests.support.admission import denying
from tests.support.dispatch import GROUP, VERSION, trainer_job, wait_for

pytestmark = [pytest.mark.cluster]


# ---------------------------------------------------------------- one test per cause


@pytest.mark.django_db
def test_exit_code_3_on_rank_1_is_app_error_naming_rank_1_and_code_3(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, django_capture_on_commit_callbacks: Any
) -> None:
    runtime_on(None)
    token = submitter[1]
    env = {"KWOK_EXIT_CODE": "3", "KWOK_FAIL_RANK": "1", "KWOK_RUN_DURATION": "2s"}
    job_id = _submit(token, _body(namespace, env), django_capture_on_commit_callbacks)
    data = supervise_until(token, job_id, lambda d: d["state"] == "failed", what="failed")
    assert (data["cause"], data["failing_rank"], data["exit_code"]) == ("app-error", 1, 3)
    assert "rank 1 exited with code 3" in data["message"]
    [attempt] = data["executions"]
    assert attempt["rank"] == 1 and attempt["exit_code"] == 3
    first = [r for r in attempt["ranks"] if r["first_failure"]]
    assert [(r["rank"], r["exit_code"]) for r in first] == [(1, 3)]
    assert any(
        e["field"].endswith("state.terminated") and "exit code 3" in str(e["value"]) for e in data["evidence"]
    )
    # The timeline has the transitions, each compare-and-set once.
    moves = [
        (e["from_state"], e["to_state"], e["cause"]) for e in data["timeline"] if e["kind"] == "transition"
    ]
    assert moves[-1] == ("running", "failed", "app-error") or moves[-1] == ("queued", "failed", "app-error")
    assert len([m for m in moves if m[1] == "failed"]) == 1


@pytest.mark.django_db
def test_oomkilled_is_oom(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, django_capture_on_commit_callbacks: Any
) -> None:
    runtime_on(None)
    job_id = _submit(submitter[1], _body(namespace, {"KWOK_OOM": "1"}), django_capture_on_commit_callbacks)
    data = supervise_until(submitter[1], job_id, lambda d: d["state"] == "failed", what="failed")
    assert data["cause"] == "oom"
    assert any(e["value"] == "OOMKilled" for e in data["evidence"])


@pytest.mark.django_db
def test_the_trainjob_deadline_is_timeout(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, django_capture_on_commit_callbacks: Any
) -> None:
    runtime_on(None)
    body = _body(namespace, {"KWOK_STAY_RUNNING": "1"}, active_deadline_seconds=4)
    job_id = _submit(submitter[1], body, django_capture_on_commit_callbacks)
    data = supervise_until(submitter[1], job_id, lambda d: d["state"] == "failed", what="failed")
    assert data["cause"] == "timeout"
    assert any("DeadlineExceeded" in str(e["value"]) for e in data["evidence"])


@pytest.mark.django_db
def test_requests_above_capacity_wait_with_the_schedulers_reason_then_fail_as_no_capacity(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    django_capture_on_commit_callbacks: Any,
    settings: Any,
    kube: Any,
) -> None:
    runtime_on(None)
    settings.NO_CAPACITY_AFTER_SECONDS = 8
    body = _body(
        namespace,
        {"KWOK_STAY_RUNNING": "1"},
        resources_per_node={"requests": {"cpu": "900"}, "limits": {"cpu": "900"}},
    )
    job_id = _submit(submitter[1], body, django_capture_on_commit_callbacks)
    waiting = supervise_until(
        submitter[1],
        job_id,
        lambda d: d["queued_reason"].get("reason") == "unschedulable",
        what="unschedulable",
    )
    assert waiting["state"] == "queued"
    assert "Insufficient cpu" in waiting["queued_reason"]["message"]
    assert waiting["queued_reason"]["since"]
    data = supervise_until(submitter[1], job_id, lambda d: d["state"] == "failed", what="failed")
    assert data["cause"] == "no-capacity"
    assert any("Insufficient cpu" in str(e["value"]) for e in data["evidence"])
    # dispatch stopped what could never run.
    wait_for(
        lambda: not _trainjob_exists(kube, namespace, f"{job_id}-1"), timeout=30, what="TrainJob deleted"
    )


@pytest.mark.django_db
def test_image_pull_error_waits_then_fails_as_image_pull(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    django_capture_on_commit_callbacks: Any,
    settings: Any,
) -> None:
    runtime_on(None)
    settings.STUCK_AFTER_SECONDS = 6
    job_id = _submit(
        submitter[1], _body(namespace, {"KWOK_IMAGE_PULL_ERROR": "1"}), django_capture_on_commit_callbacks
    )
    waiting = supervise_until(
        submitter[1],
        job_id,
        lambda d: d["queued_reason"].get("reason") == "image-pull",
        what="image-pull wait",
    )
    assert waiting["state"] == "queued"
    assert (
        "ErrImagePull" in waiting["queued_reason"]["message"]
        or "ImagePullBackOff" in waiting["queued_reason"]["message"]
    )
    data = supervise_until(submitter[1], job_id, lambda d: d["state"] == "failed", what="failed")
    assert data["cause"] == "image-pull"


def _preempt(kube: Any, namespace: str, node: str) -> str:
    """A higher-priority pod that needs the whole node: the scheduler preempts the job's pods."""
    priority = f"t-high-{uuid.uuid4().hex[:6]}"
    scheduling: Any = client.SchedulingV1Api(kube.api_client)
    scheduling.create_priority_class(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": priority},
            "value": 1000000,
        }
    )
    # The Priority admission plugin reads PriorityClasses through its informer, which may not have seen the
    # new one yet ("no PriorityClass with name ... was found", a 403 seen under load): try again briefly.
    wait_for(
        lambda: _create_preemptor(kube, namespace, node, priority),
        timeout=15,
        interval=0.2,
        what=f"the preemptor pod admitted with PriorityClass {priority}",
    )
    return priority


def _create_preemptor(kube: Any, namespace: str, node: str, priority: str) -> bool:
    try:
        _preemptor(kube, namespace, node, priority)
    except client.ApiException as exc:
        if exc.status == 403 and "no PriorityClass with name" in str(exc.body):
            return False
        raise
    return True


def _preemptor(kube: Any, namespace: str, node: str, priority: str) -> None:
    kube.core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "preemptor"},
            "spec": {
                "priorityClassName": priority,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": [
                    {
                        "key": "dispatch.test/dedicated",
                        "operator": "Equal",
                        "value": node,
                        "effect": "NoSchedule",
                    }
                ],
                "containers": [
                    {
                        "name": "main",
                        "image": "localhost/preemptor:v1",
                        "env": [{"name": "KWOK_STAY_RUNNING", "value": "1"}],
                        "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
                    }
                ],
            },
        },
    )


@pytest.mark.django_db
def test_a_real_scheduler_preemption_is_preempted(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    dedicated_node: Any,
    django_capture_on_commit_callbacks: Any,
    kube: Any,
) -> None:
    node = dedicated_node(cpu="1")
    runtime_on(node)
    body = _body(namespace, {"KWOK_STAY_RUNNING": "1"}, recovery_policy={"retry": {"preempted": 0}})
    job_id = _submit(submitter[1], body, django_capture_on_commit_callbacks)
    supervise_until(submitter[1], job_id, lambda d: d["state"] == "running", what="running")
    priority = _preempt(kube, namespace, node)
    try:
        data = supervise_until(submitter[1], job_id, lambda d: d["state"] == "failed", what="failed")
    finally:
        client.SchedulingV1Api(kube.api_client).delete_priority_class(priority)
    assert data["cause"] == "preempted", data
    assert any(
        "PreemptionByScheduler" in str(e["value"]) or e["field"] == "event[Preempted]"
        for e in data["evidence"]
    )
    assert "not retried" in data["message"]


@pytest.mark.django_db
def test_a_recovery_policy_that_retries_preempted_runs_attempt_2_with_dispatch_attempt_2(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    dedicated_node: Any,
    django_capture_on_commit_callbacks: Any,
    kube: Any,
) -> None:
    node = dedicated_node(cpu="1")
    runtime_on(node)
    body = _body(
        namespace,
        {"KWOK_STAY_RUNNING": "1"},
        recovery_policy={"retry": {"preempted": 1}, "backoff_seconds": {"preempted": 0}},
    )
    job_id = _submit(submitter[1], body, django_capture_on_commit_callbacks)
    supervise_until(submitter[1], job_id, lambda d: d["state"] == "running", what="running")
    # The original runtime is edited after attempt 1 started: attempt 2 still runs on what attempt 1 ran on.
    original = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime"
    )
    trainer_job(original)["template"]["spec"]["template"]["spec"]["containers"][0]["image"] = (
        "localhost/edited:v9"
    )
    kube.custom.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime", original
    )
    priority = _preempt(kube, namespace, node)
    try:
        retrying = supervise_until(
            submitter[1], job_id, lambda d: d["current_attempt"] == 2, what="attempt 2"
        )
        # The preemptor leaves: attempt 2's pods can be scheduled.
        kube.core.delete_namespaced_pod("preemptor", namespace, grace_period_seconds=0)
    finally:
        client.SchedulingV1Api(kube.api_client).delete_priority_class(priority)
    first = retrying["executions"][0]
    assert (first["attempt"], first["state"], first["cause"]) == (1, "failed", "preempted")
    with django_capture_on_commit_callbacks(execute=True):
        data = supervise_until(
            submitter[1], job_id, lambda d: d["state"] == "running", what="attempt 2 running"
        )
    assert [e["attempt"] for e in data["executions"]] == [1, 2]
    pods = _running(kube, namespace, job_id, attempt=2)
    for pod in pods:
        [container] = [c for c in pod.spec.containers if c.name == "node"]
        env = {e.name: e.value for e in container.env}
        assert env["DISPATCH_ATTEMPT"] == "2"
        assert container.image == "localhost/trainer:v1"  # the job's image, set by the Trainer on node
    copy = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", f"{job_id}-2"
    )
    assert "localhost/edited:v9" not in str(copy)
    # Attempt 1's objects are removed.
    wait_for(
        lambda: not _trainjob_exists(kube, namespace, f"{job_id}-1"), timeout=30, what="attempt 1 removed"
    )
    kinds = [e["kind"] for e in data["timeline"]]
    assert "retry" in kinds and "attempt" in kinds


@pytest.mark.django_db
def test_the_runtime_copy_deleted_before_the_trainer_reads_it_is_runtime_missing(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    django_capture_on_commit_callbacks: Any,
    kube: Any,
) -> None:
    """The Trainer copies the runtime into `<trainjob>-runtime-snapshot` on its first reconcile and reads that
    afterwards (status-facts §4), so a copy deleted later changes nothing. Lost before the JobSet is built —
    here the JobSet and the snapshot are deleted with the copy, as a label-selected clean-up would — the
    Trainer cannot rebuild: "TrainingRuntime specified in TrainJob is not found"."""
    runtime_on(None)
    job_id = _submit(
        submitter[1], _body(namespace, {"KWOK_STAY_RUNNING": "1"}), django_capture_on_commit_callbacks
    )
    name = f"{job_id}-1"
    supervise_until(submitter[1], job_id, lambda d: d["state"] == "running", what="running")
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", name)
    with contextlib.suppress(client.ApiException):
        kube.core.delete_namespaced_config_map(f"{name}-runtime-snapshot", namespace)
    kube.custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name)
    data = supervise_until(submitter[1], job_id, lambda d: d["state"] == "failed", timeout=120, what="failed")
    assert data["cause"] == "runtime-missing", data
    assert any("not found" in str(e["value"]) for e in data["evidence"])


@pytest.mark.django_db
def test_an_admission_denial_stays_config_error_under_supervision(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    django_capture_on_commit_callbacks: Any,
    kube: Any,
) -> None:
    """A ValidatingAdmissionPolicy denies TrainJobs in this namespace: the job fails at start with the API
    server's message, and supervision never touches it again."""
    runtime_on(None)
    with denying(
        kube,
        namespace,
        group=GROUP,
        resources=["trainjobs"],
        operations=["CREATE"],
        expression="false",
        message="trainjobs are frozen in this namespace",
    ):
        body = _body(namespace, {"KWOK_STAY_RUNNING": "1"})

        def denied() -> dict[str, Any] | None:
            with django_capture_on_commit_callbacks(execute=True):
                response = _api(submitter[1]).post("/api/v1/jobs", body, format="json")
            job = Job.objects.get(pk=response.json()["id"])
            return _get(submitter[1], job.id) if job.state == JobState.FAILED else None

        # The policy takes a moment to reach the API server's admission chain.
        data = wait_for(denied, timeout=30, interval=1, what="a denied submission")
    for _ in range(3):
        cycle.supervise()
    after = _get(submitter[1], data["id"])
    assert (after["state"], after["cause"]) == ("failed", "config-error")
    assert "trainjobs are frozen" in after["message"]


# ---------------------------------------------------------------- with the pod watch (manage.py supervise)


@pytest.mark.django_db(transaction=True)
def test_an_eviction_api_call_is_evicted(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, kube: Any
) -> None:
    runtime_on(None)
    response = _api(submitter[1]).post(
        "/api/v1/jobs", _body(namespace, {"KWOK_STAY_RUNNING": "1"}), format="json"
    )
    job_id = response.json()["id"]
    with supervisor_process():
        _wait_job(job_id, lambda j: j.state == JobState.RUNNING, what="running")
        victim = sorted(_pods(kube, namespace, job_id), key=lambda p: p.metadata.name)[0]
        kube.core.create_namespaced_pod_eviction(
            victim.metadata.name,
            namespace,
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": victim.metadata.name, "namespace": namespace},
            },
        )
        job = _wait_job(job_id, lambda j: j.state in (JobState.FAILED, JobState.PENDING), what="failed")
    execution = Execution.objects.get(job_id=job_id, attempt=1)
    assert execution.cause == "evicted", (execution.cause, execution.message, execution.evidence)
    assert any("EvictionByEvictionAPI" in str(e["value"]) for e in execution.evidence)
    rank = int(victim.metadata.labels["batch.kubernetes.io/job-completion-index"])
    assert execution.rank == rank
    del job


@pytest.mark.django_db(transaction=True)
def test_a_lost_node_is_node_lost(
    submitter: tuple[User, str], namespace: str, runtime_on: Any, dedicated_node: Any, kube: Any
) -> None:
    """The node is deleted: PodGC marks its pods `DisruptionTarget=DeletionByPodGC` after its 40 s quarantine
    and force-deletes them (status-facts §6)."""
    node = dedicated_node()
    runtime_on(node)
    body = _body(namespace, {"KWOK_STAY_RUNNING": "1"}, recovery_policy={"retry": {"node-lost": 0}})
    response = _api(submitter[1]).post("/api/v1/jobs", body, format="json")
    job_id = response.json()["id"]
    with supervisor_process():
        _wait_job(job_id, lambda j: j.state == JobState.RUNNING, what="running")
        kube.core.delete_node(node)
        job = _wait_job(job_id, lambda j: j.state == JobState.FAILED, timeout=150, what="failed")
    assert job.cause == "node-lost", (job.cause, job.message, job.evidence)
    assert any(node in e["object"] or "DeletionByPodGC" in str(e["value"]) for e in job.evidence)


@pytest.mark.django_db(transaction=True)
def test_the_api_server_away_makes_jobs_unknown_then_they_come_back(
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    settings: Any,
    kubeconfig: str,
    tmp_path: Any,
) -> None:
    """The API server cannot be reached for a while (dispatch pointed at a port where nothing listens stands
    in for stopping the shared control plane's API server, which every other test needs): active jobs go
    `unknown` with their last known state, then come back to the right state by themselves."""
    runtime_on(None)
    response = _api(submitter[1]).post(
        "/api/v1/jobs", _body(namespace, {"KWOK_STAY_RUNNING": "1"}), format="json"
    )
    job_id = response.json()["id"]
    wait_for(
        lambda: cycle.supervise() and Job.objects.get(pk=job_id).state == JobState.RUNNING,
        timeout=60,
        what="running",
    )
    unreachable = tmp_path / "away.kubeconfig"
    unreachable.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: away, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: away, context: {cluster: away, user: u}}]\n"
        "current-context: away\n"
    )
    settings.KUBECONFIG = str(unreachable)
    report = cycle.supervise()
    assert report.error
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.last_known_state) == (JobState.UNKNOWN, JobState.RUNNING)
    assert job.unknown_since is not None
    data = _get(submitter[1], job_id)
    assert data["state"] == "unknown" and data["last_known_state"] == "running"
    settings.KUBECONFIG = kubeconfig
    wait_for(
        lambda: cycle.supervise() and Job.objects.get(pk=job_id).state == JobState.RUNNING,
        timeout=30,
        what="back to running",
    )
    job = Job.objects.get(pk=job_id)
    assert job.unknown_since is None
    moves = list(
        JobEvent.objects.filter(job_id=job_id, kind="transition").values_list("from_state", "to_state")
    )
    assert ("running", "unknown") in moves and ("unknown", "running") in moves


@pytest.mark.django_db(transaction=True)
def test_two_supervisors_at_once_record_each_transition_once(
    submitter: tuple[User, str], namespace: str, runtime_on: Any
) -> None:
    """Two beats (or a slow cycle and the next) run at the same moment, each in its own thread and database
    connection: every transition is written once."""
    runtime_on(None)
    env = {"KWOK_EXIT_CODE": "3", "KWOK_RUN_DURATION": "3s"}
    response = _api(submitter[1]).post("/api/v1/jobs", _body(namespace, env), format="json")
    job_id = response.json()["id"]
    deadline = time.monotonic() + 60
    errors: list[BaseException] = []

    def hammer(name: str) -> None:
        try:
            while time.monotonic() < deadline and Job.objects.get(pk=job_id).state != JobState.FAILED:
                cycle.supervise(name=name)  # distinct names: no shared lease, only compare-and-set
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=hammer, args=(f"s{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert Job.objects.get(pk=job_id).state == JobState.FAILED
    moves = list(
        JobEvent.objects.filter(job_id=job_id, kind="transition").values_list("from_state", "to_state")
    )
    assert len(moves) == len(set(moves)), moves
    assert moves.count(("running", "failed")) + moves.count(("queued", "failed")) == 1
