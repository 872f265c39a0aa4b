"""The admission guard as the local plane installs it (scripts/cluster up: scripts/k8s/guard, which is
deploy/guard with the plane's admin named in breakGlass), managed namespaces and namespace members.

- ``guard`` (session): the policies and bindings the plane installed, checked against scripts/k8s/guard, so a
  test proves the policies the repository ships, not a copy.
- ``managed_namespace`` (function): the test's namespace labelled dispatch.dev/managed=true and granted to
  dispatch's ServiceAccount; waits until the API server's admission answers with the guard in it.
- ``on_serviceaccount`` (function): dispatch talks to the API server with its ServiceAccount's token.
- ``member(namespace, rules)``: a ServiceAccount of the namespace with only the given RBAC rules there, and
  a kubeconfig holding only its token: a namespace member, not an admin.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.support.deploy import (
    MANAGED_LABEL,
    REPO,
    DispatchServiceAccount,
    apply,
    kubectl,
    kustomize,
    token_kubeconfig,
    whoami,
)
from tests.support.dispatch import wait_for

LOCAL_GUARD = REPO / "scripts" / "k8s" / "guard"
DEPLOY_GUARD = REPO / "deploy" / "guard"
GUARD_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
PLANE_ADMIN = "dispatch-admin"  # the CN of the plane's admin certificate (scripts/cluster gen_pki)


def within(rendered: Any, live: Any) -> bool:
    """Is every field of `rendered` in `live` with the same value (the API server adds defaults)?"""
    if isinstance(rendered, dict):
        return isinstance(live, dict) and all(k in live and within(v, live[k]) for k, v in rendered.items())
    if isinstance(rendered, list):
        return isinstance(live, list) and len(rendered) == len(live) and all(map(within, rendered, live))
    return bool(rendered == live)


def _installed(kubeconfig: str, kind: str, name: str) -> dict[str, Any]:
    out = kubectl("get", kind, name, "-o", "json", kubeconfig=kubeconfig).stdout
    found: dict[str, Any] = json.loads(out)
    return found


@pytest.fixture(scope="session")
def guard(kubeconfig: str) -> list[dict[str, Any]]:
    """The guard objects as scripts/k8s/guard renders them, each checked to be what the plane runs."""
    objects = [o for o in kustomize(LOCAL_GUARD, kubeconfig) if o["kind"] in GUARD_KINDS]
    assert len(objects) >= 10, [o["metadata"]["name"] for o in objects]
    for obj in objects:
        live = _installed(kubeconfig, obj["kind"], obj["metadata"]["name"])
        assert within(obj["spec"], live["spec"]), obj["metadata"]["name"]
    return objects


def member_kubeconfig(kube: Any, kubeconfig: str, namespace: str, name: str, path: Path) -> str:
    token = kube.core.create_namespaced_service_account_token(
        name,
        namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        ),
    ).status.token
    return token_kubeconfig(kubeconfig, token, path)


@dataclass(frozen=True)
class Member:
    kubeconfig: str  # holds the member's token, nothing else
    username: str
    namespace: str

    def kubectl(self, *args: str, stdin: str | None = None) -> Any:
        return kubectl(*args, kubeconfig=self.kubeconfig, stdin=stdin, check=False)

    def create(self, obj: dict[str, Any]) -> Any:
        return self.kubectl("create", "-f", "-", stdin=json.dumps(obj))


@pytest.fixture
def member(kube: Any, kubeconfig: str, tmp_path: Path) -> Callable[[str, list[dict[str, Any]]], Member]:
    """member(namespace, rules): a ServiceAccount `member` of the namespace whose only rights are `rules`
    (a Role there); waits until RBAC lets it do the first rule's first verb."""

    def make(namespace: str, rules: list[dict[str, Any]]) -> Member:
        kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": "member"}})
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "member", "namespace": namespace},
            "rules": rules,
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "member", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "member"},
            "subjects": [{"kind": "ServiceAccount", "name": "member", "namespace": namespace}],
        }
        apply([role, binding], kubeconfig)
        path = member_kubeconfig(kube, kubeconfig, namespace, "member", tmp_path / f"member-{namespace}")
        found = Member(
            kubeconfig=path, username=f"system:serviceaccount:{namespace}:member", namespace=namespace
        )
        assert whoami(path) == found.username
        first = rules[0]
        resource = first["resources"][0]
        group = first["apiGroups"][0]
        wait_for(
            lambda: (
                found.kubectl(
                    "auth", "can-i", first["verbs"][0], f"{resource}.{group}" if group else resource,
                    "-n", namespace,
                ).stdout.strip()
                == "yes"
            ),
            timeout=30, what="the member's RBAC to take effect",
        )  # fmt: skip
        return found

    return make


def label_managed(kube: Any, namespace: str) -> None:
    kube.core.patch_namespace(namespace, {"metadata": {"labels": dict([MANAGED_LABEL])}})


def guard_answers(probe: Callable[[], Any], policy: str) -> None:
    """Policies reach admission through an informer, and a namespace's new label through another: wait until
    `probe` (a server dry run that the guard refuses) names the policy."""
    wait_for(
        lambda: policy in (probe().stderr or ""),
        timeout=60,
        what=f"the admission guard ({policy}) to answer in the namespace",
    )


@pytest.fixture
def on_serviceaccount(
    settings: Any, dispatch_serviceaccount: DispatchServiceAccount, dispatch_on_cluster: str
) -> DispatchServiceAccount:
    """dispatch talks to the API server with its ServiceAccount's token, whatever the environment says."""
    settings.KUBECONFIG = dispatch_serviceaccount.kubeconfig
    assert whoami(settings.KUBECONFIG) == dispatch_serviceaccount.username
    return dispatch_serviceaccount
