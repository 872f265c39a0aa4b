"""The cluster as this run reads and changes it: its own client, direct to the API server (never through the
proxy)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from typing import Any, cast

from scripts.chaoslib.common import log
from scripts.chaoslib.outcomes import int_or_none
from scripts.identity_verdict import now as iso_now
from scripts.identity_verdict import observe


class Kube:
    """This script's own client to the API server (direct, never through the proxy)."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config

        self.client: Any = client
        self.api_client = config.new_client_from_config(config_file=kubeconfig)
        self.core: Any = client.CoreV1Api(self.api_client)
        self.custom: Any = client.CustomObjectsApi(self.api_client)
        self.ext: Any = client.ApiextensionsV1Api(self.api_client)

    def pods(self, namespace: str | None = None, *, node: str | None = None) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {"_preload_content": False, "_request_timeout": 30}
        if node:
            kwargs["field_selector"] = f"spec.nodeName={node}"
        if namespace:
            response = self.core.list_namespaced_pod(namespace, **kwargs)
        else:
            response = self.core.list_pod_for_all_namespaces(**kwargs)
        return cast(list[dict[str, Any]], json.loads(response.data)["items"])

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            response = self.core.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=10
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], json.loads(response.data))

    def namespace(self, name: str) -> None:
        client = self.client
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        for _ in range(200):  # pods are refused until the namespace's default ServiceAccount exists
            with contextlib.suppress(client.ApiException):
                self.core.read_namespaced_service_account("default", name)
                return
            time.sleep(0.1)

    def kueue_running(self) -> bool:
        """Kueue's CRDs are served and its webhooks registered (`scripts/cluster down --kueue` leaves the
        CRDs: jobs queued then would wait for ever, so the CRDs alone do not say Kueue runs)."""
        if not self.has_crd("clusterqueues.kueue.x-k8s.io"):
            return False
        hooks = self.client.AdmissionregistrationV1Api(self.api_client).list_mutating_webhook_configuration(
            _request_timeout=10
        )
        return any(h.metadata.name == "kueue-mutating-webhook-configuration" for h in hooks.items)

    def has_crd(self, name: str) -> bool:
        from kubernetes.client.rest import ApiException

        try:
            self.ext.read_custom_resource_definition(name, _request_timeout=10)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise


def pod_identity(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the pod runs under (the identity observer's reading: DISPATCH_* env, completion index, owner)."""
    record = observe(None, pod, event="LISTED", at=iso_now())
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return {
        "job": record["job"],
        "attempt": int_or_none(record["attempt"]),
        "rank": record["rank"],
        "job_controlled": any(
            o.get("kind") == "Job" and o.get("controller") for o in record["owner_references"]
        ),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "phase": status.get("phase"),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "start": status.get("startTime"),
        "deleting": bool(meta.get("deletionTimestamp")),
    }


def age_seconds(timestamp: str | None) -> float:
    if not timestamp:
        return 0.0
    from datetime import UTC, datetime

    return (datetime.now(UTC) - datetime.fromisoformat(timestamp.replace("Z", "+00:00"))).total_seconds()


def add_kwok_node(kube: Kube, name: str, run_label: str) -> None:
    """A second KWOK node (the one the run loses), Ready and untainted before the run uses it."""
    kube.core.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "chaos-run": run_label,
                },
            },
            "status": {
                "allocatable": {
                    "cpu": "32",
                    "memory": "256Gi",
                    "pods": "250",
                    "nvidia.com/gpu": "8",
                    "ephemeral-storage": "1Ti",
                },
                "capacity": {
                    "cpu": "32",
                    "memory": "256Gi",
                    "pods": "250",
                    "nvidia.com/gpu": "8",
                    "ephemeral-storage": "1Ti",
                },
            },
        }
    )
    for _ in range(300):
        node = kube.core.read_node(name)
        ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
        if ready and not node.spec.taints:
            break
        time.sleep(0.2)
    else:
        log(f"node {name} did not become Ready without taints")
