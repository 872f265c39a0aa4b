"""Submitting through Kueue v0.19.2 on the local control plane, the user's way: POST /api/v1/jobs/plan and
POST /api/v1/jobs (the submit task runs on commit), then supervision cycles, then GET /api/v1/jobs/{id}.

Each test's namespace has a LocalQueue `dispatch` on a ClusterQueue of its own (cpu 4, memory 16Gi,
nvidia.com/gpu 2: the fixture `kueue_queue`), so a job asking nvidia.com/gpu 1 per node on dispatch-kind
(2 nodes) takes the whole GPU quota and a second one waits. Kueue runs for this module only (fixture
`kueue`), unless DISPATCH_CLUSTER_KUEUE=1 runs it for the whole session.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.auth.models import User
from kubernetes import client
from kubernetes.client.rest import ApiException

from cluster import gateway
from cluster import kueue as cluster_kueue
from cluster.errors import NotFound, Rejected
from jobs import objects
from jobs.models import Execution, Job, JobState
from jobs.submission import start
from runtimes.models import SiteSettings
from tests.jobs.supervision.test_supervision import supervise_until
from tests.support.cluster import Kube, KueueQueue
from tests.support.deploy import DispatchServiceAccount
from tests.support.dispatch import GROUP, VERSION, api_as, job_body, wait_for
from tests.support.kueue import (
    KUEUE,
    KUEUE_MANAGER,
    ONE_GPU_PER_NODE,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    admitted,
    get_trainjob,
    is_true,
    queued_trainjob,
    wait_workload,
)

pytestmark = [pytest.mark.cluster, pytest.mark.django_db, pytest.mark.usefixtures("dispatch_kind_allowed")]

KUEUE_DENIAL = "denied the request: runtime '"


def _site(**changes: Any) -> None:
    site = SiteSettings.load()
    for name, value in changes.items():
        setattr(site, name, value)
    site.save()


def _post(token: str, body: dict[str, Any], capture: Any) -> Any:
    with capture(execute=True):
        return api_as(token).post("/api/v1/jobs", body, format="json")


def _trainjobs(kube: Kube, namespace: str) -> list[str]:
    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"]
    return sorted(i["metadata"]["name"] for i in items)


# ---------------------------------------------------------------- refusals


def test_an_unknown_queue_is_refused_with_queue_not_found_and_nothing_is_created(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    ns = kueue_queue.namespace
    body = job_body(ns, queue_name="no-such-queue")
    plan = api_as(submitter[1]).post("/api/v1/plan", body, format="json")
    assert plan.status_code == 200 and plan.json()["refused"] is True
    response = _post(submitter[1], body, django_capture_on_commit_callbacks)
    assert response.status_code == 422, response.json()
    assert response.json()["reasons"] == [
        {
            "code": "queue-not-found",
            "message": f"LocalQueue no-such-queue does not exist in namespace {ns} (the job's queue_name)",
            "path": "queue_name",
            "waived": False,
        }
    ]
    assert response.json()["state"] == "refused"
    assert _trainjobs(kube, ns) == []


def test_a_job_asking_more_than_its_cluster_queue_can_ever_admit_is_refused(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """2 GPUs per node on 2 nodes, on a ClusterQueue of 2 GPUs without a cohort: Kueue could never admit it.
    Was: accepted (the plan itself said "it can never be admitted") and `queued` for ever. Now 422, nothing
    created."""
    ns = kueue_queue.namespace
    gpus = {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}
    body = job_body(ns, queue_name=kueue_queue.name, resources_per_node=gpus)
    response = _post(submitter[1], body, django_capture_on_commit_callbacks)
    assert response.status_code == 422, response.json()
    assert response.json()["reasons"] == [
        {
            "code": "queue-over-capacity",
            "message": f"the job requests nvidia.com/gpu 4 in total, more than ClusterQueue "
            f"{kueue_queue.cluster_queue} can ever admit (nominal quota plus borrowing limit): at most 2 in "
            "flavor dispatch-kwok",
            "path": "queue_name",
            "waived": False,
        }
    ]
    assert _trainjobs(kube, ns) == []


def test_a_priority_class_the_namespace_is_not_allowed_is_refused(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    ns = kueue_queue.namespace
    _site(kueue_priority_classes={ns: ["dispatch-low"], "*": ["dispatch-high"]})
    body = job_body(ns, queue_name=kueue_queue.name, priority_class="dispatch-high")
    response = _post(submitter[1], body, django_capture_on_commit_callbacks)
    assert response.status_code == 422, response.json()
    (reason,) = response.json()["reasons"]
    assert reason["code"] == "priority-class-not-allowed"
    assert reason["message"] == (
        f"priority class dispatch-high is not allowed in namespace {ns}: the allowed ones are dispatch-low"
    )
    assert _trainjobs(kube, ns) == []


# ---------------------------------------------------------------- a queued job, end to end


def test_a_queued_job_carries_its_queue_and_priority_waits_suspended_then_runs_and_succeeds(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A raw TrainJob holds the ClusterQueue's two GPUs; the dispatch job asks for them too. It is created
    suspended with dispatch's labels for the queue and the priority class, Kueue files its Workload and
    keeps it suspended, supervision shows it queued; when the holder goes, Kueue admits it and it runs to
    success. dispatch sent no runtimePatch: the only one is Kueue's own."""
    ns = kueue_queue.namespace
    _site(kueue_priority_classes={ns: ["dispatch-high"]})
    # The holder has the same priority: a lower one would be preempted by the job (withinClusterQueue:
    # LowerPriority), and the job would not wait.
    holder = queued_trainjob(
        kube, kueue_queue, "holder", env={"KWOK_STAY_RUNNING": "1"}, priority="dispatch-high", gpus=True
    )
    wait_workload(kube, holder, admitted, "the holder admitted")

    body = job_body(
        ns,
        queue_name=kueue_queue.name,
        priority_class="dispatch-high",
        resources_per_node=ONE_GPU_PER_NODE,
        env={"KWOK_RUN_DURATION": "2s"},
    )
    response = _post(submitter[1], body, django_capture_on_commit_callbacks)
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.QUEUED, job.message
    plan: dict[str, Any] = job.plan or {}
    sent = plan["objects"]["train_job"]
    assert "runtimePatches" not in sent["spec"] and sent["spec"]["suspend"] is True

    trainjob = get_trainjob(kube, ns, f"{job_id}-1")
    labels = trainjob["metadata"]["labels"]
    assert (labels[QUEUE_LABEL], labels[PRIORITY_LABEL]) == (kueue_queue.name, "dispatch-high")
    assert trainjob["spec"]["suspend"] is True
    # Kueue's mutating webhook appended its (empty) patch to what dispatch sent; it is the only one.
    assert [p["manager"] for p in trainjob["spec"].get("runtimePatches") or []] == [KUEUE_MANAGER]
    wl = wait_workload(kube, trainjob, lambda w: w.get("status") is not None, "the Workload filed")
    assert wl["spec"]["queueName"] == kueue_queue.name and wl["spec"]["priority"] == 1000
    assert not admitted(wl)

    waiting = supervise_until(
        submitter[1],
        job_id,
        lambda d: d["state"] == "queued" and bool(d["queued_reason"]),
        what="supervision to say why the job waits",
    )
    assert waiting["queued_reason"]["reason"] == "awaiting-quota", waiting["queued_reason"]
    assert get_trainjob(kube, ns, f"{job_id}-1")["spec"]["suspend"] is True

    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "holder")
    wait_workload(kube, trainjob, admitted, "the dispatch job admitted once the holder is gone", timeout=60)
    done = supervise_until(
        submitter[1], job_id, lambda d: d["state"] == "succeeded", timeout=120, what="the job succeeded"
    )
    assert done["cause"] == ""
    assert is_true(get_trainjob(kube, ns, f"{job_id}-1"), "Complete")


def test_the_namespace_default_queue_applies_when_the_job_names_none(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    ns = kueue_queue.namespace
    _site(kueue_default_queues={ns: kueue_queue.name, "*": "not-this-one"})
    response = _post(
        submitter[1], job_body(ns, env={"KWOK_RUN_DURATION": "1s"}), django_capture_on_commit_callbacks
    )
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    job = Job.objects.get(pk=job_id)
    assert job.spec.get("queue_name") is None  # what the user sent
    queue = (job.plan or {})["queue"]
    assert (queue["local_queue"], queue["source"]) == (
        kueue_queue.name,
        "namespace-default",
    )
    trainjob = get_trainjob(kube, ns, f"{job_id}-1")
    assert trainjob["metadata"]["labels"][QUEUE_LABEL] == kueue_queue.name
    wl = wait_workload(kube, trainjob, admitted, "admitted through the namespace's default queue")
    assert wl["status"]["admission"]["clusterQueue"] == kueue_queue.cluster_queue


def test_a_queue_deleted_between_submission_and_start_refuses_the_job_at_start(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    ns = kueue_queue.namespace
    with django_capture_on_commit_callbacks(execute=False):
        response = api_as(submitter[1]).post(
            "/api/v1/jobs", job_body(ns, queue_name=kueue_queue.name), format="json"
        )
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    kube.custom.delete_namespaced_custom_object(*KUEUE, ns, "localqueues", kueue_queue.name)
    wait_for(
        lambda: cluster_kueue.get_local_queue(ns, kueue_queue.name) is None, what="the LocalQueue deleted"
    )
    start.execution_submit(execution_id=Execution.objects.get(job_id=job_id).pk, holder="chain-1")
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.message) == (JobState.REFUSED, "refused at start: queue-not-found")
    assert [r["code"] for r in job.reasons] == ["queue-not-found"]
    assert _trainjobs(kube, ns) == []
    event = job.events.get(kind="refused")
    assert "its Kueue queue changed" in event.message


# ---------------------------------------------------------------- plan: quota, usage, fits now


def _plan(token: str, body: dict[str, Any]) -> dict[str, Any]:
    response = api_as(token).post("/api/v1/plan", body, format="json")
    assert response.status_code == 200, response.json()
    data: dict[str, Any] = response.json()
    return data


def _gpu(plan: dict[str, Any]) -> dict[str, Any]:
    (row,) = [r for r in plan["queue"]["quota"] if r["resource"] == "nvidia.com/gpu"]
    return dict(row)


def test_plan_shows_the_cluster_queues_quota_and_usage_and_whether_the_job_fits_now(
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Two jobs on a queue that fits one: the first fits, and once it is admitted the second does not."""
    ns, cq = kueue_queue.namespace, kueue_queue.cluster_queue
    body = job_body(
        ns, queue_name=kueue_queue.name, resources_per_node=ONE_GPU_PER_NODE, env={"KWOK_STAY_RUNNING": "1"}
    )
    first = _plan(submitter[1], body)
    assert first["refused"] is False
    queue = first["queue"]
    assert (queue["local_queue"], queue["source"], queue["cluster_queue"]) == (kueue_queue.name, "job", cq)
    assert queue["requests"] == {"nvidia.com/gpu": "2"}
    assert _gpu(first) == {
        "flavor": "dispatch-kwok",
        "resource": "nvidia.com/gpu",
        "quota": "2",
        "reserved": "0",
        "usage": "0",
        "free": "2",
        "requested": "2",
    }
    assert {(r["resource"], r["quota"]) for r in queue["quota"]} == {
        ("cpu", "4"),
        ("memory", "16Gi"),
        ("nvidia.com/gpu", "2"),
    }
    assert queue["fits_now"] is True
    assert queue["fit_message"] == f"fits ClusterQueue {cq}'s free quota now (flavor dispatch-kwok)"

    response = _post(submitter[1], body, django_capture_on_commit_callbacks)
    assert response.status_code == 202, response.json()
    started = get_trainjob(kube, ns, f"{response.json()['id']}-1")
    wait_workload(kube, started, admitted, "the first job admitted")

    # The ClusterQueue's status follows the admission a moment later.
    def reserved() -> dict[str, Any] | None:
        plan = _plan(submitter[1], body)
        return plan if _gpu(plan)["reserved"] == "2" else None

    second = wait_for(
        reserved,
        timeout=30,
        what="the ClusterQueue's reservation to show the first job",
    )
    assert second["refused"] is False  # waiting for quota is not a refusal
    assert second["queue"]["fits_now"] is False
    assert _gpu(second) | {"usage": "2"} == _gpu(second)
    assert _gpu(second)["free"] == "0"
    assert second["queue"]["fit_message"] == (
        f"waits for quota in ClusterQueue {cq}: nvidia.com/gpu: 2 requested, 0 of 2 free in flavor "
        "dispatch-kwok"
    )
    # A job that asks no GPU still fits beside it.
    small = _plan(submitter[1], job_body(ns, queue_name=kueue_queue.name))
    assert small["queue"]["fits_now"] is True and small["queue"]["requests"] == {
        "cpu": "200m",
        "memory": "64Mi",
    }


def test_plan_and_submission_read_kueue_with_dispatchs_own_rbac(
    settings: Any,
    kube: Kube,
    kueue_queue: KueueQueue,
    submitter: tuple[User, str],
    dispatch_serviceaccount: DispatchServiceAccount,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """With deploy/rbac's rules only (the ServiceAccount's token): plan reads the LocalQueue, the ClusterQueue
    and the WorkloadPriorityClass, a job starts, and the visibility API answers for the granted namespace
    and refuses another's (its authorization is the API server's RBAC, delegated)."""
    ns = kueue_queue.namespace
    dispatch_serviceaccount.grant(ns)
    settings.KUBECONFIG = dispatch_serviceaccount.kubeconfig
    _site(kueue_priority_classes={ns: ["dispatch-low"]})
    body = job_body(
        ns, queue_name=kueue_queue.name, priority_class="dispatch-low", env={"KWOK_STAY_RUNNING": "1"}
    )

    def planned() -> dict[str, Any] | None:  # RBAC caches settle a moment after the grant
        response = api_as(submitter[1]).post("/api/v1/plan", body, format="json")
        return dict(response.json()) if response.status_code == 200 else None

    plan = wait_for(planned, timeout=30, what="plan as dispatch's ServiceAccount")
    assert plan["refused"] is False, plan["reasons"]
    assert (plan["queue"]["cluster_queue"], plan["queue"]["priority"]) == (kueue_queue.cluster_queue, 100)
    response = _post(submitter[1], body, django_capture_on_commit_callbacks)
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED
    wait_workload(kube, get_trainjob(kube, ns, f"{job_id}-1"), admitted, "admitted")
    assert cluster_kueue.pending_workloads(ns, kueue_queue.name) == []
    with pytest.raises(Rejected) as refused:
        cluster_kueue.pending_workloads("default", "dispatch")  # scripts/k8s/kueue-queues.yaml
    assert refused.value.status == 403


# ---------------------------------------------------------------- Kueue's own cache lag


@contextmanager
def _only_kueue_validates_trainjobs_in(kube: Kube, namespace: str) -> Iterator[None]:
    """Kueue's cache lag cannot be produced on demand, and for a TrainJob on a runtime that does not exist
    (the stand-in) the Trainer's validating webhook, called in parallel, may answer first. So for this
    namespace only, and for this test only, the Trainer's TrainJob validator is skipped (its
    namespaceSelector excludes the namespace): every denial then is Kueue's real one, through the real API
    server. Restored afterwards."""
    api = client.AdmissionregistrationV1Api(kube.api_client)
    name = "validator.trainer.kubeflow.org"
    conf: Any = api.read_validating_webhook_configuration(name)
    (index,) = [i for i, w in enumerate(conf.webhooks) if w.name == "validator.trainjob.trainer.kubeflow.org"]
    original = kube.api_client.sanitize_for_serialization(conf.webhooks[index].namespace_selector) or {}
    path = f"/webhooks/{index}/namespaceSelector"
    skip = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [namespace]}
        ]
    }
    api.patch_validating_webhook_configuration(name, [{"op": "add", "path": path, "value": skip}])
    try:
        probe = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainJob",
            "metadata": {"name": "probe", "namespace": namespace},
            "spec": {"runtimeRef": {"name": "not-there", "kind": "TrainingRuntime"}},
        }

        def denial() -> str:
            try:
                kube.custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, "trainjobs", probe, dry_run="All"
                )
            except ApiException as exc:
                return str(json.loads(exc.body or "{}").get("message"))
            return "allowed"

        # The API server picks the change up through an informer: wait until the Trainer no longer answers.
        wait_for(
            lambda: all(KUEUE_DENIAL in denial() for _ in range(5)),
            timeout=30,
            what="only Kueue's webhook to deny a TrainJob on a missing runtime",
        )
        yield
    finally:
        api.patch_validating_webhook_configuration(name, [{"op": "add", "path": path, "value": original}])


def test_kueues_runtime_not_found_denial_is_waited_out_not_a_config_error(
    kube: Kube,
    namespace: str,
    kueue: None,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kueue's validating webhook refuses a TrainJob whose runtime its informer cache has not seen yet
    ("admission webhook \\"vtrainjob.kb.io\\" denied the request: runtime '<name>' not found"; 1 of 300
    TrainJobs created right after their runtime, measured). The first two creates of the job's TrainJob name
    a runtime Kueue has not seen (the stand-in for the lag, as in test_start_trust.py); both are denied by
    Kueue's real webhook, and the delivery waits them out: the job is queued, not failed config-error.
    Before the fix the first denial ended the job failed/config-error."""
    with django_capture_on_commit_callbacks(execute=False):
        response = api_as(submitter[1]).post("/api/v1/jobs", job_body(namespace, num_nodes=1), format="json")
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    execution = Execution.objects.get(job_id=job_id)

    real_create = gateway.create_namespaced
    denials: list[Rejected] = []

    def lagging_create(kind: str, body: dict[str, Any]) -> dict[str, Any]:
        if kind == objects.TRAINJOB and len(denials) < 2:
            unseen = {**body, "spec": {**body["spec"], "runtimeRef": {**body["spec"]["runtimeRef"]}}}
            unseen["spec"]["runtimeRef"]["name"] = f"{body['spec']['runtimeRef']['name']}-unseen"
            try:
                return real_create(kind, unseen)
            except Rejected as exc:
                denials.append(exc)
                raise
        return real_create(kind, body)

    with _only_kueue_validates_trainjobs_in(kube, namespace):
        monkeypatch.setattr(gateway, "create_namespaced", lagging_create)
        start.execution_submit(execution_id=execution.pk, holder="chain-1")
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.cause) == (JobState.QUEUED, ""), job.message
    assert [d.message for d in denials] == [
        f"admission webhook \"vtrainjob.kb.io\" denied the request: runtime '{job_id}-1-unseen' not found"
    ] * 2
    assert get_trainjob(kube, namespace, f"{job_id}-1")["spec"]["runtimeRef"]["name"] == f"{job_id}-1"


# ---------------------------------------------------------------- a cluster without Kueue

ABSENT_GROUP = "kueue.absent.dispatch.dev"
ABSENT_VISIBILITY_GROUP = "visibility.absent.dispatch.dev"


def _allow_the_absent_groups(kube: Kube, namespace: str) -> None:
    """A cluster without Kueue is stood in for by groups the API server does not serve. The API server
    authorizes before it routes, so dispatch's own account (DISPATCH_TEST_AS_SERVICEACCOUNT=1) would get 403
    for a group no rule of its names, where on a cluster without Kueue its Role (which names kueue.x-k8s.io)
    lets the request through to the 404: the account gets the same reads on the stand-in groups here."""
    rbac = client.RbacAuthorizationV1Api(kube.api_client)
    rules = [
        client.V1PolicyRule(api_groups=[ABSENT_GROUP], resources=["localqueues"], verbs=["get"]),
        client.V1PolicyRule(
            api_groups=[ABSENT_VISIBILITY_GROUP], resources=["localqueues/pendingworkloads"], verbs=["get"]
        ),
    ]
    rbac.create_namespaced_role(
        namespace, client.V1Role(metadata=client.V1ObjectMeta(name="absent-kueue"), rules=rules)
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="absent-kueue"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="absent-kueue"
            ),
            subjects=[
                client.RbacV1Subject(kind="ServiceAccount", name="dispatch", namespace="dispatch-system")
            ],
        ),
    )

    def not_installed() -> bool:  # RBAC caches settle a moment after the binding
        try:
            cluster_kueue.get_local_queue(namespace, "dispatch")
        except cluster_kueue.KueueNotInstalled:
            return True
        except Rejected:
            return False
        raise AssertionError(f"{ABSENT_GROUP} answered")

    wait_for(not_installed, timeout=30, what="the stand-in reads to be authorized")


def test_without_kueue_a_job_without_a_queue_starts_and_a_queued_one_is_refused(
    kube: Kube,
    namespace: str,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cluster without Kueue is the real API server asked for a Kueue group it does not serve (its real
    404 for the group): Kueue's CRDs stay installed on this plane once Kueue ran, so the test names a group
    that is not there instead of removing them."""
    monkeypatch.setattr(cluster_kueue, "GROUP", ABSENT_GROUP)
    _allow_the_absent_groups(kube, namespace)

    plain = _post(submitter[1], job_body(namespace, num_nodes=1), django_capture_on_commit_callbacks)
    assert plain.status_code == 202, plain.json()
    assert Job.objects.get(pk=plain.json()["id"]).state == JobState.QUEUED
    assert plain.json()["id"] + "-1" in _trainjobs(kube, namespace)

    queued = _post(
        submitter[1], job_body(namespace, queue_name="dispatch"), django_capture_on_commit_callbacks
    )
    assert queued.status_code == 422, queued.json()
    (reason,) = queued.json()["reasons"]
    assert reason["code"] == "queue-not-found"
    assert reason["message"].startswith("Kueue is not installed in the cluster")
    assert len(_trainjobs(kube, namespace)) == 1


def test_a_missing_local_queue_is_none_and_a_missing_group_is_not_installed(
    kube: Kube, dispatch_on_cluster: str, kueue: None, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cluster/kueue.py tells the two 404s apart from the answer alone (one call)."""
    assert cluster_kueue.get_local_queue(namespace, "nope") is None
    assert cluster_kueue.get_cluster_queue("dispatch") is not None
    with pytest.raises(NotFound, match=f"LocalQueue {namespace}/nope"):
        cluster_kueue.pending_workloads(namespace, "nope")
    monkeypatch.setattr(cluster_kueue, "VISIBILITY_GROUP", ABSENT_VISIBILITY_GROUP)
    monkeypatch.setattr(cluster_kueue, "GROUP", ABSENT_GROUP)
    _allow_the_absent_groups(kube, namespace)
    with pytest.raises(cluster_kueue.KueueNotInstalled):
        cluster_kueue.pending_workloads(namespace, "nope")
    with pytest.raises(cluster_kueue.KueueNotInstalled, match=f"LocalQueue {namespace}/dispatch: Kueue is"):
        cluster_kueue.get_local_queue(namespace, "dispatch")
