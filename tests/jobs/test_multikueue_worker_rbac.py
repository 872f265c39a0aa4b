"""deploy/multikueue/worker-rbac.yaml on a real worker plane: the API server, asked as dispatch's worker
identity (User `dispatch`, the subject the file binds), grants what dispatch does on a worker (the runtime
copy, supervision's reads, logs, exec, the fence, the leftovers sweeps' delete of a TrainJob copy) and nothing
that would let it run or change a workload there."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import yaml

from tests.scripts.test_multikueue_planes import STATE, multikueue_planes  # noqa: F401 (fixture)
from tests.support.deploy import REPO, kubectl

pytestmark = [pytest.mark.cluster]

RBAC = REPO / "deploy" / "multikueue" / "worker-rbac.yaml"
TRAINER = "trainer.kubeflow.org"

# What dispatch's code does on a worker (cluster.where.on_cluster callers): (verb, resource).
NEEDED = [
    ("create", f"trainingruntimes.{TRAINER}"),  # jobs.objects.runtime_copy_to_workers
    ("delete", f"trainingruntimes.{TRAINER}"),  # jobs.objects.worker_runtime_copies_delete
    ("get", f"trainingruntimes.{TRAINER}"),
    ("list", f"trainjobs.{TRAINER}"),  # supervision's watches and the leftovers sweeps
    ("watch", f"trainjobs.{TRAINER}"),
    ("delete", f"trainjobs.{TRAINER}"),  # the leftovers sweeps, once a lost worker answers
    ("watch", "jobsets.jobset.x-k8s.io"),
    ("list", "jobs.batch"),
    ("watch", "pods"),
    ("get", "pods"),  # a session's trainer pod, checked before each command
    ("list", "events"),
    ("get", "pods/log"),  # logs API and the kept tail
    ("create", "pods/exec"),  # session commands
]
REFUSED = [
    ("create", f"trainjobs.{TRAINER}"),
    ("patch", f"trainjobs.{TRAINER}"),
    ("create", "jobsets.jobset.x-k8s.io"),
    ("create", "jobs.batch"),
    ("create", "pods"),
    ("delete", "pods"),
    ("patch", "pods"),
    ("create", "pods/eviction"),
]


def _can(kubeconfig: str, namespace: str, verb: str, resource: str) -> bool:
    """`pods/log`: the subresource (kubectl would read `pods/log` as the pod named log); `namespaces/NAME`:
    that object."""
    kind, _, sub = resource.partition("/")
    args = [kind, f"--subresource={sub}"] if sub and kind == "pods" else [resource]
    result = kubectl(
        "auth", "can-i", verb, *args, "-n", namespace, "--as=dispatch", kubeconfig=kubeconfig, check=False
    )
    return result.stdout.strip() == "yes"


def test_the_worker_role_grants_what_dispatch_does_on_a_worker_and_nothing_that_runs_a_workload(
    multikueue_planes: Any,  # noqa: F811
) -> None:
    kubeconfig = str(STATE / "workers" / "worker-1.kubeconfig")
    namespace = f"t-worker-rbac-{uuid.uuid4().hex[:8]}"
    documents = []
    for document in yaml.safe_load_all(RBAC.read_text()):
        if document and document["kind"] in ("Role", "RoleBinding"):
            document["metadata"]["namespace"] = namespace  # the file's example namespace, team-a
        if document:
            documents.append(document)
    kubectl("create", "namespace", namespace, kubeconfig=kubeconfig)
    try:
        kubectl(
            "apply",
            "-f",
            "-",
            kubeconfig=kubeconfig,
            stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": documents}),
        )
        missing = [(v, r) for v, r in NEEDED if not _can(kubeconfig, namespace, v, r)]
        assert missing == [], f"dispatch's worker identity may not: {missing}"
        assert _can(kubeconfig, namespace, "patch", f"namespaces/{namespace}")  # the fence's annotation
        assert _can(kubeconfig, namespace, "get", "nodes")  # node-lost evidence
        granted = [(v, r) for v, r in REFUSED if _can(kubeconfig, namespace, v, r)]
        assert granted == [], f"dispatch's worker identity may: {granted}"
        assert not _can(kubeconfig, "kube-system", "get", "pods")  # only the namespaces it is bound in
    finally:
        kubectl("delete", "namespace", namespace, "--wait=false", kubeconfig=kubeconfig, check=False)
        kubectl(
            "delete",
            "clusterrolebinding,clusterrole",
            "dispatch-worker-nodes",
            kubeconfig=kubeconfig,
            check=False,
        )
