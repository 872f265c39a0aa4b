"""deploy/ against the real API server: the example overlay is accepted, the workloads come up (KWOK runs
their pods) under the restricted Pod Security Standard and scale, and dispatch's ServiceAccount may do what
dispatch does and nothing else (SelfSubjectAccessReviews with the account's own token)."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.support.deploy import (
    DISPATCH_NAMESPACE,
    EXAMPLE_OVERLAY,
    REPO,
    DispatchServiceAccount,
    kubectl,
    select,
)
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster]

BASE = REPO / "deploy" / "base"
DEPLOYMENTS = {
    "dispatch-web": 2,
    "dispatch-worker": 2,
    "dispatch-webhooks": 1,
    "dispatch-beat": 1,
    "dispatch-supervisor": 1,
}


@pytest.fixture
def example_namespaces(kube: Any, example_manifests: list[dict[str, Any]]) -> Iterator[None]:
    """The overlay's namespaces must exist for a server-side dry run of what goes into them (a dry run
    creates nothing, the Namespace objects included); the ones made here are deleted afterwards."""
    made = []
    for ns in select(example_manifests, "Namespace"):
        name = ns["metadata"]["name"]
        try:
            kube.core.read_namespace(name)
        except ApiException as exc:
            assert exc.status == 404
            kube.core.create_namespace({"metadata": {"name": name}})
            made.append(name)
    yield
    for name in made:
        if name != DISPATCH_NAMESPACE:  # the ServiceAccount fixture may be using it
            kube.core.delete_namespace(name, propagation_policy="Background")


def base_container(file: str) -> dict[str, Any]:
    """The one container of a Deployment in deploy/base (read as written: no plane needed)."""
    deployment = yaml.safe_load((BASE / file).read_text())
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _queues(command: list[str]) -> list[str]:
    assert command.count("-Q") == 1, command
    return command[command.index("-Q") + 1].split(",")


def test_webhook_deliveries_have_a_worker_deployment_of_their_own_with_few_threads() -> None:
    """The webhooks queue is consumed by dispatch-webhooks only; dispatch-worker (which starts TrainJobs)
    consumes the default queue only. Same pod shape as the worker's, smaller."""
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert "webhooks.yaml" in kustomization["resources"]
    worker, webhooks = (
        yaml.safe_load((BASE / "worker.yaml").read_text()),
        yaml.safe_load((BASE / "webhooks.yaml").read_text()),
    )
    assert webhooks["metadata"]["name"] == "dispatch-webhooks"
    assert webhooks["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "webhooks"
    assert _queues(base_container("worker.yaml")["command"]) == ["celery"]
    assert _queues(base_container("webhooks.yaml")["command"]) == ["webhooks"]
    env = {e["name"]: e["value"] for e in base_container("webhooks.yaml")["env"]}
    assert 1 <= int(env["WORKER_CONCURRENCY"]) <= 8
    assert webhooks["spec"]["template"]["spec"]["serviceAccountName"] == "dispatch-webhooks"
    assert webhooks["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    for key in ("securityContext", "enableServiceLinks", "initContainers", "volumes"):
        assert webhooks["spec"]["template"]["spec"][key] == worker["spec"]["template"]["spec"][key], key
    container, worker_container = base_container("webhooks.yaml"), base_container("worker.yaml")
    assert container["securityContext"] == worker_container["securityContext"]


def test_the_example_overlay_is_accepted_by_a_server_side_dry_run(
    kubeconfig: str, example_manifests: list[dict[str, Any]], example_namespaces: None
) -> None:
    result = kubectl(
        "apply", "--dry-run=server", "-k", str(EXAMPLE_OVERLAY), kubeconfig=kubeconfig, check=False
    )
    assert result.returncode == 0, result.stderr
    kinds = {o["kind"] for o in example_manifests}
    assert {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "Job",
        "ServiceAccount",
        "ConfigMap",
        "Secret",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Ingress",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "NetworkPolicy",
    } <= kinds
    for line in result.stdout.splitlines():
        assert line.endswith("(server dry run)"), line


def test_the_overlay_points_the_guard_and_the_bindings_at_dispatchs_namespace(
    example_manifests: list[dict[str, Any]],
) -> None:
    policies = select(example_manifests, "ValidatingAdmissionPolicy")
    # The Kueue policy (deploy/guard/kueue.yaml), the doors (deploy/guard/doors.yaml) and the fence
    # (deploy/guard/fence.yaml) name no ServiceAccount of dispatch: they hold for every writer.
    anyone = [
        p
        for p in policies
        if p["metadata"]["name"]
        in {
            "dispatch-kueue-admits-an-attempt-once",
            "dispatch-kueue-resumes-an-attempt-once",
            "dispatch-pods-from-the-job-controller",
            "dispatch-jobsets-and-jobs-from-their-controllers",
            "dispatch-evidence-from-its-reporter",
            "dispatch-ended-attempts-stay-ended",
        }
    ]
    assert len(anyone) == 6 and all(v["name"] != "dispatch" for p in anyone for v in p["spec"]["variables"])
    names = {"dispatch": "dispatch-worker", "web": "dispatch-web"}
    for policy in policies:
        assert "namespace" not in policy["metadata"]
        if policy in anyone:
            continue
        named = [v for v in policy["spec"]["variables"] if v["name"] in names]
        assert named, policy["metadata"]["name"]
        for variable in named:
            account = names[variable["name"]]
            assert variable["expression"] == f"'system:serviceaccount:{DISPATCH_NAMESPACE}:{account}'"
    for binding in select(example_manifests, "RoleBinding", "ClusterRoleBinding"):
        name = binding["metadata"]["name"]
        if name == "dispatch-trainer-lease":  # the Trainer's leader Lease, read by the two that delete
            assert binding["metadata"]["namespace"] == "kubeflow-system"
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": account, "namespace": DISPATCH_NAMESPACE}
                for account in ("dispatch-web", "dispatch-worker")
            ]
            continue
        assert name in ("dispatch-web", "dispatch-worker", "dispatch-supervisor")
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": name, "namespace": DISPATCH_NAMESPACE}
        ]
    grants = {b["metadata"]["namespace"] for b in select(example_manifests, "RoleBinding", "Role")}
    assert grants == {"team-a", "team-b", "kubeflow-system"}
    [job] = select(example_manifests, "Job")
    assert job["metadata"]["name"] == "dispatch-migrate-0-1-0"
    assert job["metadata"]["namespace"] == DISPATCH_NAMESPACE


def _available(kube: Any, namespace: str, name: str, replicas: int) -> bool:
    apps: Any = client.AppsV1Api(kube.api_client)
    status = apps.read_namespaced_deployment(name, namespace).status
    available = any(c.type == "Available" and c.status == "True" for c in status.conditions or [])
    return bool(
        available
        and status.available_replicas == replicas
        and status.updated_replicas == replicas
        and status.replicas == replicas
    )


def _pods(kube: Any, namespace: str, component: str) -> list[Any]:
    pods: list[Any] = kube.core.list_namespaced_pod(
        namespace, label_selector=f"app.kubernetes.io/component={component}"
    ).items
    return pods


def test_the_workloads_become_available_under_restricted_pod_security_and_scale(
    kube: Any, kubeconfig: str, namespace: str, tmp_path: Path
) -> None:
    # The restricted standard is enforced: a pod without the security contexts would be refused.
    kube.core.patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": namespace,
                "resources": [os.path.relpath(BASE, overlay)],
                "secretGenerator": [
                    {
                        "name": "dispatch-secrets",
                        "literals": [
                            "DATABASE_URL=postgres://dispatch:x@db.invalid:5432/dispatch",
                            "REDIS_URL=redis://redis.invalid:6379/0",
                        ],
                    },
                    {
                        "name": "dispatch-secret-key",
                        "literals": [f"SECRET_KEY={uuid.uuid4().hex}{uuid.uuid4().hex}"],
                    },
                ],
                "generatorOptions": {"disableNameSuffixHash": True},
            }
        )
    )
    result = kubectl("apply", "-k", str(overlay), kubeconfig=kubeconfig, check=False)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr  # PodSecurity warns on a violating Deployment

    def all_available() -> bool:
        return all(_available(kube, namespace, name, replicas) for name, replicas in DEPLOYMENTS.items())

    wait_for(all_available, timeout=180, what=f"{', '.join(DEPLOYMENTS)} Available")

    def migrated() -> Any:
        job = kube.batch.read_namespaced_job("dispatch-migrate", namespace)
        done = any(c.type == "Complete" and c.status == "True" for c in job.status.conditions or [])
        return job if done else None

    job = wait_for(migrated, timeout=60, what="the migration Job Complete")
    assert job.status.succeeded == 1
    for pod in _pods(kube, namespace, "web"):
        assert pod.spec.service_account_name == "dispatch-web"
        assert pod.status.phase == "Running"

    # Web scales horizontally; its PodDisruptionBudget keeps one serving.
    kubectl("scale", "deployment/dispatch-web", "--replicas=3", "-n", namespace, kubeconfig=kubeconfig)
    wait_for(lambda: _available(kube, namespace, "dispatch-web", 3), timeout=120, what="three web replicas")
    policy: Any = client.PolicyV1Api(kube.api_client)

    def budget_counts_three() -> bool:
        status = policy.read_namespaced_pod_disruption_budget("dispatch-web", namespace).status
        return bool(status.current_healthy == 3 and status.disruptions_allowed == 2)

    wait_for(
        budget_counts_three,
        timeout=60,
        what="the PDB to count three healthy web pods, two of which may be disrupted",
    )


def test_beat_is_replaced_without_ever_running_twice(
    kube: Any, kubeconfig: str, namespace: str, tmp_path: Path
) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": namespace,
                "resources": [os.path.relpath(BASE, overlay)],
                "secretGenerator": [
                    {"name": "dispatch-secrets", "literals": ["REDIS_URL=redis://redis.invalid:6379/0"]},
                    {"name": "dispatch-secret-key", "literals": [f"SECRET_KEY={uuid.uuid4().hex}"]},
                ],
            }
        )
    )
    kubectl("apply", "-k", str(overlay), kubeconfig=kubeconfig)
    wait_for(lambda: _available(kube, namespace, "dispatch-beat", 1), timeout=120, what="beat Available")
    [first] = _pods(kube, namespace, "beat")

    kubectl("rollout", "restart", "deployment/dispatch-beat", "-n", namespace, kubeconfig=kubeconfig)
    # The old pod may be gone before the first poll below (KWOK ends it at once): it counts as seen.
    most, seen = 0, {first.metadata.name}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = _pods(kube, namespace, "beat")
        most = max(most, len(pods))
        seen |= {p.metadata.name for p in pods}
        running = [p.metadata.name for p in pods if p.status.phase == "Running"]
        if running not in ([], [first.metadata.name]) and _available(kube, namespace, "dispatch-beat", 1):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("beat was not replaced within 120 s")
    assert len(seen) == 2, seen  # the old pod and its replacement
    assert most == 1, "two beat pods existed at once"


# ------------------------------------------------------- least privilege, with the account's own token


def _can(account: DispatchServiceAccount, *args: str) -> bool:
    result = kubectl("auth", "can-i", *args, kubeconfig=account.kubeconfig, check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stderr
    return result.stdout.strip() == "yes"


@pytest.fixture
def granted(dispatch_serviceaccount: DispatchServiceAccount, namespace: str) -> str:
    dispatch_serviceaccount.grant(namespace)
    return namespace


@pytest.mark.parametrize(
    "args",
    [
        ("create", "trainjobs.trainer.kubeflow.org"),
        ("patch", "trainingruntimes.trainer.kubeflow.org"),
        ("delete", "trainjobs.trainer.kubeflow.org"),
        ("list", "jobsets.jobset.x-k8s.io"),
        ("list", "jobs.batch"),
        ("list", "pods"),
        ("get", "pods", "--subresource=log"),
        ("list", "events"),
    ],
)
def test_the_account_may_do_what_dispatch_does_in_a_granted_namespace(
    dispatch_serviceaccount: DispatchServiceAccount, granted: str, args: tuple[str, ...]
) -> None:
    assert _can(dispatch_serviceaccount, *args, "-n", granted)


@pytest.mark.parametrize(
    "args",
    [
        ("list", "clustertrainingruntimes.trainer.kubeflow.org"),
        ("get", "clustertrainingruntimes.trainer.kubeflow.org"),
        ("list", "trainingruntimes.trainer.kubeflow.org", "--all-namespaces"),
        ("get", "nodes"),
    ],
)
def test_the_account_reads_cluster_wide_only_the_runtime_kinds_and_nodes(
    dispatch_serviceaccount: DispatchServiceAccount, args: tuple[str, ...]
) -> None:
    assert _can(dispatch_serviceaccount, *args)


@pytest.mark.parametrize(
    "args",
    [
        ("list", "pods", "--all-namespaces"),
        ("watch", "pods", "--all-namespaces"),
        ("list", "events", "--all-namespaces"),
        ("list", "jobs.batch", "--all-namespaces"),
        ("list", "jobsets.jobset.x-k8s.io", "--all-namespaces"),
        ("list", "trainjobs.trainer.kubeflow.org", "--all-namespaces"),
        ("watch", "nodes"),
        ("list", "nodes"),  # supervision reads the nodes its pods ran on by name, never the list
        ("list", "pods", "-n", "kube-system"),
        ("get", "pods", "-n", "kube-system"),
        ("list", "events", "-n", "kube-system"),
    ],
)
def test_the_account_reads_no_pod_event_or_job_outside_the_managed_namespaces(
    dispatch_serviceaccount: DispatchServiceAccount, args: tuple[str, ...]
) -> None:
    """Issue 22: the ServiceAccount listed and watched pods and events cluster-wide, so the web pods carried a
    credential that read every pod spec in the cluster, kube-system's included."""
    assert not _can(dispatch_serviceaccount, *args)


def _can_list(account: DispatchServiceAccount, namespace: str) -> dict[str, set[str]]:
    """`kubectl auth can-i --list` under the account's token: resource -> verbs, in one namespace."""
    result = kubectl("auth", "can-i", "--list", "-n", namespace, kubeconfig=account.kubeconfig)
    rights: dict[str, set[str]] = {}
    for line in result.stdout.splitlines()[1:]:
        columns = re.split(r"\s{2,}", line.strip())
        if len(columns) < 4 or not columns[0]:
            continue
        resource, verbs = columns[0], columns[-1].strip("[]").split()
        rights.setdefault(resource, set()).update(verbs)
    return rights


def test_can_i_list_shows_no_pods_in_an_unmanaged_namespace_and_no_secrets_anywhere(
    dispatch_serviceaccount: DispatchServiceAccount, granted: str, kube: Any
) -> None:
    """Least read, from the account's own point of view (`kubectl auth can-i --list` with its token)."""
    managed = _can_list(dispatch_serviceaccount, granted)
    assert {"get", "list"} <= managed["pods"]
    assert "pods/exec" not in managed  # the worker never runs a command in a pod
    for unmanaged in ("kube-system", "default", DISPATCH_NAMESPACE):
        rights = _can_list(dispatch_serviceaccount, unmanaged)
        assert not any(
            r.split(".")[0] in ("pods", "events", "pods/log", "pods/exec", "jobs") for r in rights
        ), (
            unmanaged,
            rights,
        )
        assert {"get", "list"} <= rights["trainingruntimes.trainer.kubeflow.org"]
        assert rights["nodes"] == {"get"}
    for namespace in (granted, "kube-system", "default", DISPATCH_NAMESPACE):
        rights = _can_list(dispatch_serviceaccount, namespace)
        assert not any(r.split(".")[0] == "secrets" for r in rights), (namespace, rights)
        assert not any("*" in verbs for r, verbs in rights.items() if not r.startswith("selfsubject")), rights


def test_the_example_overlays_grants_are_generated_from_its_namespace_list() -> None:
    result = subprocess.run(
        [str(REPO / "deploy" / "rbac" / "grants"), "--check", str(EXAMPLE_OVERLAY)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_example_overlay_carries_no_secret_key_and_trusts_the_proxies_its_ingress_implies(
    example_manifests: list[dict[str, Any]],
) -> None:
    for obj in example_manifests:
        assert "SECRET_KEY" not in yaml.safe_dump(obj), obj["metadata"]["name"]
    [config] = select(example_manifests, "ConfigMap", name="dispatch-config")
    [ingress] = select(example_manifests, "Ingress")
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == "dispatch-web"
    # The ingress controller's pods (the pod network) are the proxies whose X-Forwarded-For is believed.
    assert config["data"]["TRUSTED_PROXIES"] == "10.0.0.0/8"
    assert "NUM_PROXIES" not in config["data"]
    assert config["data"]["SECURE_PROXY_SSL_HEADER"] == "X-Forwarded-Proto=https"
    assert config["data"]["DEBUG"] == "false"


@pytest.mark.parametrize(
    "args",
    [
        ("get", "secrets"),
        ("list", "secrets"),
        ("delete", "pods"),
        ("create", "pods"),
        ("patch", "pods"),
        ("delete", "jobsets.jobset.x-k8s.io"),
        ("update", "trainjobs.trainer.kubeflow.org", "--subresource=status"),
        ("create", "configmaps"),
        ("create", "rolebindings.rbac.authorization.k8s.io"),
        ("patch", "roles.rbac.authorization.k8s.io"),
        ("create", "serviceaccounts", "--subresource=token"),
        ("create", "pods", "--subresource=exec"),
        ("get", "pods", "--subresource=exec"),
        ("watch", "pods"),
    ],
)
def test_the_account_may_not_touch_anything_else_in_a_granted_namespace(
    dispatch_serviceaccount: DispatchServiceAccount, granted: str, args: tuple[str, ...]
) -> None:
    assert not _can(dispatch_serviceaccount, *args, "-n", granted)


@pytest.mark.parametrize(
    "args",
    [
        ("create", "trainjobs.trainer.kubeflow.org"),
        ("delete", "trainingruntimes.trainer.kubeflow.org"),
        ("get", "pods"),
        ("get", "pods", "--subresource=log"),
        ("create", "pods", "--subresource=exec"),
        ("patch", "trainjobs.trainer.kubeflow.org"),
    ],
)
def test_the_account_may_not_touch_a_namespace_it_was_not_granted(
    dispatch_serviceaccount: DispatchServiceAccount, namespace: str, args: tuple[str, ...]
) -> None:
    assert not _can(dispatch_serviceaccount, *args, "-n", namespace)


@pytest.mark.parametrize(
    "args",
    [
        ("get", "secrets", "--all-namespaces"),
        ("list", "namespaces"),
        ("create", "clusterroles.rbac.authorization.k8s.io"),
        ("patch", "clusterrolebindings.rbac.authorization.k8s.io"),
        ("escalate", "clusterroles.rbac.authorization.k8s.io"),
        ("bind", "clusterroles.rbac.authorization.k8s.io"),
        ("impersonate", "users"),
        ("patch", "nodes"),
        ("patch", "validatingadmissionpolicies.admissionregistration.k8s.io"),
        ("delete", "validatingadmissionpolicybindings.admissionregistration.k8s.io"),
        ("create", "clustertrainingruntimes.trainer.kubeflow.org"),
    ],
)
def test_the_account_may_not_read_secrets_edit_rbac_or_the_guard_cluster_wide(
    dispatch_serviceaccount: DispatchServiceAccount, args: tuple[str, ...]
) -> None:
    assert not _can(dispatch_serviceaccount, *args)


def _may(
    account: DispatchServiceAccount, verb: str, group: str, resource: str, namespace: str = "", sub: str = ""
) -> bool:
    """A SelfSubjectAccessReview with the account's token, naming the group and resource itself: `kubectl
    auth can-i` answers no for a resource the API server does not serve (Kueue's kinds on a plane where Kueue
    was never installed, its visibility API while Kueue is stopped), whatever RBAC says."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=account.kubeconfig, client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        review = client.AuthorizationV1Api(api).create_self_subject_access_review(
            client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(
                    resource_attributes=client.V1ResourceAttributes(
                        verb=verb, group=group, resource=resource, subresource=sub, namespace=namespace
                    )
                )
            )
        )
    return bool(review.status and review.status.allowed)


KUEUE, VISIBILITY = "kueue.x-k8s.io", "visibility.kueue.x-k8s.io"


@pytest.mark.parametrize(
    ("verb", "group", "resource", "sub", "where", "allowed"),
    [
        # plan: the ClusterQueue (quota, usage) and the WorkloadPriorityClass, cluster-scoped
        ("get", KUEUE, "clusterqueues", "", "cluster", True),
        ("get", KUEUE, "workloadpriorityclasses", "", "cluster", True),
        ("list", KUEUE, "workloadpriorityclasses", "", "cluster", False),
        ("get", KUEUE, "resourceflavors", "", "cluster", False),
        # plan and supervision, per managed namespace: LocalQueues, Workloads (deactivation is a patch),
        # the queue positions of the visibility API
        ("get", KUEUE, "localqueues", "", "granted", True),
        ("list", KUEUE, "workloads", "", "granted", True),
        ("patch", KUEUE, "workloads", "", "granted", True),
        ("get", VISIBILITY, "localqueues", "pendingworkloads", "granted", True),
        # nothing else
        ("create", KUEUE, "workloads", "", "granted", False),
        ("delete", KUEUE, "workloads", "", "granted", False),
        ("patch", KUEUE, "localqueues", "", "granted", False),
        ("list", KUEUE, "workloads", "", "cluster", False),
        ("list", KUEUE, "localqueues", "", "cluster", False),
        ("patch", KUEUE, "workloads", "", "other", False),
        ("get", VISIBILITY, "localqueues", "pendingworkloads", "other", False),
        ("get", VISIBILITY, "clusterqueues", "pendingworkloads", "cluster", False),
        ("patch", KUEUE, "clusterqueues", "", "cluster", False),
        ("create", KUEUE, "workloadpriorityclasses", "", "cluster", False),
    ],
)
def test_the_accounts_kueue_rights_are_what_plan_and_supervision_read_and_patch(
    dispatch_serviceaccount: DispatchServiceAccount,
    granted: str,
    verb: str,
    group: str,
    resource: str,
    sub: str,
    where: str,
    allowed: bool,
) -> None:
    namespace = {"granted": granted, "other": "default", "cluster": ""}[where]
    assert _may(dispatch_serviceaccount, verb, group, resource, namespace, sub) is allowed


def test_the_roles_name_no_wildcards_and_no_secrets(example_manifests: list[dict[str, Any]]) -> None:
    roles = select(example_manifests, "ClusterRole", "Role")
    assert {r["metadata"]["name"] for r in roles} == {
        "dispatch-web",
        "dispatch-worker",
        "dispatch-supervisor",
        TRAINER_LEASE_ROLE,
    }
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (role["metadata"]["name"], rule)
            assert "secrets" not in rule["resources"]
            assert "nonResourceURLs" not in rule
            # Only the Trainer's Lease is granted by name (a Role there can name nothing else usefully).
            assert ("resourceNames" in rule) == (role["metadata"]["name"] == TRAINER_LEASE_ROLE)


def test_the_trainer_lease_role_names_the_lease_dispatch_reads(
    example_manifests: list[dict[str, Any]],
) -> None:
    """One Lease, by name, in the Trainer's namespace: exactly the TRAINER_LEADER_LEASE default (one
    definition, dispatch_site/config.py), read (get) by the two components that delete TrainJobs."""
    from dispatch_site.config import DEFAULT_TRAINER_LEADER_LEASE

    namespace, name = DEFAULT_TRAINER_LEADER_LEASE
    [role] = select(example_manifests, "Role", name=TRAINER_LEASE_ROLE)
    assert role["metadata"]["namespace"] == namespace
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [name],
            "verbs": ["get"],
        }
    ]
    [binding] = select(example_manifests, "RoleBinding", name=TRAINER_LEASE_ROLE)
    assert binding["metadata"]["namespace"] == namespace
    assert sorted(s["name"] for s in binding["subjects"]) == ["dispatch-web", "dispatch-worker"]


TRAINER_LEASE_ROLE = "dispatch-trainer-lease"


def _documented_rules() -> set[tuple[str, str, str, str, str]]:
    """(component, scope, API group, resource, verb) from the table of docs/cluster.md."""
    section = (REPO / "docs" / "cluster.md").read_text().split("\n#", 1)[0]
    rules = set()
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("component", "") or set(cells[0]) <= {"-", " "}:
            continue
        component, scope, group, resources, verbs = cells
        group = "" if group == "core" else group
        for resource in re.split(r",\s*", resources):
            for verb in re.split(r",\s*", verbs):
                rules.add((component, scope, group, resource.strip("`"), verb.strip("`")))
    return rules


def test_the_docs_list_exactly_these_rules(example_manifests: list[dict[str, Any]]) -> None:
    scopes = {"ClusterRole": "cluster", "Role": "job namespaces"}
    manifest = {
        (role["metadata"]["name"].removeprefix("dispatch-"), scopes[role["kind"]], group, resource, verb)
        for role in select(example_manifests, "ClusterRole", "Role")
        if role["metadata"]["name"] != TRAINER_LEASE_ROLE
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    [lease_role] = select(example_manifests, "Role", name=TRAINER_LEASE_ROLE)
    [lease_binding] = select(example_manifests, "RoleBinding", name=TRAINER_LEASE_ROLE)
    manifest |= {
        (subject["name"].removeprefix("dispatch-"), "Trainer's namespace", group, resource, verb)
        for subject in lease_binding["subjects"]
        for rule in lease_role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert _documented_rules() == manifest


def test_the_token_kubeconfig_is_a_restricted_identity(
    dispatch_serviceaccount: DispatchServiceAccount, namespace: str
) -> None:
    """The API server sees the ServiceAccount (403 for a secret read), and the kubeconfig holds no other
    credential."""
    result = kubectl(
        "get",
        "secrets",
        "-n",
        namespace,
        "-o",
        "json",
        kubeconfig=dispatch_serviceaccount.kubeconfig,
        check=False,
    )
    assert result.returncode != 0
    assert "Forbidden" in result.stderr and dispatch_serviceaccount.username in result.stderr
    config = yaml.safe_load(Path(dispatch_serviceaccount.kubeconfig).read_text())
    assert set(config["users"][0]["user"]) == {"token"}
