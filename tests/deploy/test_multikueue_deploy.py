"""deploy/multikueue, the component an overlay adds for MultiKueue: the worker clusters' kubeconfigs (a Secret
of dispatch's own credentials, never Kueue's MultiKueue Secret) reach the processes that talk to the workers,
and nothing else does; the manager's ClusterRole reads what plan needs to name the workers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.test_network_policy import _render
from tests.support.deploy import EXAMPLE_OVERLAY, REPO

MOUNT = "/etc/dispatch/workers"


def _with_component(tmp_path: Path) -> list[dict[str, Any]]:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize takes paths relative to the overlay only
                "resources": [os.path.relpath(EXAMPLE_OVERLAY, overlay)],
                "components": [os.path.relpath(REPO / "deploy" / "multikueue", overlay)],
            }
        )
    )
    return _render(overlay)


def test_the_multikueue_component_gives_the_worker_kubeconfigs_to_web_worker_and_supervisor_only(
    tmp_path: Path,
) -> None:
    docs = _with_component(tmp_path)
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    mounted = {}
    for name, deployment in deployments.items():
        spec = deployment["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        container = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in container.get("env") or []}
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts") or []}
        if MOUNT in mounts:
            volume = volumes[mounts[MOUNT]["name"]]
            assert volume["secret"]["secretName"] == "dispatch-worker-kubeconfigs", volume
            assert mounts[MOUNT]["readOnly"] is True
            assert env["WORKER_KUBECONFIG_DIR"] == MOUNT
            mounted[name] = True
        else:
            assert "WORKER_KUBECONFIG_DIR" not in env, name
    assert set(mounted) == {"dispatch-web", "dispatch-worker", "dispatch-supervisor"}, sorted(mounted)


def test_the_manager_role_reads_the_admission_checks_and_multikueue_configs_plan_names_workers_from() -> None:
    roles = [d for d in yaml.safe_load_all((REPO / "deploy" / "rbac" / "roles.yaml").read_text()) if d]
    for planner in ("dispatch-web", "dispatch-worker"):  # plan runs in the web and again at a start
        reader = next(r for r in roles if r["metadata"]["name"] == planner)
        granted = {
            (group, resource, verb)
            for rule in reader["rules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }
        for resource in ("admissionchecks", "multikueueconfigs"):
            assert ("kueue.x-k8s.io", resource, "get") in granted, (planner, resource)
