"""`manage.py check_cluster`, the overview's cluster box and /readyz (platform) say whether dispatch's
admission guard is in the cluster (cluster.guard): each policy of deploy/guard present and bound, and which
managed namespaces it covers. The checks run against the real plane, which installs the guard (scripts/cluster
up); one binding is deleted (and restored) to show a missing one named. The list of policies the check expects
is the one deploy/guard ships (read here, so the two cannot drift)."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.test import Client

from cluster.guard import DOORS, forget_cached_guard, guard_report
from tests.support.deploy import apply, kubectl, select
from tests.support.guard import DEPLOY_GUARD, label_managed

MISSING = "dispatch-pods-from-the-job-controller"


def _shipped() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for path in sorted(DEPLOY_GUARD.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return objects


def test_the_check_expects_every_policy_and_binding_deploy_guard_ships() -> None:
    shipped = _shipped()
    policies = {o["metadata"]["name"] for o in select(shipped, "ValidatingAdmissionPolicy")}
    mutating = {o["metadata"]["name"] for o in select(shipped, "MutatingAdmissionPolicy")}
    bindings = {
        o["metadata"]["name"]: o["spec"]["policyName"]
        for kind in ("ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicyBinding")
        for o in select(shipped, kind)
    }
    assert {d.policy for d in DOORS if not d.mutating} == policies
    assert {d.policy for d in DOORS if d.mutating} == mutating
    assert {d.binding: d.policy for d in DOORS} == bindings


def _namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def test_a_binding_that_only_warns_or_selects_other_namespaces_is_named() -> None:
    """Pure: the report on objects as the API server would list them."""
    shipped = _shipped()
    policies = select(shipped, "ValidatingAdmissionPolicy") + select(shipped, "MutatingAdmissionPolicy")
    bindings = select(shipped, "ValidatingAdmissionPolicyBinding") + select(
        shipped, "MutatingAdmissionPolicyBinding"
    )
    managed = [_namespace("team-a", **{"dispatch.dev/managed": "true"})]
    assert guard_report(policies=policies, bindings=bindings, namespaces=managed).ok
    warn_only = [
        {**b, "spec": {**b["spec"], "validationActions": ["Warn"]}} if b["metadata"]["name"] == MISSING else b
        for b in bindings
    ]
    report = guard_report(policies=policies, bindings=warn_only, namespaces=managed)
    assert report.warnings == (
        f"binding {MISSING} does not deny (validationActions without Deny): that a job's pods are created "
        "only by the Job controller is not enforced",
    )
    narrowed = [
        {
            **b,
            "spec": {
                **b["spec"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"team": "b"}}},
            },
        }
        if b["metadata"]["name"] == MISSING
        else b
        for b in bindings
    ]
    report = guard_report(policies=policies, bindings=narrowed, namespaces=managed)
    assert [s.door.policy for s in report.doors if not s.ok] == [MISSING]
    assert "does not cover the managed namespace(s) team-a" in report.warnings[0]
    unlabelled = guard_report(
        policies=policies, bindings=bindings, namespaces=[*managed, _namespace("team-b")]
    )
    assert unlabelled.warnings == (
        "namespace(s) team-b are granted in dispatch but not labelled dispatch.dev/managed=true: there the "
        "guard does not hold; label them",
    )
    assert all(s.covered == ("team-a",) for s in unlabelled.doors)


# ---------------------------------------------------------------- on the real plane

cluster = pytest.mark.cluster


def _check_cluster() -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("check_cluster", stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), err.getvalue() + str(exc)
    return 0, out.getvalue(), err.getvalue()


@pytest.fixture
def managed(kube: Any, namespace: str, submitter: Any) -> str:
    """The test's namespace, granted in dispatch (to the submitter) and labelled managed."""
    label_managed(kube, namespace)
    forget_cached_guard()
    return namespace


@pytest.fixture
def binding_deleted(guard: list[dict[str, Any]], kubeconfig: str) -> Iterator[str]:
    """One binding of the installed guard deleted for the test, and restored (as the plane installed it)."""
    [binding] = select(guard, "ValidatingAdmissionPolicyBinding", name=MISSING)
    kubectl("delete", "validatingadmissionpolicybinding", MISSING, kubeconfig=kubeconfig)
    try:
        yield MISSING
    finally:
        apply([binding], kubeconfig)
        forget_cached_guard()


@cluster
def test_check_cluster_finds_every_policy_bound_and_covering_the_managed_namespace(managed: str) -> None:
    code, out, err = _check_cluster()
    assert code == 0, (out, err)
    lines = out.splitlines()
    assert lines[0] == f"managed namespaces: {managed}"
    for door in DOORS:
        [line] = [line for line in lines if door.policy in line]
        assert line.startswith("ok ") and managed in line, line


@cluster
def test_a_deleted_binding_is_named_by_check_cluster_readyz_and_the_overview(
    managed: str, binding_deleted: str, platform_user: Any, plain_user: Any
) -> None:
    code, out, err = _check_cluster()
    assert code == 1, (out, err)
    assert f"MISSING  {MISSING} (binding {MISSING}): binding {MISSING} is missing" in out
    assert f"warning: binding {MISSING} is missing: policy {MISSING} is installed but holds nowhere" in err
    assert "the admission guard is incomplete (1 warning(s))" in err, err
    others = [line for line in out.splitlines() if line.startswith("ok ")]
    assert len(others) == len(DOORS) - 1

    # /readyz: still ready (a missing guard is a warning, not an outage); the platform sees which.
    client = Client()
    as_platform = client.get(
        "/readyz", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION=f"Token {platform_user[1]}"
    )
    assert as_platform.status_code == 200
    guard = as_platform.json()["advisories"]["guard"]
    assert guard["ok"] is False
    assert [p["policy"] for p in guard["policies"] if not p["bound"]] == [MISSING]
    assert "advisories" not in client.get("/readyz", REMOTE_ADDR="10.1.2.3").json()

    # The overview's cluster box: the platform sees the policy named; a plain user sees that one is missing.
    page = Client()
    page.force_login(platform_user[0])
    box = _cluster_box(page)
    assert "guard incomplete" in box and f"binding {MISSING} is missing" in box
    page.force_login(plain_user[0])
    box = _cluster_box(page)
    assert "guard incomplete" in box and MISSING not in box
    assert "the platform role sees which policy is missing" in box


def _cluster_box(page: Client) -> str:
    from django.urls import reverse

    return page.get(reverse("dashboard:home-cluster"), HTTP_HX_REQUEST="true").content.decode()


@cluster
def test_dispatchs_serviceaccount_may_read_the_guard_and_nothing_more_is_needed(
    managed: str, settings: Any, component_serviceaccount: Any, dispatch_on_cluster: str
) -> None:
    """The check runs as the web runs (`kubectl exec deploy/dispatch-web -- python manage.py check_cluster`;
    deploy/rbac: the policies and bindings listed, each granted namespace read by name, never the namespace
    list)."""
    settings.KUBECONFIG = component_serviceaccount("web").kubeconfig
    code, out, err = _check_cluster()
    assert code == 0, (out, err)
    assert out.splitlines()[0] == f"managed namespaces: {managed}"
