"""plan and start against the real control plane: Trainer, JobSet and Job controllers and their webhooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from kubernetes import client
from rest_framework.test import APIClient

from dispatch_site import roles
from dispatch_site.causes import Cause
from dispatch_site.models import AuditEvent
from jobs.models import Execution, Job, JobState
from jobs.submission import submit
from jobs.submission.tasks import execution_submit
from runtimes.models import AllowListEntry
from tests.support.dispatch import GROUP, VERSION, trainer_job, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


def _body(namespace: str, runtime: str = "team-runtime", **extra: Any) -> dict[str, Any]:
    return {
        "runtime": {"kind": "TrainingRuntime", "name": runtime},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "env": {"KWOK_STAY_RUNNING": "1", "LEARNING_RATE": "0.1"},
    } | extra


def _listed(kube: Any, namespace: str, plural: str) -> list[str]:
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
    return sorted(i["metadata"]["name"] for i in items)


def test_plan_creates_nothing_and_shows_what_start_would_create(
    kube: Any, namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any]
) -> None:
    namespaced_runtime()
    response = _api(submitter[1]).post("/api/v1/plan", _body(namespace), format="json")
    assert response.status_code == 200, response.json()
    plan = response.json()
    assert plan["refused"] is False and plan["reasons"] == []
    objects = plan["objects"]
    assert objects["training_runtime"]["kind"] == "TrainingRuntime"
    assert (
        objects["train_job"]["spec"]["runtimeRef"]["name"] == objects["training_runtime"]["metadata"]["name"]
    )
    assert {
        "replicated_job": "node",
        "container": "node",
        "image": "localhost/trainer:v1",
        "source": "job",
    } in plan["images"]
    assert _listed(kube, namespace, "trainjobs") == []
    assert _listed(kube, namespace, "trainingruntimes") == ["team-runtime"]
    assert not Job.objects.exists()


def test_a_gpu_requested_without_a_limit_is_refused_before_anything_is_created(
    kube: Any, namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any]
) -> None:
    """The live case: nvidia.com/gpu requested without a limit passed plan and start, the API server then
    refused every Job (the JobSet's JobCreationFailed), and the job read `queued` for ever. Now the plan
    refuses it (resources-invalid, naming the field) and the submission is a 422 that creates nothing."""
    namespaced_runtime()
    body = _body(namespace, resources_per_node={"requests": {"nvidia.com/gpu": "1"}})
    planned = _api(submitter[1]).post("/api/v1/plan", body, format="json")
    assert planned.status_code == 200, planned.json()
    assert planned.json()["refused"] is True
    (reason,) = planned.json()["reasons"]
    assert (reason["code"], reason["path"], reason["waived"]) == (
        "resources-invalid",
        "resources_per_node.limits",
        False,
    )
    assert "Limit must be set for non overcommitable resources" in reason["message"]
    submitted = _api(submitter[1]).post("/api/v1/jobs", body, format="json")
    assert submitted.status_code == 422, submitted.json()
    assert [r["code"] for r in submitted.json()["reasons"]] == ["resources-invalid"]
    assert _listed(kube, namespace, "trainjobs") == []


def test_start_creates_the_copy_and_the_trainjob_and_pods_carry_the_identity(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    namespaced_runtime()
    with django_capture_on_commit_callbacks(execute=True):
        response = _api(submitter[1]).post("/api/v1/jobs", _body(namespace), format="json")
    assert response.status_code == 202, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert response["Location"] == f"/api/v1/jobs/{job.id}"
    assert job.state == JobState.QUEUED and job.current_attempt == 1
    name = f"{job.id}-1"
    assert _listed(kube, namespace, "trainjobs") == [name]
    assert _listed(kube, namespace, "trainingruntimes") == sorted([name, "team-runtime"])

    trainjob = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
    copy = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", name)
    assert trainjob["spec"]["runtimeRef"] == {"apiGroup": GROUP, "kind": "TrainingRuntime", "name": name}
    assert trainjob["metadata"]["labels"]["dispatch.dev/job"] == job.id
    assert copy["metadata"]["labels"]["dispatch.dev/attempt"] == "1"
    [owner] = copy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("TrainJob", name, trainjob["metadata"]["uid"])

    pods = wait_for(
        lambda: (lambda ps: ps if len(ps) == 2 and all(p.status.phase == "Running" for p in ps) else None)(
            kube.core.list_namespaced_pod(namespace, label_selector=f"dispatch.dev/job={job.id}").items
        ),
        what="two running pods",
    )
    for pod in pods:
        [node] = [c for c in pod.spec.containers if c.name == "node"]
        env = {e.name: e for e in node.env}
        assert env["DISPATCH_JOB"].value == job.id
        assert env["DISPATCH_ATTEMPT"].value == "1"
        assert env["LEARNING_RATE"].value == "0.1"
        rank_source = env["DISPATCH_RANK"].value_from.field_ref.field_path
        assert rank_source == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        assert node.image == "localhost/trainer:v1"
    ranks = sorted(p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods)
    assert ranks == ["0", "1"]
    jobs = kube.batch.list_namespaced_job(
        namespace, label_selector=f"dispatch.dev/job={job.id},dispatch.dev/attempt=1"
    )
    assert [j.metadata.name for j in jobs.items] == [f"{name}-node-0"]
    assert AuditEvent.objects.filter(
        action="job.submit", object_id=job.id, actor_name=submitter[0].username
    ).exists()


def test_editing_the_original_runtime_after_start_changes_nothing_for_the_job(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    namespaced_runtime()
    with django_capture_on_commit_callbacks(execute=True):
        job_id = _api(submitter[1]).post("/api/v1/jobs", _body(namespace), format="json").json()["id"]
    name = f"{job_id}-1"
    before = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", name)[
        "spec"
    ]

    original = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime"
    )
    trainer_job(original)["template"]["spec"]["template"]["spec"]["containers"][0]["image"] = (
        "localhost/other:v9"
    )
    trainer_job(original)["template"]["spec"]["backoffLimit"] = 5
    kube.custom.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime", original
    )

    after = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", name)[
        "spec"
    ]
    assert after == before
    assert trainer_job({"spec": after})["template"]["spec"]["backoffLimit"] == 0
    jobset = wait_for(lambda: _get_jobset(kube, namespace, name), what="the JobSet of the submitted TrainJob")
    job_spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job_spec["backoffLimit"] == 0


def _get_jobset(kube: Any, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        body: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name
        )
        return body
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_a_duplicate_task_delivery_creates_one_trainjob(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    namespaced_runtime()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job_id = _api(submitter[1]).post("/api/v1/jobs", _body(namespace), format="json").json()["id"]
    execution = Execution.objects.get(job_id=job_id)
    # The broker delivers the same message twice (acks_late + a lost ack), and a third time after a crash
    # between creating the objects and recording it: every delivery finds our objects, none makes another.
    execution_submit.apply(args=(execution.pk,))
    execution_submit.apply(args=(execution.pk,))
    Job.objects.filter(pk=job_id).update(state=JobState.PENDING)
    Execution.objects.filter(pk=execution.pk).update(state=JobState.PENDING)
    execution_submit.apply(args=(execution.pk,))
    for callback in callbacks:
        callback()
    assert _listed(kube, namespace, "trainjobs") == [f"{job_id}-1"]
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED


def test_replaying_a_request_with_its_idempotency_key_returns_the_same_job(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    namespaced_runtime()
    api = _api(submitter[1])
    with django_capture_on_commit_callbacks(execute=True):
        first = api.post("/api/v1/jobs", _body(namespace), format="json", HTTP_IDEMPOTENCY_KEY="run-42")
        again = api.post("/api/v1/jobs", _body(namespace), format="json", HTTP_IDEMPOTENCY_KEY="run-42")
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again["Idempotent-Replayed"] == "true"
    other = api.post(
        "/api/v1/jobs", _body(namespace, num_nodes=3), format="json", HTTP_IDEMPOTENCY_KEY="run-42"
    )
    assert other.status_code == 409
    assert "different request" in other.json()["detail"]
    assert Job.objects.count() == 1
    assert _listed(kube, namespace, "trainjobs") == [f"{first.json()['id']}-1"]


def test_an_admission_denial_ends_as_config_error_with_the_servers_message(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    # A real admission denial by the API server: a ValidatingAdmissionPolicy bound to this namespace.
    admission: Any = client.AdmissionregistrationV1Api(kube.api_client)
    policy_name = f"max-nodes-{namespace}"[:63]
    admission.create_validating_admission_policy(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy_name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [GROUP],
                            "apiVersions": [VERSION],
                            "operations": ["CREATE"],
                            "resources": ["trainjobs"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "object.spec.trainer.numNodes <= 1",
                        "message": "this team may run 1 node at most",
                    }
                ],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy_name},
            "spec": {
                "policyName": policy_name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    try:
        namespaced_runtime()
        api = _api(submitter[1])

        def denied() -> Job | None:
            with django_capture_on_commit_callbacks(execute=True):
                job_id = api.post("/api/v1/jobs", _body(namespace), format="json").json()["id"]
            job = Job.objects.get(pk=job_id)
            return job if job.state == JobState.FAILED else None

        # The policy takes a moment to reach the admission plugin; until then a job may be admitted.
        job = wait_for(denied, timeout=30, interval=1, what="the admission policy to deny a TrainJob")
        assert job.cause == Cause.CONFIG_ERROR
        assert "this team may run 1 node at most" in job.message
        [evidence] = job.evidence
        assert evidence["object"] == f"TrainJob {namespace}/{job.id}-1"
        assert "this team may run 1 node at most" in evidence["value"]
        assert job.executions.get().state == JobState.FAILED
        # The runtime copy made just before the denial is taken down again.
        wait_for(
            lambda: f"{job.id}-1" not in _listed(kube, namespace, "trainingruntimes"), what="copy deleted"
        )
    finally:
        admission.delete_validating_admission_policy_binding(policy_name)
        admission.delete_validating_admission_policy(policy_name)


def test_a_runtime_broken_between_plan_and_start_is_refused_with_reasons(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    namespaced_runtime()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = _api(submitter[1]).post("/api/v1/jobs", _body(namespace), format="json")
    assert response.status_code == 202
    original = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime"
    )
    trainer_job(original)["template"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    trainer_job(original)["template"]["spec"]["backoffLimit"] = 3
    kube.custom.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime", original
    )
    for callback in callbacks:
        callback()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.state == JobState.REFUSED
    assert [r["code"] for r in job.reasons] == ["restart-policy", "backoff-limit"]
    assert "OnFailure" in job.reasons[0]["message"]
    assert _listed(kube, namespace, "trainjobs") == []


def test_a_refused_runtime_is_422_with_every_reason_and_the_job_is_recorded(
    kube: Any, namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any]
) -> None:
    def break_it(body: dict[str, Any]) -> None:
        job = trainer_job(body)
        del job["template"]["spec"]["backoffLimit"]
        job["template"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"

    namespaced_runtime("broken", mutate=break_it)
    namespaced_runtime("unlisted", allow=False)
    api = _api(submitter[1])
    response = api.post("/api/v1/jobs", _body(namespace, runtime="broken", procs_per_node=2), format="json")
    assert response.status_code == 422
    codes = [r["code"] for r in response.json()["reasons"]]
    assert codes == ["restart-policy", "backoff-limit", "procs-per-node-unsupported"]
    assert Job.objects.get(pk=response.json()["id"]).state == JobState.REFUSED
    unlisted = api.post("/api/v1/jobs", _body(namespace, runtime="unlisted"), format="json")
    assert [r["code"] for r in unlisted.json()["reasons"]] == ["runtime-not-allowed"]
    missing = api.post("/api/v1/jobs", _body(namespace, runtime="nope"), format="json")
    assert [r["code"] for r in missing.json()["reasons"]] == ["runtime-not-allowed", "runtime-not-found"]
    assert _listed(kube, namespace, "trainjobs") == []
    assert AllowListEntry.objects.count() == 1


def test_cancel_deletes_the_trainjob(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    namespaced_runtime()
    api = _api(submitter[1])
    with django_capture_on_commit_callbacks(execute=True):
        job_id = api.post("/api/v1/jobs", _body(namespace), format="json").json()["id"]
    assert _listed(kube, namespace, "trainjobs") == [f"{job_id}-1"]
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"/api/v1/jobs/{job_id}/cancel")
    assert response.status_code == 202
    assert Job.objects.get(pk=job_id).state == JobState.CANCELLED
    wait_for(lambda: _listed(kube, namespace, "trainjobs") == [], what="the TrainJob to be deleted")
    wait_for(
        lambda: f"{job_id}-1" not in _listed(kube, namespace, "trainingruntimes"), what="the copy deleted"
    )


def test_submission_service_refuses_an_ungranted_namespace(
    namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any]
) -> None:
    from jobs.spec import JobSpec

    spec = JobSpec.from_dict(_body("elsewhere"))
    with pytest.raises(roles.NamespaceNotGranted):
        submit.job_submit(owner=submitter[0], spec=spec)
    assert not Job.objects.exists()


def test_an_execution_whose_task_was_lost_is_started_by_the_stale_sweep(
    kube: Any, namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any]
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from jobs.submission.tasks import executions_resubmit_stale

    namespaced_runtime()
    # No on_commit capture: the task is never enqueued, as when the broker was down at submission.
    job_id = _api(submitter[1]).post("/api/v1/jobs", _body(namespace), format="json").json()["id"]
    assert Job.objects.get(pk=job_id).state == JobState.PENDING
    executions_resubmit_stale.apply()
    assert _listed(kube, namespace, "trainjobs") == []  # too young: its own task may still be on the way
    Execution.objects.filter(job_id=job_id).update(created_at=timezone.now() - timedelta(minutes=5))
    executions_resubmit_stale.apply()
    assert _listed(kube, namespace, "trainjobs") == [f"{job_id}-1"]
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED


def test_identity_published_through_the_configured_init_container(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    from runtimes.models import SiteSettings

    SiteSettings.objects.update_or_create(
        pk=1, defaults={"publish_via": "initContainer", "publish_container": "identity"}
    )

    def with_init_container(body: dict[str, Any]) -> None:
        pod = trainer_job(body)["template"]["spec"]["template"]["spec"]
        pod["initContainers"] = [{"name": "identity", "image": "localhost/identity:v1", "command": ["true"]}]

    namespaced_runtime(mutate=with_init_container)
    with django_capture_on_commit_callbacks(execute=True):
        response = _api(submitter[1]).post("/api/v1/jobs", _body(namespace), format="json")
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    pods = wait_for(
        lambda: kube.core.list_namespaced_pod(namespace, label_selector=f"dispatch.dev/job={job_id}").items,
        what="the pods",
    )
    for pod in pods:
        [init] = pod.spec.init_containers
        published = {e.name: e.value for e in init.env if e.value is not None}
        assert published == {"DISPATCH_JOB": job_id, "DISPATCH_ATTEMPT": "1"}
        [node] = [c for c in pod.spec.containers if c.name == "node"]
        assert not any(e.name.startswith("DISPATCH_") for e in node.env or [])


def test_an_init_container_missing_under_initcontainer_publication_is_refused(
    namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any]
) -> None:
    from runtimes.models import SiteSettings

    SiteSettings.objects.update_or_create(
        pk=1, defaults={"publish_via": "initContainer", "publish_container": "identity"}
    )
    namespaced_runtime()
    response = _api(submitter[1]).post("/api/v1/jobs", _body(namespace), format="json")
    assert response.status_code == 422
    assert [r["code"] for r in response.json()["reasons"]] == ["no-publish-init-container"]


def test_plan_and_start_in_an_ungranted_namespace_are_403(
    kube: Any, namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any]
) -> None:
    namespaced_runtime()
    api = _api(submitter[1])
    body = _body(namespace) | {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": "someone-elses",
    }
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    # plan used to answer (refused, namespace-not-granted) after reading the runtime: now 403 like start.
    assert api.post("/api/v1/plan", body, format="json").status_code == 403
    assert api.post("/api/v1/jobs", body, format="json").status_code == 403
    assert not Job.objects.exists()


def test_a_name_taken_by_somebody_elses_object_fails_the_job_and_leaves_that_object_alone(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    from tests.support.dispatch import runtime_body

    namespaced_runtime()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job_id = _api(submitter[1]).post("/api/v1/jobs", _body(namespace), format="json").json()["id"]
    foreign = runtime_body("TrainingRuntime", f"{job_id}-1", namespace)
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", foreign)
    for callback in callbacks:
        callback()
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.cause) == (JobState.FAILED, Cause.CONFIG_ERROR)
    assert f"already exists and was not created by dispatch for {job_id}" in job.message
    assert f"{job_id}-1" in _listed(kube, namespace, "trainingruntimes")  # somebody else's: untouched
    assert _listed(kube, namespace, "trainjobs") == []


def test_an_idempotency_key_older_than_24_hours_starts_a_new_job(
    namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any]
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    namespaced_runtime()
    api = _api(submitter[1])
    first = api.post("/api/v1/jobs", _body(namespace), format="json", HTTP_IDEMPOTENCY_KEY="nightly")
    Job.objects.filter(pk=first.json()["id"]).update(created_at=timezone.now() - timedelta(hours=25))
    again = api.post("/api/v1/jobs", _body(namespace), format="json", HTTP_IDEMPOTENCY_KEY="nightly")
    assert again.status_code == 202
    assert again.json()["id"] != first.json()["id"]
    assert "Idempotent-Replayed" not in again
    # The key now belongs to the new job only.
    assert Job.objects.get(pk=first.json()["id"]).idempotency_key is None
    assert Job.objects.get(pk=again.json()["id"]).idempotency_key == "nightly"
