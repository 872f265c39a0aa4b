"""The admission guard (deploy/guard: ValidatingAdmissionPolicies) on the real API server.

A plain user with RBAC rights to edit Trainer objects (as a team's developers often have) is still denied,
with a message saying what to do instead; dispatch, running with its ServiceAccount's token, still starts
and cancels jobs; and the controllers still run a job to Complete and clean up after a cancel.

The guard is the one the local plane installs (scripts/cluster up: scripts/k8s/guard, i.e. deploy/guard with
the plane's admin in breakGlass; the ``guard`` fixture checks that what runs is what the repository renders),
and every controller runs under its real identity (the Trainer's, the garbage collector's, the namespace
controller's, Kueue's ServiceAccounts), so exemptUsers is tested as shipped. The plain user is the
impersonated ``alice``.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from jobs.models import Job, JobState
from tests.support.deploy import (
    DispatchServiceAccount,
    apply,
    kubectl,
)
from tests.support.dispatch import DISPATCH_KIND, GROUP, VERSION, wait_for
from tests.support.guard import label_managed

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]

ALICE = "alice"
SUBMIT_HINT = "submit through dispatch: POST /api/v1/jobs"


def _trainjob(namespace: str, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"runtimeRef": {"name": "dispatch-kind"}, "trainer": {"numNodes": 1}},
    }


def _as_alice(kubeconfig: str, *args: str, stdin: str | None = None) -> Any:
    return kubectl(f"--as={ALICE}", *args, kubeconfig=kubeconfig, stdin=stdin, check=False)


@pytest.fixture
def managed_namespace(
    kube: Any,
    kubeconfig: str,
    namespace: str,
    guard: list[dict[str, Any]],
    dispatch_serviceaccount: DispatchServiceAccount,
) -> str:
    """The test namespace under the guard: labelled managed, granted to dispatch, and alice may edit Trainer
    objects in it by RBAC (so a denial can only come from the guard)."""
    label_managed(kube, namespace)
    dispatch_serviceaccount.grant(namespace)
    _grant_alice(kubeconfig, namespace)
    # Policies reach the API server's admission through an informer: wait until the guard answers.
    wait_for(
        lambda: SUBMIT_HINT in _as_alice(
            kubeconfig, "create", "--dry-run=server", "-f", "-",
            stdin=json.dumps(_trainjob(namespace, "probe")),
        ).stderr,
        timeout=60, what="the admission guard to be active in the managed namespace",
    )  # fmt: skip
    return namespace


def _grant_alice(kubeconfig: str, namespace: str) -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "trainer-editor", "namespace": namespace},
        "rules": [
            {
                "apiGroups": [GROUP],
                "resources": ["trainjobs", "trainingruntimes"],
                "verbs": ["get", "list", "create", "update", "patch", "delete"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "trainer-editor", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "trainer-editor"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": ALICE}],
    }
    apply([role, binding], kubeconfig)


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


def _start(namespace: str, token: str, capture: Callable[..., Any], env: dict[str, str] | None = None) -> str:
    from runtimes.models import AllowListEntry

    AllowListEntry.objects.get_or_create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
        "env": env or {},
    }
    with capture(execute=True):
        response = _api(token).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.state == JobState.QUEUED, job.message
    return str(job.id)


def _names(kube: Any, namespace: str, plural: str) -> list[str]:
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
    return sorted(i["metadata"]["name"] for i in items)


def test_a_plain_user_cannot_create_a_trainjob_in_a_managed_namespace(
    kube: Any, kubeconfig: str, managed_namespace: str, namespace: str
) -> None:
    result = _as_alice(
        kubeconfig, "create", "-f", "-", stdin=json.dumps(_trainjob(managed_namespace, "mine"))
    )
    assert result.returncode != 0
    assert "dispatch-trainjobs-through-dispatch" in result.stderr
    assert (
        f"TrainJobs in namespace {managed_namespace} are created by dispatch only, not by alice"
        in result.stderr
    )
    assert SUBMIT_HINT in result.stderr
    assert _names(kube, managed_namespace, "trainjobs") == []


def test_the_same_user_may_create_one_where_the_namespace_is_not_managed(
    kube: Any, kubeconfig: str, guard: list[dict[str, Any]]
) -> None:
    """Control for the test above: alice's RBAC allows the create; only the managed label brings the guard."""
    ns = f"t-unmanaged-{uuid.uuid4().hex[:6]}"
    kube.core.create_namespace({"metadata": {"name": ns}})
    try:
        _grant_alice(kubeconfig, ns)
        result = _as_alice(
            kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(_trainjob(ns, "mine"))
        )
        assert result.returncode == 0, result.stderr
    finally:
        kube.core.delete_namespace(ns, propagation_policy="Background")


def test_dispatch_starts_a_job_that_runs_to_complete_and_a_plain_user_cannot_touch_its_objects(
    kube: Any,
    kubeconfig: str,
    managed_namespace: str,
    on_serviceaccount: DispatchServiceAccount,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    job_id = _start(managed_namespace, submitter[1], django_capture_on_commit_callbacks)
    name = f"{job_id}-1"
    assert _names(kube, managed_namespace, "trainjobs") == [name]

    # The Trainer, JobSet and Job controllers still take it to the end (status updates are not guarded).
    def complete() -> bool:
        tj = kube.custom.get_namespaced_custom_object(GROUP, VERSION, managed_namespace, "trainjobs", name)
        return any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in tj.get("status", {}).get("conditions", [])
        )

    wait_for(complete, timeout=120, what="the TrainJob to be Complete")

    patch = json.dumps({"spec": {"template": {"spec": {"replicatedJobs": []}}}})
    result = _as_alice(
        kubeconfig, "patch", "trainingruntime", name, "-n", managed_namespace, "--type=merge", "-p", patch
    )
    assert result.returncode != 0
    assert "dispatch-managed-objects" in result.stderr
    assert (
        f"TrainingRuntime {managed_namespace}/{name} is managed by dispatch and only dispatch may update it"
        in (result.stderr)
    )
    assert "submit through dispatch: POST /api/v1/jobs" in result.stderr

    unlabel = _as_alice(
        kubeconfig, "label", "trainingruntime", name, "-n", managed_namespace, "app.kubernetes.io/managed-by-"
    )
    assert unlabel.returncode != 0 and "dispatch-managed-objects" in unlabel.stderr

    delete = _as_alice(kubeconfig, "delete", "trainjob", name, "-n", managed_namespace, "--wait=false")
    assert delete.returncode != 0
    assert "only dispatch may delete it" in delete.stderr
    assert "POST /api/v1/jobs/{id}/cancel" in delete.stderr

    runtime_copy = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, managed_namespace, "trainingruntimes", name
    )
    assert runtime_copy["spec"]["template"]["spec"]["replicatedJobs"] != []
    assert runtime_copy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "dispatch"
    assert _names(kube, managed_namespace, "trainjobs") == [name]


def test_dispatch_cancels_and_the_garbage_collector_removes_the_copy(
    kube: Any,
    managed_namespace: str,
    on_serviceaccount: DispatchServiceAccount,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    job_id = _start(
        managed_namespace, submitter[1], django_capture_on_commit_callbacks, {"KWOK_STAY_RUNNING": "1"}
    )
    name = f"{job_id}-1"
    with django_capture_on_commit_callbacks(execute=True):
        response = _api(submitter[1]).post(f"/api/v1/jobs/{job_id}/cancel")
    assert response.status_code == 202, response.json()
    assert Job.objects.get(pk=job_id).state == JobState.CANCELLED
    wait_for(lambda: name not in _names(kube, managed_namespace, "trainjobs"), what="the TrainJob deleted")
    wait_for(lambda: name not in _names(kube, managed_namespace, "trainingruntimes"), what="the copy deleted")
    wait_for(
        lambda: (
            not kube.core.list_namespaced_pod(
                managed_namespace, label_selector=f"dispatch.dev/job={job_id}"
            ).items
        ),
        what="the pods deleted",
    )


def test_nobody_but_dispatch_creates_objects_with_dispatchs_label(
    kube: Any, kubeconfig: str, managed_namespace: str
) -> None:
    runtime = copy.deepcopy(DISPATCH_KIND)
    runtime["kind"] = "TrainingRuntime"
    runtime["metadata"] = {"name": "forged", "namespace": managed_namespace}
    plain = _as_alice(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(runtime))
    assert plain.returncode == 0, plain.stderr  # her own runtimes are hers to manage
    runtime["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "dispatch"}
    forged = _as_alice(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(runtime))
    assert forged.returncode != 0
    assert "only dispatch may create it" in forged.stderr


# Kueue's controller as installed from its release manifests (deploy/guard/policies.yaml lists it).
KUEUE_CONTROLLER = "system:serviceaccount:kueue-system:kueue-controller-manager"


def test_kueue_admits_and_updates_dispatchs_queued_trainjob_under_the_guard(
    kube: Any,
    kubeconfig: str,
    managed_namespace: str,
    kueue_queue: Any,
    on_serviceaccount: DispatchServiceAccount,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Kueue suspends and unsuspends a queued TrainJob and writes its runtimePatch: UPDATEs of an object the
    guard protects. Kueue runs here under the name its release gives it (scripts/cluster: a token of
    kueue-system/kueue-controller-manager), exempt by that name in exemptUsers, so the queued job is admitted
    and completes; and an UPDATE under that name (impersonated, with RBAC to update TrainJobs) passes the
    guard, where alice's is denied. Without that name in exemptUsers the impersonated update was denied
    ("only dispatch may update it")."""
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": managed_namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
        "queue_name": kueue_queue.name,
        "env": {"KWOK_RUN_DURATION": "1s"},
    }
    from runtimes.models import AllowListEntry

    AllowListEntry.objects.get_or_create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    with django_capture_on_commit_callbacks(execute=True):
        response = _api(submitter[1]).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.json()
    name = f"{response.json()['id']}-1"

    def trainjob() -> dict[str, Any]:
        obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, managed_namespace, "trainjobs", name
        )
        return obj

    assert trainjob()["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == kueue_queue.name
    wait_for(
        lambda: any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in trainjob().get("status", {}).get("conditions", [])
        ),
        timeout=120,
        what="Kueue to admit (unsuspend) the TrainJob and the job to complete",
    )

    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "kueue-trainjobs", "namespace": managed_namespace},
        "rules": [{"apiGroups": [GROUP], "resources": ["trainjobs"], "verbs": ["get", "update", "patch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "kueue-trainjobs", "namespace": managed_namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kueue-trainjobs"},
        "subjects": [
            {"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kueue-system"}
        ],
    }
    apply([role, binding], kubeconfig)
    annotate = ("annotate", "trainjob", name, "-n", managed_namespace, "--overwrite")

    def by_kueue() -> Any:
        result = kubectl(
            f"--as={KUEUE_CONTROLLER}",
            *annotate,
            "dispatch.test/by=kueue",
            kubeconfig=kubeconfig,
            check=False,
        )
        # RBAC caches settle a moment after the binding: "User ... cannot get resource ..." until then.
        return None if f'User "{KUEUE_CONTROLLER}" cannot' in result.stderr else result

    as_kueue = wait_for(by_kueue, timeout=30, what="the impersonated controller's RBAC to take effect")
    assert as_kueue.returncode == 0, as_kueue.stderr
    assert trainjob()["metadata"]["annotations"]["dispatch.test/by"] == "kueue"
    as_alice = _as_alice(kubeconfig, *annotate, "dispatch.test/by=alice")
    assert as_alice.returncode != 0 and "only dispatch may update it" in as_alice.stderr
