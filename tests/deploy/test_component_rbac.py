"""Least privilege per component (issue 33): each of dispatch's processes talks to the API server with a
ServiceAccount of its own (deploy/base/serviceaccount.yaml), bound to only the verbs that process uses
(deploy/rbac). Asked of the real API server with each account's own token (`kubectl auth can-i --list`), and
attacked: the web's token deletes no job's TrainJob and runs no command in a job's rank (the admission guard,
deploy/guard), the webhooks worker's account may do nothing in a team namespace, the beat's pod has no
token."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.deploy.test_guard_doors import managed, running_job  # noqa: F401 (fixtures)
from tests.support.deploy import DispatchServiceAccount, kubectl, select

pytestmark = [pytest.mark.cluster]

Accounts = Callable[[str], DispatchServiceAccount]
TRAINER, KUEUE = "trainer.kubeflow.org", "kueue.x-k8s.io"

# What each process calls (cluster/ through jobs/, runtimes/, dispatch_site/), resource -> verbs, as
# `kubectl auth can-i --list` names them in a granted namespace (cluster-wide rules included).
EXPECTED: dict[str, dict[str, set[str]]] = {
    "web": {
        f"clustertrainingruntimes.{TRAINER}": {"get", "list"},
        f"trainingruntimes.{TRAINER}": {"get", "list", "create", "delete", "patch"},
        f"trainjobs.{TRAINER}": {"create", "get", "delete", "patch"},
        f"clusterqueues.{KUEUE}": {"get"},
        f"workloadpriorityclasses.{KUEUE}": {"get"},
        f"admissionchecks.{KUEUE}": {"get"},
        f"multikueueconfigs.{KUEUE}": {"get"},
        f"localqueues.{KUEUE}": {"get"},
        "validatingadmissionpolicies.admissionregistration.k8s.io": {"list"},
        "validatingadmissionpolicybindings.admissionregistration.k8s.io": {"list"},
        "mutatingadmissionpolicies.admissionregistration.k8s.io": {"list"},
        "mutatingadmissionpolicybindings.admissionregistration.k8s.io": {"list"},
        "namespaces": {"get"},
        "jobsets.jobset.x-k8s.io": {"list"},
        "jobs.batch": {"list"},
        "pods": {"get", "list"},
        "events": {"list"},
        "pods/log": {"get"},
        "pods/exec": {"get", "create"},
        "configmaps": {"get"},
    },
    "worker": {
        f"clustertrainingruntimes.{TRAINER}": {"get", "list"},
        f"trainingruntimes.{TRAINER}": {"get", "list", "create", "delete", "patch"},
        f"trainjobs.{TRAINER}": {"create", "get", "list", "delete", "patch"},
        f"clusterqueues.{KUEUE}": {"get"},
        f"workloadpriorityclasses.{KUEUE}": {"get"},
        f"admissionchecks.{KUEUE}": {"get"},
        f"multikueueconfigs.{KUEUE}": {"get"},
        f"localqueues.{KUEUE}": {"get"},
        f"workloads.{KUEUE}": {"get", "list", "patch"},
        "localqueues.visibility.kueue.x-k8s.io/pendingworkloads": {"get"},
        "nodes": {"get"},
        "namespaces": {"patch"},
        "jobsets.jobset.x-k8s.io": {"list"},
        "jobs.batch": {"list"},
        "pods": {"get", "list"},
        "events": {"list"},
        "pods/log": {"get"},
        "configmaps": {"get"},
    },
    "supervisor": {
        f"trainjobs.{TRAINER}": {"get", "list", "watch"},
        f"workloads.{KUEUE}": {"get", "list", "watch", "patch"},
        "localqueues.visibility.kueue.x-k8s.io/pendingworkloads": {"get"},
        "nodes": {"get"},
        "jobsets.jobset.x-k8s.io": {"list", "watch"},
        "jobs.batch": {"list", "watch"},
        "pods": {"list", "watch"},
        "events": {"list", "watch"},
    },
    "webhooks": {},
    "beat": {},
    "migrate": {},
}
# What every authenticated identity may do (system:basic-user, system:discovery, ...): not dispatch's rules.
EVERYONE = re.compile(
    r"^(selfsubject\w+\.authorization\.k8s\.io|selfsubjectreviews\.authentication\.k8s\.io)$"
)


def can_i_list(account: DispatchServiceAccount, namespace: str) -> dict[str, set[str]]:
    """`kubectl auth can-i --list -n namespace` with the account's own token: resource -> verbs (resources
    only; the non-resource URLs every identity may read are left out)."""
    out = kubectl("auth", "can-i", "--list", "-n", namespace, kubeconfig=account.kubeconfig).stdout
    rights: dict[str, set[str]] = {}
    for line in out.splitlines()[1:]:
        columns = re.split(r"\s{2,}", line.strip())
        if len(columns) < 4 or not columns[0] or EVERYONE.match(columns[0]):
            continue
        rights.setdefault(columns[0], set()).update(columns[-1].strip("[]").split())
    return rights


@pytest.mark.parametrize("component", list(EXPECTED))
def test_can_i_list_under_each_account_shows_only_its_verbs(
    component_serviceaccount: Accounts,
    example_manifests: list[dict[str, Any]],
    namespace: str,
    component: str,
) -> None:
    _runs_as_its_own_account(example_manifests, component)
    account = component_serviceaccount(component)
    account.grant(namespace)
    assert can_i_list(account, namespace) == EXPECTED[component]
    # Outside the managed namespaces, only the cluster-wide reads remain.
    cluster_wide = {r: v for r, v in EXPECTED[component].items() if r.split(".")[0] in CLUSTER_SCOPED}
    if f"trainingruntimes.{TRAINER}" in EXPECTED[component]:
        cluster_wide[f"trainingruntimes.{TRAINER}"] = {"get", "list"}
    if component == "worker":
        del cluster_wide["namespaces"]  # the fence's patch: of a managed namespace only
    assert can_i_list(account, "kube-system") == cluster_wide


CLUSTER_SCOPED = {
    "clustertrainingruntimes",
    "clusterqueues",
    "workloadpriorityclasses",
    "admissionchecks",
    "multikueueconfigs",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicybindings",
    "namespaces",
    "nodes",
}


def _runs_as_its_own_account(manifests: list[dict[str, Any]], component: str) -> None:
    """The component's pods (its Deployment's, the migration Job's) run as dispatch-<component>."""
    kind, name = (
        ("Job", "dispatch-migrate-0-1-0")
        if component == "migrate"
        else ("Deployment", f"dispatch-{component}")
    )
    [owner] = select(manifests, kind, name=name)
    assert owner["spec"]["template"]["spec"]["serviceAccountName"] == f"dispatch-{component}"


def test_the_webhooks_workers_account_may_do_nothing_in_a_team_namespace(
    component_serviceaccount: Accounts, example_manifests: list[dict[str, Any]], namespace: str
) -> None:
    _runs_as_its_own_account(example_manifests, "webhooks")
    account = component_serviceaccount("webhooks")
    for args in (
        ("get", "pods"),
        ("list", "trainjobs.trainer.kubeflow.org"),
        ("get", "nodes"),
        ("list", "events"),
    ):
        result = kubectl("auth", "can-i", *args, "-n", namespace, kubeconfig=account.kubeconfig, check=False)
        assert result.stdout.strip() == "no", args
    assert can_i_list(account, namespace) == {}


def test_the_beats_webhooks_and_migrations_pods_get_no_token(
    kubeconfig: str, example_manifests: list[dict[str, Any]], namespace: str
) -> None:
    """The API server's ServiceAccount admission mounts a token unless told not to: a server-side dry run of
    each pod, as its Deployment or Job makes it, shows none (the web's does, for contrast)."""
    for obj in example_manifests:
        if obj["kind"] == "ServiceAccount" and obj["metadata"]["name"] in (
            "dispatch-beat",
            "dispatch-webhooks",
            "dispatch-migrate",
        ):
            kubectl(
                "apply",
                "-n",
                namespace,
                "-f",
                "-",
                kubeconfig=kubeconfig,
                stdin=yaml.safe_dump({**obj, "metadata": {"name": obj["metadata"]["name"]}}),
            )
        if obj["kind"] == "ServiceAccount" and obj["metadata"]["name"] == "dispatch-web":
            kubectl(
                "apply",
                "-n",
                namespace,
                "-f",
                "-",
                kubeconfig=kubeconfig,
                stdin=yaml.safe_dump({**obj, "metadata": {"name": obj["metadata"]["name"]}}),
            )
    mounted = {}
    for kind, name in (
        ("Deployment", "dispatch-beat"),
        ("Deployment", "dispatch-webhooks"),
        ("Job", "dispatch-migrate-0-1-0"),
        ("Deployment", "dispatch-web"),
    ):
        [owner] = select(example_manifests, kind, name=name)
        template = owner["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"probe-{name}"},
            "spec": template["spec"],
        }
        out = kubectl(
            "create",
            "--dry-run=server",
            "-n",
            namespace,
            "-o",
            "yaml",
            "-f",
            "-",
            kubeconfig=kubeconfig,
            stdin=yaml.safe_dump(pod),
        ).stdout
        made = yaml.safe_load(out)
        mounted[name] = any(
            "serviceAccountToken" in str(v) or v.get("name", "").startswith("kube-api-access")
            for v in made["spec"].get("volumes") or []
        )
    assert mounted == {
        "dispatch-beat": False,
        "dispatch-webhooks": False,
        "dispatch-migrate-0-1-0": False,
        "dispatch-web": True,
    }


def test_the_webs_account_deletes_no_jobs_trainjob_and_enters_no_rank(
    kube: Any,
    component_serviceaccount: Accounts,
    running_job: dict[str, Any],  # noqa: F811
) -> None:
    """With its Role in the namespace (it deletes session TrainJobs and runs session commands), the web's
    token is refused, naming the policy, when it deletes a job's TrainJob or its runtime copy, or execs into a
    rank; the job runs on."""
    ns, job_id = running_job["namespace"], running_job["id"]
    web = component_serviceaccount("web")
    web.grant(ns)
    name = f"{job_id}-1"
    for kind in ("trainjob", "trainingruntime"):
        result = kubectl(
            "delete",
            f"{kind}.trainer.kubeflow.org",
            name,
            "-n",
            ns,
            "--wait=false",
            kubeconfig=web.kubeconfig,
            check=False,
        )
        assert result.returncode != 0, kind
        assert "ValidatingAdmissionPolicy 'dispatch-managed-objects'" in result.stderr, result.stderr
        assert "is not a session's" in result.stderr
    rank0 = (
        kube.core.list_namespaced_pod(ns, label_selector=f"dispatch.dev/job={job_id}").items[0].metadata.name
    )
    result = kubectl("exec", rank0, "-n", ns, "--", "true", kubeconfig=web.kubeconfig, check=False)
    assert result.returncode != 0
    assert "ValidatingAdmissionPolicy 'dispatch-web-enters-only-session-pods'" in result.stderr, result.stderr
    assert f"{rank0} is a job's rank" in result.stderr
    assert (
        kube.custom.get_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", name)[
            "metadata"
        ].get("deletionTimestamp")
        is None
    )


def test_the_webs_account_execs_only_into_pods_named_like_a_sessions(
    kube: Any,
    component_serviceaccount: Accounts,
    managed: str,  # noqa: F811
) -> None:
    """A pod of the team's that is no session's (a name of another shape) is refused to the web's token; one
    named like a session's trainer pod passes the policy (whatever the kubelet then answers)."""
    web = component_serviceaccount("web")
    web.grant(managed)
    for name in ("team-database-0", "sess-x-node-0-0-abcde"):
        kube.core.create_namespaced_pod(
            managed,
            {
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "node", "image": "localhost/x:v1"}]},
            },
        )
    refused = kubectl(
        "exec", "team-database-0", "-n", managed, "--", "true", kubeconfig=web.kubeconfig, check=False
    )
    assert refused.returncode != 0
    assert "team-database-0 is not named like a session's pod" in refused.stderr, refused.stderr
    passed = kubectl(
        "exec", "sess-x-node-0-0-abcde", "-n", managed, "--", "true", kubeconfig=web.kubeconfig, check=False
    )
    assert "dispatch-web-enters-only-session-pods" not in passed.stderr, passed.stderr
    attach = kubectl("attach", "sess-x-node-0-0-abcde", "-n", managed, kubeconfig=web.kubeconfig, check=False)
    assert attach.returncode != 0


@pytest.mark.parametrize("component", ["web", "worker", "supervisor"])
def test_only_the_deleting_components_read_the_trainers_lease_and_only_it(
    component_serviceaccount: Accounts, component: str
) -> None:
    """The web and the worker delete TrainJobs and read the Trainer's leader Lease first (jobs/stopping.py):
    that one Lease, by name, in the Trainer's namespace (deploy/rbac/trainer-lease.yaml); no other Lease
    there, and the supervisor none."""
    from dispatch_site.config import DEFAULT_TRAINER_LEADER_LEASE

    namespace, name = DEFAULT_TRAINER_LEADER_LEASE
    account = component_serviceaccount(component)

    def can(verb: str, what: str) -> bool:
        result = kubectl(
            "auth", "can-i", verb, what, "-n", namespace, kubeconfig=account.kubeconfig, check=False
        )
        return result.stdout.strip() == "yes"

    assert can("get", f"leases.coordination.k8s.io/{name}") == (component in ("web", "worker"))
    assert not can("get", "leases.coordination.k8s.io/another-controller")
    assert not can("list", "leases.coordination.k8s.io")
    assert not can("update", f"leases.coordination.k8s.io/{name}")
