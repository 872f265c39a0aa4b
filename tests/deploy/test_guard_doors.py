"""Issue 31: the promise at the cluster's door. A member of a job's namespace (a ServiceAccount with only
the rights each test names, its own token: not an admin) cannot forge a rank, a job's objects or its evidence
in a namespace dispatch manages; dispatch itself starts and supervises the job with its ServiceAccount.

The guard is the one the local plane installs (scripts/k8s/guard, i.e. deploy/guard; `guard` checks that what
runs is what the repository renders), and every controller writes under its real identity, so the job runs
to its end through the same policies. Without the guard (before this issue) the forged pod of the first test
was created, supervision read "2 pods ran rank 0 in attempt 1" within a cycle, failed the job
identity-violation and deleted its TrainJob.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import TestCase

from jobs.supervision import cycle
from tests.jobs.supervision.support import api, get, supervise_until
from tests.support.deploy import DispatchServiceAccount
from tests.support.dispatch import GROUP, VERSION, wait_for
from tests.support.guard import Member, guard_answers, label_managed

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
PODS_POLICY = "dispatch-pods-from-the-job-controller"
JOBS_POLICY = "dispatch-jobsets-and-jobs-from-their-controllers"
EVENTS_POLICY = "dispatch-evidence-from-its-reporter"


@pytest.fixture
def managed(
    kube: Any,
    namespace: str,
    guard: list[dict[str, Any]],
    dispatch_serviceaccount: DispatchServiceAccount,
    on_serviceaccount: DispatchServiceAccount,
) -> str:
    """The test's namespace under the guard, granted to dispatch, dispatch on its ServiceAccount."""
    label_managed(kube, namespace)
    dispatch_serviceaccount.grant(namespace)
    return namespace


@pytest.fixture
def running_job(managed: str, submitter: tuple[User, str], kube: Any) -> Iterator[dict[str, Any]]:
    """A 2-rank job started through the API (dispatch's ServiceAccount creates the TrainJob), its ranks
    Running (KWOK keeps them so), supervision seeing it running. Cancelled afterwards."""
    from runtimes.models import AllowListEntry

    AllowListEntry.objects.get_or_create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    token = submitter[1]
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": managed,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "env": {"KWOK_STAY_RUNNING": "1"},
    }
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = api(token).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    supervise_until(token, job_id, lambda d: d["state"] == "running", what="running")
    selector = f"dispatch.dev/job={job_id}"
    pods = wait_for(
        lambda: (
            p
            if len(p := kube.core.list_namespaced_pod(managed, label_selector=selector).items) == 2
            and all(x.status.phase == "Running" for x in p)
            else None
        ),
        timeout=60,
        what="both ranks Running",
    )
    [job] = kube.batch.list_namespaced_job(managed, label_selector=selector).items
    yield {"id": job_id, "token": token, "pods": pods, "job": job, "namespace": managed}
    with TestCase.captureOnCommitCallbacks(execute=True):
        api(token).post(f"/api/v1/jobs/{job_id}/cancel")


def _rank0(kube: Any, running: dict[str, Any]) -> Any:
    [pod] = [
        p for p in running["pods"] if p.metadata.labels.get("batch.kubernetes.io/job-completion-index") == "0"
    ]
    return pod


def _forged_rank0(kube: Any, running: dict[str, Any]) -> dict[str, Any]:
    """What the issue's forger made: rank 0's labels and annotations, and an ownerReference to the job's
    real batch/v1 Job (its name and UID), running another image."""
    real = kube.api_client.sanitize_for_serialization(_rank0(kube, running))
    meta = real["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "forged-rank-0",
            "namespace": running["namespace"],
            "labels": meta["labels"],
            "annotations": meta.get("annotations", {}),
            "ownerReferences": meta["ownerReferences"],
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "node", "image": "localhost/forger:v1", "env": [
                {"name": "KWOK_STAY_RUNNING", "value": "1"}]}],
        },
    }  # fmt: skip


def _unchanged(kube: Any, running: dict[str, Any], cycles: int = 4) -> dict[str, Any]:
    """Supervision cycles later the job still runs its first attempt with no finding, its TrainJob and its
    two real rank pods are there, and no other pod carries its labels."""
    job_id, ns = running["id"], running["namespace"]
    for _ in range(cycles):
        with TestCase.captureOnCommitCallbacks(execute=True):
            cycle.supervise()
    data = get(running["token"], job_id)
    assert data["state"] == "running", data
    assert data["current_attempt"] == 1
    assert not data.get("identity_findings"), data["identity_findings"]
    kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", f"{job_id}-1")
    names = sorted(
        p.metadata.name
        for p in kube.core.list_namespaced_pod(ns, label_selector=f"dispatch.dev/job={job_id}").items
    )
    assert names == sorted(p.metadata.name for p in running["pods"])
    return data


def test_a_member_who_may_create_pods_cannot_forge_a_rank_and_the_job_runs_on(
    kube: Any, running_job: dict[str, Any], member: Callable[..., Member]
) -> None:
    ns = running_job["namespace"]
    forger = member(ns, [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}])
    forged = _forged_rank0(kube, running_job)
    assert forged["metadata"]["ownerReferences"][0]["uid"] == running_job["job"].metadata.uid

    refused = forger.create(forged)
    assert refused.returncode != 0
    assert f"ValidatingAdmissionPolicy '{PODS_POLICY}'" in refused.stderr
    assert (
        f"pod {ns}/forged-rank-0 carries an ownerReference to Job {running_job['job'].metadata.name}: in a "
        f"namespace dispatch manages only the Job controller ({JOB_CONTROLLER}) creates such a pod, not "
        f"{forger.username}"
    ) in refused.stderr

    # Control: the member's RBAC does let it create pods; only the guard refused the forged one.
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "own-pod", "namespace": ns, "labels": {"team": "mine"}},
        "spec": {"containers": [{"name": "c", "image": "localhost/own:v1"}]},
    }
    made = forger.create(plain)
    assert made.returncode == 0, made.stderr

    _unchanged(kube, running_job)


def test_the_same_pod_through_the_planes_admin_is_outside_the_promise(
    kube: Any, running_job: dict[str, Any], kubeconfig: str
) -> None:
    """The plane's admin certificate (CN dispatch-admin) is the one identity the local guard names in
    breakGlass (scripts/k8s/guard): a server dry run of the forged pod passes as the admin; nothing is
    made."""
    from tests.support.deploy import kubectl, whoami

    assert whoami(kubeconfig) == "dispatch-admin"
    forged = _forged_rank0(kube, running_job)
    result = kubectl(
        "create", "--dry-run=server", "-f", "-", kubeconfig=kubeconfig, stdin=json.dumps(forged), check=False
    )
    assert result.returncode == 0, result.stderr
    _unchanged(kube, running_job, cycles=1)


def test_a_member_cannot_change_kill_or_enter_a_rank_pod(
    kube: Any, running_job: dict[str, Any], member: Callable[..., Member]
) -> None:
    """pods/patch could swap a running rank's image (the kubelet restarts it in the new one), relabel it as
    another rank, or add an ephemeral container; pods/delete ends the rank. Each is refused, naming the
    policy; the job runs on."""
    ns = running_job["namespace"]
    rank0 = _rank0(kube, running_job).metadata.name
    m = member(
        ns,
        [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch", "delete", "get"]},
            {
                "apiGroups": [""],
                "resources": ["pods/ephemeralcontainers"],
                "verbs": ["get", "patch", "update"],
            },
        ],
    )
    image = json.dumps({"spec": {"containers": [{"name": "node", "image": "localhost/forger:v1"}]}})
    relabel = json.dumps({"metadata": {"labels": {"batch.kubernetes.io/job-completion-index": "1"}}})
    debug = json.dumps({"spec": {"ephemeralContainers": [{"name": "dbg", "image": "localhost/forger:v1"}]}})
    for args in (
        ("patch", "pod", rank0, "-n", ns, "--type=strategic", "-p", image),
        ("patch", "pod", rank0, "-n", ns, "--type=merge", "-p", relabel),
        (
            "patch",
            "pod",
            rank0,
            "-n",
            ns,
            "--subresource=ephemeralcontainers",
            "--type=strategic",
            "-p",
            debug,
        ),
    ):
        result = m.kubectl(*args)
        assert result.returncode != 0, args
        assert f"ValidatingAdmissionPolicy '{PODS_POLICY}'" in result.stderr, result.stderr
        assert f"pod {ns}/{rank0} is a Job's pod (or claims to be)" in result.stderr
        assert f"not {m.username}" in result.stderr
    deleted = m.kubectl("delete", "pod", rank0, "-n", ns, "--wait=false")
    assert deleted.returncode != 0
    assert "deleting a rank ends its job" in deleted.stderr
    assert "POST /api/v1/jobs/{id}/cancel" in deleted.stderr
    pod = kube.core.read_namespaced_pod(rank0, ns)
    assert pod.spec.containers[0].image == "localhost/trainer:v1"
    assert pod.metadata.deletion_timestamp is None and not pod.spec.ephemeral_containers
    _unchanged(kube, running_job)


def test_a_member_cannot_make_or_end_a_jobs_jobset_or_job(
    kube: Any, running_job: dict[str, Any], member: Callable[..., Member]
) -> None:
    """A member who may create and delete Jobs and JobSets: a Job named as dispatch names a rank's Job (its
    pods would be the Job controller's, so the pod policy would let them through) is refused; deleting the
    running JobSet (the Trainer would build it again and rerun every rank) or its Job (the JobSet controller
    would make it again) is refused. A Job of the member's own is fine."""
    ns, job_id = running_job["namespace"], running_job["id"]
    m = member(
        ns,
        [
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "delete", "patch", "get"]},
            {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["create", "delete"]},
        ],
    )
    job = kube.api_client.sanitize_for_serialization(running_job["job"])
    lookalike: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{job_id}-1-node-1", "namespace": ns},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "node", "image": "localhost/forger:v1"}]}}},
    }  # fmt: skip
    refused = m.create(lookalike)
    assert refused.returncode != 0
    assert f"ValidatingAdmissionPolicy '{JOBS_POLICY}'" in refused.stderr
    assert (
        f"Job {ns}/{job_id}-1-node-1 is named like a dispatch TrainJob's: in a namespace dispatch manages "
        f"only system:serviceaccount:jobset-system:jobset-controller-manager may create it, not {m.username}"
    ) in refused.stderr
    own = copy.deepcopy(lookalike)
    own["metadata"]["name"] = "my-own-job"
    made = m.create(own)
    assert made.returncode == 0, made.stderr

    for kind, name in (("jobset", f"{job_id}-1"), ("job", job["metadata"]["name"])):
        result = m.kubectl("delete", kind, name, "-n", ns, "--wait=false")
        assert result.returncode != 0, (kind, result.stdout)
        assert f"ValidatingAdmissionPolicy '{JOBS_POLICY}'" in result.stderr
        assert f"may delete it, not {m.username}" in result.stderr
    patched = m.kubectl(
        "patch", "job", job["metadata"]["name"], "-n", ns, "--type=merge", "-p", '{"spec":{"backoffLimit":6}}'
    )
    assert patched.returncode != 0 and f"may update it, not {m.username}" in patched.stderr
    _unchanged(kube, running_job)


def _event(api_version: str, ns: str, name: str, job: str, reporter: str) -> dict[str, Any]:
    """A Warning FailedCreate about the job's Job, happening now: what supervision reads as "the Job cannot
    create its pods" and, 15 s on, ends the job config-error (status-facts §10)."""
    now = datetime.now(UTC)
    if api_version == "v1":
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": job, "namespace": ns},
            "reason": "FailedCreate",
            "message": 'Error creating: pods "x" is forbidden: forged',
            "type": "Warning",
            "source": {"component": reporter},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "regarding": {"apiVersion": "batch/v1", "kind": "Job", "name": job, "namespace": ns},
        "reason": "FailedCreate",
        "note": 'Error creating: pods "x" is forbidden: forged',
        "type": "Warning",
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": reporter,
        "reportingInstance": "forger",
        "action": "Create",
    }


@pytest.mark.parametrize("api_version", ["v1", "events.k8s.io/v1"])
def test_a_member_cannot_write_an_event_in_a_system_controllers_name(
    kube: Any, running_job: dict[str, Any], member: Callable[..., Member], api_version: str
) -> None:
    """The issue's forged evidence: `FailedCreate` on the job's Job, reported as `job-controller`: refused in
    both Event APIs, and as the kubelet too. The same Event under a reporter of the member's own passes the
    door, and dispatch reads no evidence from it (a FailedCreate counts only from the Job controller,
    jobs/evidence.py): past the 15 s after which a FailedCreate fails a job config-error, the job runs on.
    Without that check the job failed `config-error` on the member's Event."""
    ns = running_job["namespace"]
    group = "" if api_version == "v1" else "events.k8s.io"
    m = member(ns, [{"apiGroups": [group], "resources": ["events"], "verbs": ["create"]}])
    job = running_job["job"].metadata.name
    refused = m.create(_event(api_version, ns, "forged", job, "job-controller"))
    assert refused.returncode != 0
    assert f"ValidatingAdmissionPolicy '{EVENTS_POLICY}'" in refused.stderr
    assert (
        f"Event {ns}/forged names job-controller as its reporter: in a namespace dispatch manages only "
        f"{JOB_CONTROLLER} writes such an Event, not {m.username}"
    ) in refused.stderr
    kubelet = m.create(_event(api_version, ns, "forged-kubelet", job, "kubelet"))
    assert kubelet.returncode != 0 and "system:node:" in kubelet.stderr

    own = m.create(_event(api_version, ns, "own", job, "forger-tool"))
    assert own.returncode == 0, own.stderr
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        data = _unchanged(kube, running_job, cycles=1)
        time.sleep(1)
    assert not data.get("cause"), data


def test_the_guard_is_what_the_repository_ships_and_bites_only_in_managed_namespaces(
    kube: Any, namespace: str, guard: list[dict[str, Any]], member: Callable[..., Member]
) -> None:
    """Control for every test above: in a namespace without dispatch.dev/managed=true the same member may
    create a Job's look-alike pod; labelled, the same request is refused."""
    m = member(namespace, [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "lookalike", "namespace": namespace,
                     "labels": {"batch.kubernetes.io/job-completion-index": "0"}},
        "spec": {"containers": [{"name": "node", "image": "localhost/forger:v1"}]},
    }  # fmt: skip
    dry = ("create", "--dry-run=server", "-f", "-")
    assert m.kubectl(*dry, stdin=json.dumps(pod)).returncode == 0
    label_managed(kube, namespace)
    guard_answers(lambda: m.kubectl(*dry, stdin=json.dumps(pod)), PODS_POLICY)
