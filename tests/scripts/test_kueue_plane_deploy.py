"""Kueue on the local control plane as dispatch's deployment needs it: dispatch's RBAC rules for Kueue are
enough and the visibility API enforces them; Kueue's TrainJob validator refuses a TrainJob whose runtime its
cache has not seen. (tests/scripts/test_kueue_plane.py observes Kueue's own behaviour.)"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.support.cluster import Kube, KueueQueue
from tests.support.deploy import token_kubeconfig
from tests.support.kueue import (
    KUEUE,
    admitted,
    is_true,
    pending_workloads,
    queued_trainjob,
    wait_for,
    wait_workload,
)

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


# The rules dispatch needs against a Kueue, as deploy/rbac grants them to the worker, the component that
# plans, starts and (when no supervisor runs) supervises: the Kueue rules of its ClusterRole dispatch-worker
# (the cluster-scoped kinds, for plan) and of its Role dispatch-worker, per managed namespace (LocalQueues,
# Workloads, which supervision lists and deactivates with a patch, and the LocalQueue's pending workloads of
# the visibility API).
def _kueue_rules(path: str, name: str = "dispatch-worker") -> list[dict[str, list[str]]]:
    docs = yaml.safe_load_all((REPO / "deploy" / "rbac" / path).read_text())
    (role,) = [
        d for d in docs if d and d["kind"] in ("ClusterRole", "Role") and d["metadata"]["name"] == name
    ]
    return [r for r in role["rules"] if any(g.endswith("kueue.x-k8s.io") for g in r["apiGroups"])]


KUEUE_READER_RULES = _kueue_rules("roles.yaml")
KUEUE_JOBS_RULES = _kueue_rules("namespace-role.yaml")


def policy(rules: list[dict[str, list[str]]]) -> list[client.V1PolicyRule]:
    return [
        client.V1PolicyRule(api_groups=r["apiGroups"], resources=r["resources"], verbs=r["verbs"])
        for r in rules
    ]


def test_dispatchs_kueue_rbac_rules_are_enough_and_the_visibility_api_enforces_them(
    kube: Kube, kubeconfig: str, kueue_queue: KueueQueue, tmp_path: Any
) -> None:
    """A ServiceAccount holding only the rules above (deploy/rbac's) lists its namespace's Workloads (not
    every namespace's), reads the queues, patches spec.active of a Workload in its namespace, and reads its
    LocalQueue's pending workloads; the visibility API (delegated authorization: a SubjectAccessReview to
    kube-apiserver) refuses it another namespace's."""
    ns = kueue_queue.namespace
    name = f"{ns}-kueue"
    sa = client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="probe"))
    kube.core.create_namespaced_service_account(ns, sa)
    rbac = client.RbacAuthorizationV1Api(kube.api_client)
    subject = [client.RbacV1Subject(kind="ServiceAccount", name="probe", namespace=ns)]
    rbac.create_cluster_role(
        client.V1ClusterRole(metadata=client.V1ObjectMeta(name=name), rules=policy(KUEUE_READER_RULES))
    )
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=f"{name}-jobs"), rules=policy(KUEUE_JOBS_RULES)
        )
    )
    try:
        rbac.create_cluster_role_binding(
            client.V1ClusterRoleBinding(
                metadata=client.V1ObjectMeta(name=name),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=name
                ),
                subjects=subject,
            )
        )
        rbac.create_namespaced_role_binding(
            ns,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="kueue-jobs"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=f"{name}-jobs"
                ),
                subjects=subject,
            ),
        )
        token = kube.core.create_namespaced_service_account_token(
            "probe", ns, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
        ).status.token
        configuration = client.Configuration()
        config.load_kube_config(
            config_file=token_kubeconfig(kubeconfig, token, tmp_path / "probe.kubeconfig"),
            client_configuration=configuration,
        )
        api_client = client.ApiClient(configuration)
        probe = Kube(
            api_client=api_client,
            core=client.CoreV1Api(api_client),
            batch=client.BatchV1Api(api_client),
            custom=client.CustomObjectsApi(api_client),
        )
        tj = queued_trainjob(kube, kueue_queue, "rbac", env={"KWOK_STAY_RUNNING": "1"})
        wl = wait_workload(kube, tj, admitted, "admitted")

        def allowed() -> bool:  # RBAC caches settle within a moment of the bindings' creation
            try:
                probe.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")
                return True
            except ApiException as exc:
                if exc.status != 403:
                    raise
                return False

        wait_for("the bindings to take effect", allowed)
        names = [
            w["metadata"]["name"]
            for w in probe.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
        ]
        assert wl["metadata"]["name"] in names
        with pytest.raises(ApiException) as refused:  # supervision reads Workloads per managed namespace
            probe.custom.list_cluster_custom_object(*KUEUE, "workloads")
        assert refused.value.status == 403
        # What plan reads (cluster/kueue.py's gets); nothing more: no LocalQueue list, no ResourceFlavor.
        probe.custom.get_cluster_custom_object(*KUEUE, "clusterqueues", kueue_queue.cluster_queue)
        probe.custom.get_namespaced_custom_object(*KUEUE, ns, "localqueues", kueue_queue.name)
        probe.custom.get_cluster_custom_object(*KUEUE, "workloadpriorityclasses", "dispatch-low")
        for unused in (
            lambda: probe.custom.list_namespaced_custom_object(*KUEUE, ns, "localqueues"),
            lambda: probe.custom.get_cluster_custom_object(*KUEUE, "resourceflavors", "dispatch-kwok"),
        ):
            with pytest.raises(ApiException) as refused:
                unused()
            assert refused.value.status == 403
        assert pending_workloads(probe, kueue_queue)["kind"] == "PendingWorkloadsSummary"
        with pytest.raises(ApiException) as refused:
            pending_workloads(probe, KueueQueue("dispatch", "default", "dispatch"))  # default/dispatch exists
        assert refused.value.status == 403, refused.value.body
        with pytest.raises(ApiException) as refused:
            pending_workloads(probe, kueue_queue, cluster_queue=True)
        assert refused.value.status == 403, refused.value.body
        probe.custom.patch_namespaced_custom_object(
            *KUEUE, ns, "workloads", wl["metadata"]["name"], {"spec": {"active": False}}
        )
        wait_workload(kube, tj, lambda w: is_true(w, "Evicted", "Deactivated"), "Evicted=True Deactivated")
        api_client.close()
    finally:
        for delete in (
            lambda: rbac.delete_cluster_role_binding(name),
            lambda: rbac.delete_cluster_role(name),
            lambda: rbac.delete_cluster_role(f"{name}-jobs"),
        ):
            try:
                delete()
            except ApiException as exc:
                if exc.status != 404:
                    raise


def test_kueues_trainjob_validator_refuses_a_trainjob_whose_runtime_it_has_not_seen(
    kube: Kube, namespace: str, kueue: None, tmp_path: Any
) -> None:
    """With TopologyAwareScheduling (beta, on) Kueue's validating webhook builds the pod sets of EVERY
    TrainJob (queued or not) from its runtime, read through Kueue's informer cache, and refuses the TrainJob
    when the runtime is not there: "runtime '<name>' not found", a message of its own beside the Trainer's
    "... must be created before the TrainJob is created". Seen here for runtimes created just before their
    TrainJob: 1 of 300 creations denied by Kueue that way, 3 by the Trainer. Through kube-apiserver a
    missing runtime is denied by both and either message may come back (the webhooks run in parallel), so
    the test calls Kueue's registered webhook itself, as kube-apiserver does, with an AdmissionReview."""
    hooks: Any = client.AdmissionregistrationV1Api(kube.api_client).read_validating_webhook_configuration(
        "kueue-validating-webhook-configuration"
    )
    (hook,) = [w for w in hooks.webhooks if w.name == "vtrainjob.kb.io"]
    ca = tmp_path / "ca.crt"
    ca.write_bytes(base64.b64decode(hook.client_config.ca_bundle))
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "unseen-runtime", "namespace": namespace},
        "spec": {
            "runtimeRef": {"name": "not-there", "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"}
        },
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000001",
            "kind": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": "TrainJob"},
            "resource": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "resource": "trainjobs"},
            "name": "unseen-runtime",
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "dispatch-admin"},
            "object": trainjob,
        },
    }
    assert hook.client_config.url.startswith("https://127.0.0.1:"), hook.client_config.url
    request = urllib.request.Request(
        hook.client_config.url, data=json.dumps(review).encode(), headers={"Content-Type": "application/json"}
    )
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        answer = json.loads(response.read())["response"]
    assert answer["allowed"] is False, answer
    assert answer["status"]["message"] == "runtime 'not-there' not found", answer
