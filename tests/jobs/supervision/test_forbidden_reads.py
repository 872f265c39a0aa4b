"""Reads that fail (issue 18 item 13), on the real control plane.

One read forbidden by RBAC (dispatch's reads made as a ServiceAccount whose Role the test edits) is named,
and the other reads still count: Events forbidden -> derived without them, said; Pods forbidden ->
`unknown` naming them; allowed again -> back by itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from kubernetes import client

from tests.jobs.supervision.support import _post, get, supervise_until, transitions, wait_job, watching
from tests.support.deploy import token_kubeconfig
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster]


# ---------------------------------------------------------------- one read forbidden (RBAC)


READS = {
    ("trainer.kubeflow.org", "trainjobs"),
    ("jobset.x-k8s.io", "jobsets"),
    ("batch", "jobs"),
    ("", "pods"),
    ("", "events"),
    ("kueue.x-k8s.io", "workloads"),  # listed once Kueue's CRDs are served (deploy/rbac grants it)
}


def _role(namespace: str, name: str, without: set[str]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": [
            {"apiGroups": [group], "resources": [resource], "verbs": ["get", "list", "watch"]}
            for group, resource in sorted(READS)
            if resource not in without
        ],
    }


@pytest.fixture
def supervisor_account(kube: Any, namespace: str, kubeconfig: str, tmp_path: Path) -> Any:
    """A ServiceAccount of the test namespace whose reads a Role grants (`allow(without=...)` rewrites it),
    and a kubeconfig holding only its token."""
    rbac: Any = client.RbacAuthorizationV1Api(kube.api_client)
    name = "t-supervisor"
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac.create_namespaced_role(namespace, _role(namespace, name, set()))
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    token = kube.core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    path = token_kubeconfig(kubeconfig, token, tmp_path / "supervisor.kubeconfig")
    auth: Any = client.AuthorizationV1Api(kube.api_client)

    def allowed(group: str, resource: str) -> bool:
        review = auth.create_subject_access_review(
            {
                "spec": {
                    "user": f"system:serviceaccount:{namespace}:{name}",
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                    "resourceAttributes": {
                        "namespace": namespace,
                        "verb": "list",
                        "group": group,
                        "resource": resource,
                    },
                }
            }
        )
        return bool(review.status.allowed)

    class Account:
        kubeconfig = path

        @staticmethod
        def allow(without: set[str]) -> None:
            rbac.replace_namespaced_role(name, namespace, _role(namespace, name, without))
            for group, resource in READS:
                expected = resource not in without
                wait_for(
                    lambda: allowed(group, resource) == expected,  # noqa: B023 (called within the iteration)
                    timeout=30,
                    what=f"RBAC in force for {resource}",
                )

    Account.allow(set())
    return Account


@pytest.mark.parametrize("path", ["beat", "watch"])
@pytest.mark.django_db(transaction=True)
def test_a_forbidden_read_is_named_and_the_other_reads_still_count(
    path: str,
    submitter: tuple[User, str],
    namespace: str,
    runtime_on: Any,
    supervisor_account: Any,
    settings: Any,
) -> None:
    """dispatch reads the cluster as a ServiceAccount of the job's namespace. Before, every list was
    cluster-wide, and one that failed turned every job `unknown`."""
    runtime_on(None)
    token = submitter[1]
    job_id = _post(token, namespace, {"KWOK_STAY_RUNNING": "1"})  # created as dispatch (admin)
    settings.KUBECONFIG = supervisor_account.kubeconfig  # read as the ServiceAccount from now on

    def judged(predicate: Any, what: str) -> dict[str, Any]:
        if path == "beat":
            return supervise_until(token, job_id, predicate, what=what)
        with watching(interval=0.5):
            wait_job(job_id, lambda j: predicate(get(token, j.pk)), what=what)
        return get(token, job_id)

    # Events forbidden: derived without them, and said.
    supervisor_account.allow({"events"})
    data = judged(
        lambda d: d["state"] == "running" and d.get("supervision_warnings"), "running, Events unreadable"
    )
    [warning] = data["supervision_warnings"]
    assert warning["object"] == f"Events in {namespace}"
    assert "forbidden" in warning["message"] and "derived without Events" in warning["message"]
    # Pods forbidden: the job cannot be judged: unknown, naming the read.
    supervisor_account.allow({"pods"})
    data = judged(lambda d: d["state"] == "unknown", "unknown")
    assert data["last_known_state"] == "running"
    assert f"Pods in {namespace}" in data["message"] and "forbidden" in data["message"], data["message"]
    # Allowed again: back by itself, nothing left to say.
    supervisor_account.allow(set())
    data = judged(lambda d: d["state"] == "running" and not d.get("supervision_warnings"), "back to running")
    assert ("running", "unknown") in transitions(data) and ("unknown", "running") in transitions(data)
    assert data["unknown_since"] is None
