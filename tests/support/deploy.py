"""dispatch as deployed (deploy/): kubectl and kustomize, the ServiceAccount's own kubeconfig, grants.

- ``component_serviceaccount(component)`` (session): applies deploy's ServiceAccounts and RBAC (from the
  example overlay, so the namespace is dispatch-system), asks the API server for a token of the component's
  account (TokenRequest) and writes a kubeconfig that holds only that token. ``grant(namespace)`` puts the
  component's Role and its RoleBinding in a namespace, as the overlay's grants do for team-a and team-b.
  ``dispatch_serviceaccount`` is the worker's (it starts and ends jobs). The RBAC objects stay
  installed (re-applying is idempotent, and another run may be using them); cluster-scoped ones of dispatch
  that the manifests no longer define are deleted.
- ``DISPATCH_TEST_AS_SERVICEACCOUNT=1`` makes ``dispatch_on_cluster`` (dispatch_fixtures.py) use it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "scripts" / "cluster"
EXAMPLE_OVERLAY = REPO / "deploy" / "overlays" / "example"
DISPATCH_NAMESPACE = "dispatch-system"
# One ServiceAccount per component (deploy/base/serviceaccount.yaml); the worker's is the one that starts and
# ends jobs (the admission guard's `dispatch`), so "dispatch's ServiceAccount" in these tests is the worker's.
COMPONENTS = ("web", "worker", "supervisor", "webhooks", "beat", "migrate")
DISPATCH_SA = "dispatch-worker"
DISPATCH_USER = f"system:serviceaccount:{DISPATCH_NAMESPACE}:{DISPATCH_SA}"
MANAGED_LABEL = ("dispatch.dev/managed", "true")
RBAC_KINDS = {"ClusterRole", "ClusterRoleBinding"}


def kubectl(
    *args: str, kubeconfig: str, stdin: str | None = None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The pinned kubectl (scripts/cluster kubectl) on the given kubeconfig."""
    result = subprocess.run(
        [str(CLUSTER_SCRIPT), "kubectl", f"--kubeconfig={kubeconfig}", "--request-timeout=60s", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def kustomize(path: Path, kubeconfig: str) -> list[dict[str, Any]]:
    out = kubectl("kustomize", str(path), kubeconfig=kubeconfig).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def apply(objects: list[dict[str, Any]], kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return kubectl("apply", *args, "-f", "-", kubeconfig=kubeconfig, stdin=yaml.safe_dump_all(objects))


def select(objects: list[dict[str, Any]], *kinds: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in kinds and (name is None or o["metadata"]["name"] == name)]


def token_kubeconfig(admin_kubeconfig: str, token: str, path: Path) -> str:
    """A kubeconfig for the same API server whose only credential is the bearer token."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "dispatch", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "dispatch"}}],
                "current-context": "c",
            }
        )
    )
    path.chmod(0o600)
    return str(path)


def whoami(kubeconfig: str) -> str:
    out = kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout
    return str(json.loads(out)["status"]["userInfo"]["username"])


@dataclass(frozen=True)
class DispatchServiceAccount:
    kubeconfig: str  # holds the ServiceAccount's token, nothing else
    username: str
    grant: Callable[[str], None]  # namespace -> the Role dispatch-jobs and its RoleBinding to the account


def _prune_cluster_rbac(kubeconfig: str, keep: set[tuple[str, str]]) -> None:
    """Cluster-scoped RBAC objects of dispatch that the manifests no longer define (an earlier version's
    cluster-wide bindings, left on a kept control plane) are deleted, so the account has exactly what the
    manifests give it."""
    for kind, resource in (("ClusterRoleBinding", "clusterrolebindings"), ("ClusterRole", "clusterroles")):
        out = kubectl(
            "get", resource, "-l", "app.kubernetes.io/part-of=dispatch", "-o", "json", kubeconfig=kubeconfig
        ).stdout
        for item in json.loads(out)["items"]:
            name = item["metadata"]["name"]
            if (kind, name) not in keep:
                kubectl("delete", resource, name, "--ignore-not-found", kubeconfig=kubeconfig)


@pytest.fixture(scope="session")
def example_manifests(kubeconfig: str) -> list[dict[str, Any]]:
    return kustomize(EXAMPLE_OVERLAY, kubeconfig)


@pytest.fixture(scope="session")
def component_serviceaccount(
    kubeconfig: str,
    kube: Any,
    example_manifests: list[dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], DispatchServiceAccount]:
    """component ("web", "worker", ...) -> its ServiceAccount with a token of its own; grant(namespace) puts
    that component's Role and RoleBinding there (none for a component without one)."""
    objects = [
        *select(example_manifests, "Namespace", name=DISPATCH_NAMESPACE),
        *select(example_manifests, "ServiceAccount"),
        *select(example_manifests, *RBAC_KINDS),
        # The one grant outside the job namespaces: the Trainer's Lease (deploy/rbac/trainer-lease.yaml).
        *select(example_manifests, "Role", "RoleBinding", name="dispatch-trainer-lease"),
    ]
    apply(objects, kubeconfig)
    _prune_cluster_rbac(kubeconfig, {(o["kind"], o["metadata"]["name"]) for o in objects})
    made: dict[str, DispatchServiceAccount] = {}

    def account(component: str) -> DispatchServiceAccount:
        if component in made:
            return made[component]
        name = f"dispatch-{component}"
        templates = [
            *select(example_manifests, "Role", name=name)[:1],
            *select(example_manifests, "RoleBinding", name=name)[:1],
        ]

        def grant(namespace: str) -> None:
            objects = [yaml.safe_load(yaml.safe_dump(template)) for template in templates]
            for obj in objects:
                obj["metadata"]["namespace"] = namespace
            if objects:
                apply(objects, kubeconfig)

        token = kube.core.create_namespaced_service_account_token(
            name,
            DISPATCH_NAMESPACE,
            client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7200)
            ),
        ).status.token
        path = token_kubeconfig(kubeconfig, token, tmp_path_factory.mktemp("sa") / f"{name}.kubeconfig")
        made[component] = DispatchServiceAccount(
            kubeconfig=path, username=f"system:serviceaccount:{DISPATCH_NAMESPACE}:{name}", grant=grant
        )
        return made[component]

    return account


@pytest.fixture(scope="session")
def dispatch_serviceaccount(
    component_serviceaccount: Callable[[str], DispatchServiceAccount],
) -> DispatchServiceAccount:
    """The worker's ServiceAccount: the one that starts and ends jobs."""
    return component_serviceaccount("worker")
