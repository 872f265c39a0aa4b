"""dispatch as deployed (deploy/): kubectl and kustomize, the ServiceAccount's own kubeconfig, grants.

- ``dispatch_serviceaccount`` (session): applies deploy's ServiceAccount and RBAC (from the example overlay,
  so the namespace is dispatch-system), asks the API server for a token of that account (TokenRequest) and
  writes a kubeconfig that holds only that token. ``grant(namespace)`` puts the Role dispatch-jobs and its
  RoleBinding in a namespace, as the overlay's grants do for team-a and team-b. The RBAC objects stay
  installed (re-applying is idempotent, and another run may be using them); cluster-scoped ones of dispatch
  that the manifests no longer define are deleted.
- ``DISPATCH_TEST_AS_SERVICEACCOUNT=1`` makes ``dispatch_on_cluster`` (dispatch_fixtures.py) use it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
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
DISPATCH_SA = "dispatch"
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
def dispatch_serviceaccount(
    kubeconfig: str,
    kube: Any,
    example_manifests: list[dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DispatchServiceAccount]:
    objects = [
        *select(example_manifests, "Namespace", name=DISPATCH_NAMESPACE),
        *select(example_manifests, "ServiceAccount", name=DISPATCH_SA),
        *select(example_manifests, *RBAC_KINDS),
    ]
    apply(objects, kubeconfig)
    _prune_cluster_rbac(kubeconfig, {(o["kind"], o["metadata"]["name"]) for o in objects})
    templates = [
        select(example_manifests, "Role", name="dispatch-jobs")[0],
        select(example_manifests, "RoleBinding", name="dispatch-jobs")[0],
    ]

    def grant(namespace: str) -> None:
        objects = [yaml.safe_load(yaml.safe_dump(template)) for template in templates]
        for obj in objects:
            obj["metadata"]["namespace"] = namespace
        apply(objects, kubeconfig)

    token = kube.core.create_namespaced_service_account_token(
        DISPATCH_SA,
        DISPATCH_NAMESPACE,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7200)
        ),
    ).status.token
    path = token_kubeconfig(kubeconfig, token, tmp_path_factory.mktemp("sa") / "dispatch.kubeconfig")
    yield DispatchServiceAccount(kubeconfig=path, username=DISPATCH_USER, grant=grant)
