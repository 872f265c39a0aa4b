"""Fixtures of the supervision tests against the real control plane."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.support.dispatch import trainer_job, wait_for


@pytest.fixture
def runtime_on(namespaced_runtime: Callable[..., Any]) -> Callable[[str | None], None]:
    """team-runtime, optionally pinned to one dedicated node (nodeSelector + toleration of its taint)."""

    def create(node: str | None = None) -> None:
        def pin(body: dict[str, Any]) -> None:
            pod_spec = trainer_job(body)["template"]["spec"]["template"]["spec"]
            if node:
                pod_spec["nodeSelector"] = {"kubernetes.io/hostname": node}
                pod_spec["tolerations"] = [
                    {
                        "key": "dispatch.test/dedicated",
                        "operator": "Equal",
                        "value": node,
                        "effect": "NoSchedule",
                    }
                ]

        namespaced_runtime(mutate=pin)

    return create


@pytest.fixture
def dedicated_node(kube: Any) -> Iterator[Callable[..., str]]:
    """A KWOK node only the test's pods tolerate (KWOK manages every node: --manage-all-nodes)."""
    made: list[str] = []

    def create(cpu: str = "32") -> str:
        name = f"t-node-{uuid.uuid4().hex[:8]}"
        capacity = {"cpu": cpu, "memory": "64Gi", "pods": "110"}
        kube.core.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
                },
                "spec": {
                    "taints": [{"key": "dispatch.test/dedicated", "value": name, "effect": "NoSchedule"}]
                },
                "status": {"allocatable": capacity, "capacity": capacity},
            }
        )
        made.append(name)

        def ready() -> bool:
            node = kube.core.read_node(name)
            return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

        wait_for(ready, timeout=30, what=f"node {name} Ready")
        return name

    yield create
    for name in made:
        with contextlib.suppress(client.ApiException):
            kube.core.delete_node(name)
