"""The allow-list approves what was reviewed, not just a name (issue 18, item 2, related).

A platform user allow-lists a namespaced TrainingRuntime: dispatch records the digest of its spec. A namespace
member then edits it. Plan and start refuse it with runtime-changed-since-review naming the changed field
paths, the periodic re-check records it, and the runtime's API answer and page show it, until a platform user
re-approves it (POST the allow-list again), which records the new spec. Against the real control plane.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from cluster import gateway
from dispatch_site import roles
from dispatch_site.models import AuditEvent
from dispatch_site.services import user_create
from jobs.models import Job, JobState
from runtimes.digest import changed_paths, review_digest, reviewed_metadata
from runtimes.models import AllowListEntry
from runtimes.reasons import (
    REVIEW_CONTENT,
    REVIEW_MISSING,
    REVIEW_STALE,
    RUNTIME_CHANGED_SINCE_REVIEW,
    Review,
)
from runtimes.rules import check_runtime
from runtimes.tasks import runtimes_recheck
from tests.support.dispatch import GROUP, VERSION, runtime_body, trainer_job

CHANGED = RUNTIME_CHANGED_SINCE_REVIEW
NODE = "spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers[0]"


# ------------------------------------------------------------------------------------------ pure


def test_a_spec_that_is_no_longer_the_reviewed_one_is_refused_naming_the_changed_paths() -> None:
    reviewed = runtime_body("ClusterTrainingRuntime", "rt")
    review = _review_of(reviewed)
    assert check_runtime(reviewed, allow_listed=True, review=review).refused is False

    edited = runtime_body("ClusterTrainingRuntime", "rt")
    node = trainer_job(edited)["template"]["spec"]["template"]["spec"]["containers"][0]
    node["image"] = "registry.example/other:2"
    node["volumeMounts"] = [{"name": "host", "mountPath": "/host"}]
    verdict = check_runtime(edited, allow_listed=True, review=review, ref="ClusterTrainingRuntime/rt")
    assert verdict.refused is True
    [reason] = verdict.refusals
    assert reason.code == CHANGED
    assert reason.path == f"{NODE}.image"
    assert f"{NODE}.image, {NODE}.volumeMounts differ from the reviewed spec" in reason.message
    assert "reviewed by pat at 2026-01-01" in reason.message
    assert "re-approves" in reason.message


def _review_of(body: dict[str, Any]) -> Review:
    return Review(
        REVIEW_CONTENT,
        review_digest(body),
        body["spec"],
        "reviewed by pat at 2026-01-01",
        metadata=reviewed_metadata(body),
    )


def test_an_annotation_or_label_edited_since_the_review_is_a_change_naming_its_key() -> None:
    """The review covers what changes behaviour beyond the spec (issue 33): dispatch's exec-containers
    annotation chooses where a session's commands run, and labels are copied onto every job's objects."""
    reviewed = runtime_body("ClusterTrainingRuntime", "rt")
    reviewed["metadata"]["labels"] = {"trainer.kubeflow.org/framework": "torch"}
    review = _review_of(reviewed)

    annotated = runtime_body("ClusterTrainingRuntime", "rt")
    annotated["metadata"]["labels"] = {"trainer.kubeflow.org/framework": "torch"}
    annotated["metadata"]["annotations"] = {"dispatch.dev/exec-containers": "sidecar"}
    [reason] = check_runtime(annotated, allow_listed=True, review=review).refusals
    assert reason.code == CHANGED and reason.path == "metadata.annotations.dispatch.dev/exec-containers"
    assert "differs from the reviewed runtime" in reason.message

    relabelled = runtime_body("ClusterTrainingRuntime", "rt")
    relabelled["metadata"]["labels"] = {"trainer.kubeflow.org/framework": "mpi"}
    [reason] = check_runtime(relabelled, allow_listed=True, review=review).refusals
    assert reason.path == "metadata.labels.trainer.kubeflow.org/framework"

    # kubectl's record of the last apply says how the object was written, not what it does.
    applied = runtime_body("ClusterTrainingRuntime", "rt")
    applied["metadata"]["labels"] = {"trainer.kubeflow.org/framework": "torch"}
    applied["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    applied["metadata"]["resourceVersion"] = "42"
    assert check_runtime(applied, allow_listed=True, review=review).refused is False


def test_an_entry_whose_runtime_could_not_be_read_or_whose_review_is_stale_is_refused() -> None:
    body = runtime_body("ClusterTrainingRuntime", "rt")
    missing = check_runtime(body, allow_listed=True, review=Review(REVIEW_MISSING))
    assert missing.codes == (CHANGED,) and "nobody reviewed its content" in missing.reasons[0].message
    stale = check_runtime(body, allow_listed=True, review=Review(REVIEW_STALE))
    assert (
        stale.codes == (CHANGED,) and "before a review covered what it covers now" in stale.reasons[0].message
    )
    # "name": a row written in code by name only (the suite's fixtures); the service never writes one.
    assert check_runtime(body, allow_listed=True, review=Review("name")).codes == ()


def test_changed_paths_names_added_removed_and_changed_fields() -> None:
    old = {"a": 1, "b": {"c": [1, 2]}, "gone": True}
    new = {"a": 2, "b": {"c": [1, 3, 4]}, "new": {}}
    assert changed_paths(old, new) == ["a", "b.c[1]", "b.c[2]", "gone", "new"]


# ------------------------------------------------------------------------------------------ cluster


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


@pytest.mark.cluster
@pytest.mark.django_db
def test_a_namespace_member_edits_a_reviewed_runtime_and_it_is_refused_until_re_approved(
    kube: Any,
    namespace: str,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
) -> None:
    namespaced_runtime(allow=False)
    platform_user, platform_token = user_create(username="pat-review", role=roles.PLATFORM, namespaces=["*"])
    platform = _api(platform_token)
    entry = {"kind": "TrainingRuntime", "namespace": namespace, "name": "team-runtime", "purposes": ["jobs"]}
    added = platform.post("/api/v1/runtimes/allow-list", entry, format="json")
    assert added.status_code == 201, added.json()
    assert added.json()["review"]["state"] == "content"
    assert added.json()["review"]["reviewed_by"] == "pat-review"
    user = _api(submitter[1])
    job_body = {
        "runtime": {"kind": "TrainingRuntime", "name": "team-runtime"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
        "env": {"KWOK_STAY_RUNNING": "1"},
    }
    assert user.post("/api/v1/plan", job_body, format="json").json()["refused"] is False
    # A job accepted before the edit, its start held back (it runs after the edit).
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        accepted = user.post("/api/v1/jobs", job_body, format="json")
    assert accepted.status_code == 202, accepted.json()

    # A namespace member edits the runtime: another image, and a host path nobody reviewed.
    body = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime"
    )
    pod = trainer_job(body)["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["image"] = "registry.example/unreviewed:1"
    pod["volumes"] = [{"name": "host", "hostPath": {"path": "/"}}]
    kube.custom.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime", body
    )
    gateway.forget_cached_runtimes()  # plan may answer from a read up to 2 s old: that time has passed

    plan = user.post("/api/v1/plan", job_body, format="json").json()
    assert plan["refused"] is True
    [reason] = [r for r in plan["reasons"] if r["code"] == CHANGED]
    assert f"TrainingRuntime/{namespace}/team-runtime changed since it was reviewed" in reason["message"]
    assert f"{NODE}.image" in reason["message"]
    assert "spec.template.spec.replicatedJobs[0].template.spec.template.spec.volumes" in reason["message"]

    for callback in callbacks:  # the held start runs now: start judges the runtime again
        callback()
    job = Job.objects.get(pk=accepted.json()["id"])
    assert job.state == JobState.REFUSED
    assert [r["code"] for r in job.reasons] == [CHANGED]
    assert kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"] == []

    # The periodic re-check records it; the runtime's API answer and its page show it.
    runtimes_recheck.apply()
    detail = platform.get(f"/api/v1/runtimes/TrainingRuntime/{namespace}/team-runtime").json()
    assert CHANGED in detail["history"][0]["codes"]
    assert CHANGED in [r["code"] for r in detail["verdict"]["reasons"]]
    browser = Client()
    browser.force_login(platform_user)
    html = browser.get(f"/runtimes/TrainingRuntime/{namespace}/team-runtime/").content.decode()
    assert "changed since review" in html and CHANGED in html and 'id="reapprove"' in html

    # A platform user reviews the change and re-approves: the new spec is what runs from now on.
    again = platform.post("/api/v1/runtimes/allow-list", entry, format="json")
    assert again.status_code == 200, again.json()
    assert again.json()["review"]["spec_hash"] == review_digest(body)
    assert AuditEvent.objects.filter(action="runtime.reapprove", object_id__endswith="team-runtime").exists()
    assert user.post("/api/v1/plan", job_body, format="json").json()["refused"] is False
    assert AllowListEntry.objects.get(name="team-runtime").reviewed_spec == body["spec"]


@pytest.mark.cluster
@pytest.mark.django_db
def test_re_approving_through_the_page_records_the_new_spec(
    kube: Any, namespace: str, dispatch_on_cluster: str, namespaced_runtime: Callable[..., Any]
) -> None:
    namespaced_runtime(allow=False)
    platform_user, _ = user_create(username="pat-page", role=roles.PLATFORM, namespaces=["*"])
    browser = Client()
    browser.force_login(platform_user)
    form = {"kind": "TrainingRuntime", "namespace": namespace, "name": "team-runtime", "for_jobs": "on"}
    assert browser.post("/runtimes/allow/", form).status_code == 302
    first = AllowListEntry.objects.get(name="team-runtime")
    body = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime"
    )
    trainer_job(body)["template"]["spec"]["template"]["spec"]["containers"][0]["image"] = "localhost/next:2"
    kube.custom.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime", body
    )
    response = browser.post("/runtimes/allow/", form, follow=True)
    assert f"TrainingRuntime/{namespace}/team-runtime was re-approved." in response.content.decode()
    entry = AllowListEntry.objects.get(name="team-runtime")
    assert entry.reviewed_hash == review_digest(body) != first.reviewed_hash
    assert (entry.review, entry.reviewed_by) == (REVIEW_CONTENT, "pat-page")


@pytest.mark.cluster
@pytest.mark.django_db
def test_a_session_on_a_runtime_edited_since_its_review_is_refused_until_re_approved(
    kube: Any, namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any]
) -> None:
    """Sessions obey the review as jobs do (issue 33): opening one used to judge the runtime without its
    review, so a namespace member's edit (another image in the trainer container, where the owner's commands
    run) served sessions at once. Now the open is refused, 422 runtime-changed-since-review naming the
    changed path, and nothing is created; after a platform user re-approves, the session opens."""
    namespaced_runtime(allow=False)
    _, platform_token = user_create(username="pat-sessions", role=roles.PLATFORM, namespaces=["*"])
    platform = _api(platform_token)
    entry = {
        "kind": "TrainingRuntime",
        "namespace": namespace,
        "name": "team-runtime",
        "purposes": ["sessions"],
    }
    assert platform.post("/api/v1/runtimes/allow-list", entry, format="json").status_code == 201
    body = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime"
    )
    trainer_job(body)["template"]["spec"]["template"]["spec"]["containers"][0]["image"] = (
        "registry.example/x:1"
    )
    kube.custom.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime", body
    )
    gateway.forget_cached_runtimes()
    user = _api(submitter[1])
    session = {
        "runtime": {"kind": "TrainingRuntime", "name": "team-runtime"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
    }
    refused = user.post("/api/v1/sessions", session, format="json")
    assert refused.status_code == 422, refused.content
    [reason] = [r for r in refused.json()["reasons"] if r["code"] == CHANGED]
    assert f"{NODE}.image" in reason["message"]
    assert kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"] == []

    assert (
        platform.post("/api/v1/runtimes/allow-list", entry, format="json").status_code == 200
    )  # re-approved
    opened = user.post("/api/v1/sessions", session, format="json")
    assert opened.status_code in (200, 201, 202), opened.content
    closed = user.delete(f"/api/v1/sessions/{opened.json()['id']}?wait=60")
    assert closed.status_code == 200, closed.content


@pytest.mark.cluster
@pytest.mark.django_db
def test_a_session_on_a_runtime_whose_exec_annotation_was_edited_is_refused_until_re_approved(
    kube: Any, namespace: str, submitter: tuple[User, str], namespaced_runtime: Callable[..., Any]
) -> None:
    """A namespace member who may edit the runtime adds dispatch's exec-containers annotation after the
    review, to move sessions' commands into another container: the spec is untouched, yet the open is
    refused naming the annotation until a platform user re-approves (issue 33)."""
    namespaced_runtime(allow=False)
    _, platform_token = user_create(username="pat-exec", role=roles.PLATFORM, namespaces=["*"])
    platform = _api(platform_token)
    entry = {
        "kind": "TrainingRuntime",
        "namespace": namespace,
        "name": "team-runtime",
        "purposes": ["sessions"],
    }
    assert platform.post("/api/v1/runtimes/allow-list", entry, format="json").status_code == 201
    body = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime"
    )
    body["metadata"].setdefault("annotations", {})["dispatch.dev/exec-containers"] = "node"
    kube.custom.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", "team-runtime", body
    )
    gateway.forget_cached_runtimes()
    user = _api(submitter[1])
    session = {
        "runtime": {"kind": "TrainingRuntime", "name": "team-runtime"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
    }
    refused = user.post("/api/v1/sessions", session, format="json")
    assert refused.status_code == 422, refused.content
    [reason] = [r for r in refused.json()["reasons"] if r["code"] == CHANGED]
    assert "metadata.annotations.dispatch.dev/exec-containers" in reason["message"]
    assert kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"] == []

    assert platform.post("/api/v1/runtimes/allow-list", entry, format="json").status_code == 200
    opened = user.post("/api/v1/sessions", session, format="json")
    assert opened.status_code in (200, 201, 202), opened.content
    closed = user.delete(f"/api/v1/sessions/{opened.json()['id']}?wait=60")
    assert closed.status_code == 200, closed.content
