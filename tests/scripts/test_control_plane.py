"""The local control plane behaves like a cluster from a user's point of view.

Real kube-apiserver, controller manager, scheduler, JobSet and Trainer controllers with their admission
webhooks; KWOK plays the kubelet. Pod behaviour is chosen with container env vars
(scripts/k8s/kwok-stages.yaml): KWOK_RUN_DURATION, KWOK_EXIT_CODE, KWOK_OOM, KWOK_IMAGE_PULL_ERROR,
KWOK_STAY_RUNNING; a container running ``sleep infinity`` keeps running.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from tests.support.cluster import Kube

pytestmark = pytest.mark.cluster

TRAINER = ("trainer.kubeflow.org", "v1alpha1")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
RUNTIME = "dispatch-kind"
NODE = "kwok-node-0"
POLL = 0.2

T = TypeVar("T")


# ---------------------------------------------------------------- helpers


def wait_for(
    what: str, probe: Callable[[], Any], timeout: float = 30, state: Callable[[], Any] | None = None
) -> Any:
    """Poll probe() until it returns something truthy; fail with the observed state after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            observed = state() if state else value
            pytest.fail(f"timed out after {timeout}s waiting for {what}; last observed: {observed!r}")
        time.sleep(POLL)


def get_or_none(read: Callable[[], T]) -> T | None:
    try:
        return read()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return None


def create_trainjob(
    kube: Kube,
    namespace: str,
    name: str,
    *,
    num_nodes: int | None = None,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    runtime_ref: dict[str, str] | None = None,
    extra_spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    trainer: dict[str, Any] = {}
    if num_nodes is not None:
        trainer["numNodes"] = num_nodes
    if env:
        trainer["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if command:
        trainer["command"] = command
    spec: dict[str, Any] = {"runtimeRef": runtime_ref or {"name": RUNTIME}}
    if trainer:
        spec["trainer"] = trainer
    spec.update(extra_spec or {})
    body = {"apiVersion": "/".join(TRAINER), "kind": "TrainJob", "metadata": {"name": name}, "spec": spec}
    return kube.custom.create_namespaced_custom_object(*TRAINER, namespace, "trainjobs", body)


def get_trainjob(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.custom.get_namespaced_custom_object(*TRAINER, namespace, "trainjobs", name)


def trainjob_pods(kube: Kube, namespace: str, name: str) -> list[Any]:
    pods = kube.core.list_namespaced_pod(
        namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}"
    ).items
    return sorted(pods, key=lambda p: p.metadata.name)


def wait_trainjob_condition(
    kube: Kube, namespace: str, name: str, type_: str, timeout: float = 30
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        cond = condition(get_trainjob(kube, namespace, name), type_)
        return cond if cond and cond["status"] == "True" else None

    def state() -> Any:
        tj = get_trainjob(kube, namespace, name)
        return {
            "trainjob": (tj.get("status") or {}).get("conditions"),
            "pods": [(p.metadata.name, p.status.phase) for p in trainjob_pods(kube, namespace, name)],
        }

    return wait_for(f"TrainJob {namespace}/{name} condition {type_}=True", probe, timeout, state)


def terminated(pod: Any, container: str = "node") -> Any:
    (status,) = [s for s in pod.status.container_statuses or [] if s.name == container]
    assert status.state.terminated is not None, (
        f"{pod.metadata.name}/{container} is not terminated: {status.state}"
    )
    return status.state.terminated


def bare_pod(
    name: str, *, env: dict[str, str] | None = None, resources: dict[str, Any] | None = None
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "localhost/dispatch-busybox:kind"}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if resources:
        container["resources"] = resources
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], "restartPolicy": "Never", "terminationGracePeriodSeconds": 0},
    }


def exec_in_pod(
    kube: Kube, namespace: str, pod: str, command: list[str], timeout: float = 20
) -> tuple[str, str, int]:
    """Run command through pods/exec (websocket); return stdout, stderr and the exit code (error channel)."""
    resp = stream(
        kube.core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        container="node",
        command=command,
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    out: list[str] = []
    err: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while resp.is_open():
            if time.monotonic() > deadline:
                pytest.fail(f"exec {command} in {namespace}/{pod} still running after {timeout}s")
            resp.update(timeout=1)
            if resp.peek_stdout():
                out.append(resp.read_stdout())
            if resp.peek_stderr():
                err.append(resp.read_stderr())
        out.append(resp.read_stdout() or "")
        err.append(resp.read_stderr() or "")
        code = resp.returncode
    finally:
        resp.close()
    return "".join(out), "".join(err), code


# ---------------------------------------------------------------- tests


def test_two_node_trainjob_becomes_jobset_job_and_two_pods_that_run_and_complete(
    kube: Kube, namespace: str
) -> None:
    started = time.monotonic()
    create_trainjob(kube, namespace, "two-nodes", num_nodes=2, env={"KWOK_RUN_DURATION": "2s"})

    jobset = wait_for(
        "the JobSet",
        lambda: get_or_none(
            lambda: kube.custom.get_namespaced_custom_object(*JOBSET, namespace, "jobsets", "two-nodes")
        ),
    )
    assert [(o["kind"], o["name"]) for o in jobset["metadata"]["ownerReferences"]] == [
        ("TrainJob", "two-nodes")
    ]
    # Defaults from the JobSet mutating webhook (the controller depends on them).
    assert jobset["spec"]["successPolicy"]["operator"] == "All"
    (rjob,) = jobset["spec"]["replicatedJobs"]
    assert rjob["template"]["spec"]["completionMode"] == "Indexed"

    jobs = wait_for(
        "the Job",
        lambda: (
            kube.batch.list_namespaced_job(
                namespace, label_selector="jobset.sigs.k8s.io/jobset-name=two-nodes"
            ).items
        ),
    )
    assert [j.metadata.name for j in jobs] == ["two-nodes-node-0"]
    assert (jobs[0].spec.parallelism, jobs[0].spec.completions, jobs[0].spec.backoff_limit) == (2, 2, 0)

    running: list[Any] = wait_for(
        "both pods Running",
        lambda: (
            (pods := trainjob_pods(kube, namespace, "two-nodes"))
            and len(pods) == 2
            and all(p.status.phase == "Running" for p in pods)
            and pods
        ),
        state=lambda: [
            (p.metadata.name, p.status.phase) for p in trainjob_pods(kube, namespace, "two-nodes")
        ],
    )
    assert {p.spec.node_name for p in running} == {NODE}
    assert all(p.status.pod_ip for p in running)
    assert sorted(p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in running) == [
        "0",
        "1",
    ]

    complete = wait_trainjob_condition(kube, namespace, "two-nodes", "Complete")
    assert complete["reason"] == "AllJobsCompleted", complete
    pods = trainjob_pods(kube, namespace, "two-nodes")
    assert [p.status.phase for p in pods] == ["Succeeded", "Succeeded"]
    for pod in pods:
        state = terminated(pod)
        assert (state.exit_code, state.reason) == (0, "Completed")
    assert kube.batch.read_namespaced_job("two-nodes-node-0", namespace).status.succeeded == 2
    assert time.monotonic() - started < 30


def test_exit_code_3_fails_the_trainjob_quickly_with_the_jobset_reason(kube: Kube, namespace: str) -> None:
    started = time.monotonic()
    create_trainjob(kube, namespace, "exit-three", num_nodes=1, env={"KWOK_EXIT_CODE": "3"})

    failed = wait_trainjob_condition(kube, namespace, "exit-three", "Failed")
    assert failed["reason"] == "FailedJobs", failed
    assert time.monotonic() - started < 30
    (pod,) = trainjob_pods(kube, namespace, "exit-three")  # backoffLimit 0: no replacement pod
    assert pod.status.phase == "Failed"
    state = terminated(pod)
    assert (state.exit_code, state.reason) == (3, "Error")
    job = kube.batch.read_namespaced_job("exit-three-node-0", namespace)
    assert [c.reason for c in job.status.conditions if c.type == "Failed" and c.status == "True"] == [
        "BackoffLimitExceeded"
    ]


def test_oom_pod_reports_oomkilled(kube: Kube, namespace: str) -> None:
    create_trainjob(kube, namespace, "oom", num_nodes=1, env={"KWOK_OOM": "1"})

    pod = wait_for(
        "the pod to fail",
        lambda: (
            (pods := trainjob_pods(kube, namespace, "oom")) and pods[0].status.phase == "Failed" and pods[0]
        ),
        state=lambda: [(p.metadata.name, p.status.phase) for p in trainjob_pods(kube, namespace, "oom")],
    )
    state = terminated(pod)
    assert (state.reason, state.exit_code) == ("OOMKilled", 137)
    wait_trainjob_condition(kube, namespace, "oom", "Failed")


TORCH_RUNTIME = {
    "apiVersion": "/".join(TRAINER),
    "kind": "TrainingRuntime",
    "metadata": {"name": "torch-kind"},
    "spec": {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "template": {
                            "metadata": {
                                "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                            },
                            "spec": {
                                "template": {
                                    "spec": {
                                        "containers": [
                                            {"name": "node", "image": "localhost/dispatch-busybox:kind"}
                                        ]
                                    }
                                }
                            },
                        },
                    }
                ]
            }
        },
    },
}


def test_trainer_webhook_rejects_reserved_torch_env(kube: Kube, namespace: str) -> None:
    # PET_* names are reserved by the torch plugin: the runtime needs mlPolicy.torch (dispatch-kind has none).
    kube.custom.create_namespaced_custom_object(*TRAINER, namespace, "trainingruntimes", TORCH_RUNTIME)
    with pytest.raises(ApiException) as excinfo:
        create_trainjob(
            kube,
            namespace,
            "reserved-env",
            env={"PET_NNODES": "4"},
            runtime_ref={"name": "torch-kind", "kind": "TrainingRuntime"},
        )
    exc = excinfo.value
    assert 400 <= exc.status < 500, (exc.status, exc.body)
    message = json.loads(exc.body or "{}")["message"]
    assert 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request' in message, (
        message
    )
    assert "PET_NNODES" in message, message
    assert get_or_none(lambda: get_trainjob(kube, namespace, "reserved-env")) is None


def test_exec_into_a_running_trainer_pod_returns_stdout_stderr_and_exit_code(
    kube: Kube, namespace: str
) -> None:
    create_trainjob(kube, namespace, "session", num_nodes=1, command=["sleep", "infinity"])
    pod = wait_for(
        "the session pod Running",
        lambda: (
            (pods := trainjob_pods(kube, namespace, "session"))
            and pods[0].status.phase == "Running"
            and pods[0]
        ),
        state=lambda: [(p.metadata.name, p.status.phase) for p in trainjob_pods(kube, namespace, "session")],
    )
    name = pod.metadata.name

    out, err, code = exec_in_pod(kube, namespace, name, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (out, err, code) == ("out\n", "err\n", 3)
    assert exec_in_pod(kube, namespace, name, ["true"]) == ("", "", 0)

    # The keep-alive pod outlives the default 1s run time of Job pods.
    observe_until = time.monotonic() + 2.5
    while time.monotonic() < observe_until:
        assert kube.core.read_namespaced_pod(name, namespace).status.phase == "Running"
        time.sleep(POLL)
    assert condition(get_trainjob(kube, namespace, "session"), "Complete") is None


def test_bare_pod_with_stay_running_keeps_running_and_serves_logs(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_pod(namespace, bare_pod("stay", env={"KWOK_STAY_RUNNING": "1"}))
    wait_for(
        "the pod Running", lambda: kube.core.read_namespaced_pod("stay", namespace).status.phase == "Running"
    )
    assert "simulated container log" in kube.core.read_namespaced_pod_log("stay", namespace, container="main")


def test_image_pull_error_keeps_the_pod_pending_in_image_pull_backoff(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_pod(namespace, bare_pod("no-image", env={"KWOK_IMAGE_PULL_ERROR": "1"}))
    seen: set[str] = set()

    def waiting_reason() -> str | None:
        pod = kube.core.read_namespaced_pod("no-image", namespace)
        assert pod.status.phase == "Pending", pod.status
        for status in pod.status.container_statuses or []:
            if status.state.waiting:
                seen.add(status.state.waiting.reason)
                return status.state.waiting.reason
        return None

    wait_for("ImagePullBackOff", lambda: waiting_reason() == "ImagePullBackOff", state=lambda: seen)
    assert seen <= {"ErrImagePull", "ImagePullBackOff"}, seen


def test_requests_above_node_capacity_stay_pending_unschedulable(kube: Kube, namespace: str) -> None:
    gpus = lambda n: {"requests": {"nvidia.com/gpu": str(n)}, "limits": {"nvidia.com/gpu": str(n)}}  # noqa: E731
    kube.core.create_namespaced_pod(namespace, bare_pod("too-big", resources=gpus(100)))
    kube.core.create_namespaced_pod(
        namespace, bare_pod("fits", env={"KWOK_STAY_RUNNING": "1"}, resources=gpus(1))
    )

    def unschedulable() -> dict[str, str] | None:
        pod = kube.core.read_namespaced_pod("too-big", namespace)
        for cond in pod.status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                return {"reason": cond.reason, "message": cond.message, "phase": pod.status.phase}
        return None

    seen = wait_for("PodScheduled=False", unschedulable)
    assert seen["reason"] == "Unschedulable" and seen["phase"] == "Pending", seen
    assert "Insufficient nvidia.com/gpu" in seen["message"], seen
    assert kube.core.read_namespaced_pod("too-big", namespace).spec.node_name is None
    wait_for(
        "the 1-GPU pod Running",
        lambda: kube.core.read_namespaced_pod("fits", namespace).status.phase == "Running",
    )
