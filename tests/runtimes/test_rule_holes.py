"""The four identity holes (DESIGN.md: container-restart-policy, completion-mode,
fail-index-without-per-index, torch-trainer-job-name) against the real control plane: what the API server,
the Job API, and the JobSet and Trainer webhooks admit for each shape, what KWOK shows, and that dispatch's
plan refuses each one.

The control plane is scripts/cluster: kube-apiserver v1.36.3 (default feature gates), JobSet v0.12.0 and
Trainer v2.3.0 with their webhooks registered, KWOK v0.8.0 as the only "kubelet". Facts are stated in each
test's docstring; each is what that test asserts, with the source that says why.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from kubernetes.client.rest import ApiException
from rest_framework.test import APIClient

from tests.support.dispatch import DISPATCH_KIND, GROUP, VERSION, trainer_job, wait_for

pytestmark = [pytest.mark.cluster]

JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"


def _pod(**container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rank"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "node", "image": "localhost/trainer:v1", **container}],
        },
    }


def _restart_rule(code: int = 42) -> dict[str, Any]:
    return {"action": "Restart", "exitCodes": {"operator": "In", "values": [code]}}


def _job(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "ranks"},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "node", "image": "localhost/trainer:v1"}],
                }
            },
            **spec,
        },
    }


def _fail_index(**spec: Any) -> dict[str, Any]:
    rule = {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [3]}}
    return _job(completionMode="Indexed", podFailurePolicy={"rules": [rule]}, **spec)


def _dry_run_error(create: Callable[..., Any], *args: Any) -> ApiException | None:
    try:
        create(*args, dry_run="All", field_validation="Strict")
    except ApiException as exc:
        return exc
    return None


# --- the API server: pods


@pytest.mark.parametrize(
    "container",
    [
        pytest.param({"restartPolicy": "OnFailure"}, id="restartPolicy OnFailure"),
        pytest.param({"restartPolicy": "Always"}, id="restartPolicy Always"),
        pytest.param(
            {"restartPolicy": "Never", "restartPolicyRules": [_restart_rule(42)]},
            id="restartPolicy Never and a Restart rule for exit code 42",
        ),
    ],
)
def test_the_api_server_admits_a_rank_container_that_restarts_itself_under_pod_never(
    kube: Any, namespace: str, container: dict[str, Any]
) -> None:
    """kube-apiserver v1.36.3 admits (server dry run, strict field validation) a pod with
    restartPolicy: Never whose container states its own restartPolicy (OnFailure, Always), or
    restartPolicy: Never with a restartPolicyRules entry with action Restart, and keeps the fields.
    Source: the ContainerRestartRules feature gate, beta and on by default since 1.35 (kubernetes
    pkg/features/kube_features.go; reference/status-facts.md), and the container restartPolicy field
    description in shared/k8s/crds ("This overrides the pod-level restart policy"). So the pod's
    restartPolicy: Never alone does not stop the kubelet rerunning the rank in place: dispatch refuses it
    as container-restart-policy."""
    created = kube.core.create_namespaced_pod(
        namespace, _pod(**container), dry_run="All", field_validation="Strict"
    )
    node = created.spec.containers[0]
    assert node.restart_policy == container["restartPolicy"]
    if "restartPolicyRules" in container:
        assert [r.action for r in node.restart_policy_rules] == ["Restart"]
        assert node.restart_policy_rules[0].exit_codes.values == [42]
    assert created.spec.restart_policy == "Never"


def test_the_api_server_requires_a_container_restart_policy_beside_restart_rules(
    kube: Any, namespace: str
) -> None:
    """A container with restartPolicyRules but no restartPolicy of its own is rejected: 422
    "must specify restartPolicy when restart rules are used" (measured here; kubernetes
    pkg/apis/core/validation). The Trainer's CRD schema does not run pod validation, so such a runtime is
    stored and its pods would be refused later; dispatch refuses it as container-restart-policy."""
    error = _dry_run_error(
        kube.core.create_namespaced_pod, namespace, _pod(restartPolicyRules=[_restart_rule(42)])
    )
    assert error is not None and error.status == 422
    assert "must specify restartPolicy when restart rules are used" in str(error.body)


def test_the_api_server_admits_a_sidecar_init_container(kube: Any, namespace: str) -> None:
    """A sidecar is an init container with restartPolicy: Always (stable since 1.33); the kubelet restarts it
    on its own and leaves it out of the pod's phase (kubernetes pkg/api/v1/pod/util.go
    IsRestartableInitContainer; reference/status-facts.md). dispatch accepts it."""
    pod = _pod()
    pod["spec"]["initContainers"] = [
        {"name": "log-shipper", "image": "localhost/trainer:v1", "restartPolicy": "Always"}
    ]
    created = kube.core.create_namespaced_pod(namespace, pod, dry_run="All", field_validation="Strict")
    assert created.spec.init_containers[0].restart_policy == "Always"


# --- the Job API


def test_the_job_api_rejects_fail_index_without_backoff_limit_per_index(kube: Any, namespace: str) -> None:
    """An Indexed Job with a FailIndex podFailurePolicy rule and no backoffLimitPerIndex is rejected
    (422, "requires the backoffLimitPerIndex to be set"; kubernetes pkg/apis/batch/validation). With
    backoffLimitPerIndex it is admitted. dispatch refuses the first as fail-index-without-per-index: a
    runtime holding it would make a TrainJob whose Job can never be created."""
    error = _dry_run_error(kube.batch.create_namespaced_job, namespace, _fail_index())
    assert error is not None and error.status == 422
    assert "requires the backoffLimitPerIndex to be set" in str(error.body)
    assert (
        _dry_run_error(kube.batch.create_namespaced_job, namespace, _fail_index(backoffLimitPerIndex=0))
        is None
    )


def test_the_job_api_admits_a_non_indexed_job_which_has_no_completion_index(
    kube: Any, namespace: str
) -> None:
    """completionMode NonIndexed is the Job API's default and is admitted; such a Job's pods carry no
    batch.kubernetes.io/job-completion-index (the CRD's completionMode description in shared/k8s/crds:
    only Indexed Jobs get a completion index), so there is no rank: dispatch refuses completion-mode."""
    created = kube.batch.create_namespaced_job(
        namespace, _job(completionMode="NonIndexed"), dry_run="All", field_validation="Strict"
    )
    assert created.spec.completion_mode == "NonIndexed"


# --- the Trainer and JobSet webhooks: runtimes and TrainJobs carrying each hole


def _runtime(name: str, namespace: str, mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    body = copy.deepcopy(DISPATCH_KIND)
    body["kind"] = "TrainingRuntime"
    body["metadata"] = {"name": name, "namespace": namespace}
    mutate(body)
    return body


def _pod_spec(body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = trainer_job(body)["template"]["spec"]["template"]["spec"]
    return result


def _job_spec(body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = trainer_job(body)["template"]["spec"]
    return result


def _torch_trainer(body: dict[str, Any]) -> None:
    body["spec"]["mlPolicy"]["torch"] = {}
    trainer_job(body)["name"] = "trainer"


HOLES: list[tuple[str, str, Callable[[dict[str, Any]], None]]] = [
    (
        "container-restart-policy",
        "container restartPolicy OnFailure",
        lambda b: _pod_spec(b)["containers"][0].update(restartPolicy="OnFailure"),
    ),
    (
        "container-restart-policy",
        "container Restart rule",
        lambda b: _pod_spec(b)["containers"][0].update(
            restartPolicy="Never", restartPolicyRules=[_restart_rule(42)]
        ),
    ),
    (
        "completion-mode",
        "completionMode NonIndexed",
        lambda b: _job_spec(b).update(completionMode="NonIndexed"),
    ),
    (
        "fail-index-without-per-index",
        "FailIndex without backoffLimitPerIndex",
        lambda b: _job_spec(b).update(
            podFailurePolicy={
                "rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [3]}}]
            }
        ),
    ),
    ("torch-trainer-job-name", "torch, trainer job named trainer", _torch_trainer),
]


@pytest.mark.parametrize(("code", "mutate"), [pytest.param(c, m, id=name) for c, name, m in HOLES])
def test_the_trainer_admits_a_runtime_with_each_hole_and_keeps_it(
    kube: Any, namespace: str, code: str, mutate: Callable[[dict[str, Any]], None]
) -> None:
    """The Trainer's TrainingRuntime webhook (validate-trainer-kubeflow-org-v1alpha1-trainingruntime) and
    the v2.3.0 CRD schema admit a runtime with each of the four holes under strict field validation, and
    the stored object keeps the offending field: nothing upstream of dispatch refuses these runtimes, so
    the checker must."""
    body = _runtime("holey", namespace, mutate)
    created = kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", body, dry_run="All", field_validation="Strict"
    )
    # The CRD defaults groupName and replicas on the replicated job; everything dispatch judges is kept.
    [stored] = created["spec"]["template"]["spec"]["replicatedJobs"]
    [sent] = body["spec"]["template"]["spec"]["replicatedJobs"]
    assert (stored["name"], stored["template"]) == (sent["name"], sent["template"])
    assert created["spec"]["mlPolicy"] == body["spec"]["mlPolicy"]


@pytest.fixture
def holey_trainjob(kube: Any, namespace: str) -> Iterator[Callable[[Callable[[dict[str, Any]], None]], str]]:
    """Creates a runtime with a hole and a TrainJob on it (for real); returns the TrainJob's name."""

    def make(mutate: Callable[[dict[str, Any]], None]) -> str:
        kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingruntimes", _runtime("holey", namespace, mutate)
        )
        trainjob = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainJob",
            "metadata": {"name": "tj", "namespace": namespace},
            "spec": {
                "runtimeRef": {"apiGroup": GROUP, "kind": "TrainingRuntime", "name": "holey"},
                "trainer": {"numNodes": 2, "env": [{"name": "KWOK_STAY_RUNNING", "value": "1"}]},
            },
        }

        def create() -> bool:
            try:
                kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", trainjob)
            except ApiException as exc:
                if "must be created before" in str(exc.body):
                    return False  # the Trainer's cache has not seen the runtime yet
                raise
            return True

        wait_for(create, timeout=30, what="the Trainer to admit the TrainJob")
        return "tj"

    yield make


def _jobset(kube: Any, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        body: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, "jobsets", name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return body


def test_a_trainjob_on_a_fail_index_runtime_is_admitted_and_its_job_never_exists(
    kube: Any, namespace: str, holey_trainjob: Callable[..., str]
) -> None:
    """The Trainer admits the TrainJob and the JobSet webhook admits its JobSet, but the Job API rejects
    the Job the JobSet controller creates from it (FailIndex without backoffLimitPerIndex): the JobSet
    exists, no Job and no pod ever do. A job dispatch let through would sit in queued. Measured here."""
    name = holey_trainjob(
        lambda b: _job_spec(b).update(
            podFailurePolicy={
                "rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [3]}}]
            }
        )
    )
    jobset = wait_for(lambda: _jobset(kube, namespace, name), what="the JobSet")
    assert jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"][0][
        "action"
    ] == ("FailIndex")
    events = wait_for(
        lambda: [
            e
            for e in kube.core.list_namespaced_event(namespace).items
            if "backoffLimitPerIndex" in (e.message or "")
        ],
        timeout=60,
        what="an event naming backoffLimitPerIndex",
    )
    assert events[0].involved_object.kind == "JobSet"
    assert kube.batch.list_namespaced_job(namespace).items == []
    assert kube.core.list_namespaced_pod(namespace).items == []


def test_torch_with_a_trainer_job_not_named_node_points_every_rank_at_a_pod_that_does_not_exist(
    kube: Any, namespace: str, holey_trainjob: Callable[..., str]
) -> None:
    """The Trainer admits a TrainJob on a torch runtime whose trainer job is named "trainer", and its torch
    plugin still sets PET_MASTER_ADDR=<trainjob>-node-0-0.<trainjob> (kubeflow/trainer
    pkg/runtime/framework/plugins/torch/torch.go; reference/trainer-facts.md), while the pods are named
    <trainjob>-trainer-0-<i>: rendezvous would dial a host that never exists. Measured here."""
    name = holey_trainjob(_torch_trainer)
    jobset = wait_for(lambda: _jobset(kube, namespace, name), what="the JobSet")
    [replicated] = jobset["spec"]["replicatedJobs"]
    assert replicated["name"] == "trainer"
    [node] = [
        c for c in replicated["template"]["spec"]["template"]["spec"]["containers"] if c["name"] == "node"
    ]
    env = {e["name"]: e.get("value") for e in node.get("env", [])}
    assert env["PET_MASTER_ADDR"] == f"{name}-node-0-0.{name}"
    pods = wait_for(
        lambda: (lambda ps: ps if len(ps) == 2 else None)(kube.core.list_namespaced_pod(namespace).items),
        what="the two trainer pods",
    )
    # JobSet names each pod's host <jobset>-<replicated job>-<job index>-<completion index>.
    assert sorted(p.spec.hostname for p in pods) == [f"{name}-trainer-0-0", f"{name}-trainer-0-1"]


@pytest.mark.parametrize(
    ("mutate", "check"),
    [
        pytest.param(
            HOLES[0][2],
            lambda pod: pod.spec.containers[0].restart_policy == "OnFailure",
            id="container restartPolicy OnFailure",
        ),
        pytest.param(
            HOLES[1][2],
            lambda pod: [r.action for r in pod.spec.containers[0].restart_policy_rules] == ["Restart"],
            id="container Restart rule",
        ),
        pytest.param(
            HOLES[2][2],
            lambda pod: "batch.kubernetes.io/job-completion-index" not in (pod.metadata.annotations or {}),
            id="completionMode NonIndexed",
        ),
    ],
)
def test_a_trainjob_on_a_runtime_with_a_pod_level_hole_runs_pods_carrying_it(
    kube: Any,
    namespace: str,
    holey_trainjob: Callable[..., str],
    mutate: Callable[[dict[str, Any]], None],
    check: Callable[[Any], bool],
) -> None:
    """The Trainer admits the TrainJob, the JobSet webhook its JobSet, the Job API its Job and the API server
    its pods, each carrying the hole: a container restarting itself (restartPolicy OnFailure, or Never with
    a Restart rule), or a NonIndexed Job whose pods have no batch.kubernetes.io/job-completion-index, so no
    rank. JobSet's webhook defaults completionMode to Indexed only when it is unset
    (reference/trainer-facts.md section 6), and leaves a stated NonIndexed alone. Measured here."""
    holey_trainjob(mutate)
    pods = wait_for(
        lambda: (lambda ps: ps if len(ps) == 2 else None)(kube.core.list_namespaced_pod(namespace).items),
        what="the two trainer pods",
    )
    assert all(check(pod) for pod in pods)


def test_kwok_cannot_show_an_in_place_restart(kube: Any, namespace: str) -> None:
    """What KWOK shows for a rank container with restartPolicy: OnFailure under pod Never that exits 1:
    KWOK plays the kubelet through its stages only (scripts/k8s/kwok-stages.yaml: KWOK_EXIT_CODE makes the
    pod Failed), so it fails the pod with restartCount 0 instead of restarting the container in place as the
    kubelet would. The in-place rerun is the kubelet's (kubernetes pkg/kubelet/kubelet_pods.go getPhase and
    the ContainerRestartRules gate), which this cluster cannot run; the rule rests on that source."""
    pod = _pod(restartPolicy="OnFailure", env=[{"name": "KWOK_EXIT_CODE", "value": "1"}])
    kube.core.create_namespaced_pod(namespace, pod)

    def finished() -> Any:
        got = kube.core.read_namespaced_pod("rank", namespace)
        return got if got.status.phase in ("Failed", "Succeeded") else None

    got = wait_for(finished, timeout=60, what="KWOK to finish the pod")
    assert got.status.phase == "Failed"
    [status] = got.status.container_statuses
    assert status.restart_count == 0
    assert status.state.terminated.exit_code == 1


# --- dispatch refuses each hole: through the plan API, with the code and the field path


@pytest.mark.django_db
@pytest.mark.parametrize(("code", "mutate"), [pytest.param(c, m, id=name) for c, name, m in HOLES])
def test_dispatch_plan_refuses_each_hole(
    submitter: tuple[User, str],
    namespace: str,
    namespaced_runtime: Callable[..., Any],
    code: str,
    mutate: Callable[[dict[str, Any]], None],
) -> None:
    namespaced_runtime(mutate=mutate)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {submitter[1]}")
    body = {
        "runtime": {"kind": "TrainingRuntime", "name": "team-runtime"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
    }
    response = api.post("/api/v1/plan", body, format="json")
    assert response.status_code == 200, response.json()
    plan = response.json()
    assert plan["refused"] is True
    assert [(r["code"], r["waived"]) for r in plan["reasons"]] == [(code, False)]
    assert plan["reasons"][0]["path"] in plan["reasons"][0]["message"]
