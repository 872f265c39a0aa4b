"""deploy/'s NetworkPolicies, as a connectivity analysis of the rendered manifests (tests/support/netpol.py):
a training pod of a team namespace reaches neither Redis nor PostgreSQL, whatever labels it carries, while
dispatch's own pods reach them, the API server, the cluster DNS and (the webhooks worker) HTTPS receivers;
the web takes connections from the ingress controller's namespace only. That the API server accepts the
policies is test_deploy.py's server-side dry run of the same overlay."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy import CLUSTER_SCRIPT, DISPATCH_NAMESPACE, EXAMPLE_OVERLAY, REPO
from tests.support.netpol import Address, Network, Pod, pods_of

BASE = REPO / "deploy" / "base"
DISPATCH_COMPONENTS = {"web", "worker", "webhooks", "beat", "supervisor", "migrate"}
INGRESS_NAMESPACE = "ingress-nginx"  # deploy/overlays/example/ingress.yaml's controller
API_SERVER = Address("10.0.0.2")  # deploy/overlays/example/kustomization.yaml
REDIS_PORT, POSTGRES_PORT, WEB_PORT, METRICS_PORT = 6379, 5432, 8000, 9100


def _render(path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize` with the pinned kubectl (no API server needed)."""
    result = subprocess.run(
        [str(CLUSTER_SCRIPT), "kubectl", "kustomize", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def example() -> list[dict[str, Any]]:
    return _render(EXAMPLE_OVERLAY)


@pytest.fixture(scope="module")
def network(example: list[dict[str, Any]]) -> Network:
    policies = [o for o in example if o["kind"] == "NetworkPolicy"]
    return Network(policies, namespaces={})


@pytest.fixture(scope="module")
def pods(example: list[dict[str, Any]]) -> dict[str, Pod]:
    """dispatch-system's pods as the example runs them, a PostgreSQL run there as docs/deploy.md says, and the
    pods around it: the ingress controller, CoreDNS, a training pod of team-a."""
    found = {p.labels.get("app.kubernetes.io/component", p.name): p for p in pods_of(example)}
    found["postgresql"] = Pod(
        "postgresql",
        DISPATCH_NAMESPACE,
        {"app.kubernetes.io/instance": "dispatch", "app.kubernetes.io/component": "postgresql"},
        "10.244.1.5",
    )
    found["ingress"] = Pod(
        "ingress-nginx-controller",
        INGRESS_NAMESPACE,
        {"app.kubernetes.io/name": "ingress-nginx"},
        "10.244.2.3",
    )
    found["dns"] = Pod("coredns", "kube-system", {"k8s-app": "kube-dns"}, "10.244.0.2")
    found["training"] = Pod(
        "mnist-node-0-0",
        "team-a",
        {
            "jobset.sigs.k8s.io/jobset-name": "mnist",
            "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
            "batch.kubernetes.io/job-name": "mnist-node-0",
        },
        "10.244.3.7",
    )
    return found


def _dispatch_pods(pods: dict[str, Pod]) -> list[Pod]:
    return [pods[c] for c in sorted(DISPATCH_COMPONENTS)]


def test_the_example_runs_redis_and_each_of_dispatchs_components_in_its_namespace(
    pods: dict[str, Pod],
) -> None:
    for component in [*DISPATCH_COMPONENTS, "redis"]:
        assert pods[component].namespace == DISPATCH_NAMESPACE, component
    assert pods["redis"].ports == {"redis": REDIS_PORT}


def test_every_pod_in_dispatchs_namespace_is_isolated_both_ways(
    example: list[dict[str, Any]], network: Network, pods: dict[str, Pod]
) -> None:
    in_namespace = [p for p in pods.values() if p.namespace == DISPATCH_NAMESPACE]
    assert {p.labels["app.kubernetes.io/component"] for p in in_namespace} == {
        *DISPATCH_COMPONENTS,
        "redis",
        "postgresql",
    }
    for pod in in_namespace:
        assert network.isolated(pod, "Ingress") and network.isolated(pod, "Egress"), pod.name
    # A pod nobody listed (a debugging pod, a sidecar job) gets nothing either.
    stray = Pod("stray", DISPATCH_NAMESPACE, {"run": "debug"}, "10.244.1.9")
    assert not network.connects(stray, pods["redis"], REDIS_PORT)
    assert not network.connects(stray, Address("203.0.113.10"), 443)


def test_a_training_pod_reaches_neither_redis_nor_postgresql_whatever_its_labels(
    network: Network, pods: dict[str, Pod]
) -> None:
    training = pods["training"]
    # Even one that copies a dispatch worker's labels onto itself: the rules select dispatch's namespace only.
    impostor = Pod(
        "impostor",
        "team-a",
        {"app.kubernetes.io/instance": "dispatch", "app.kubernetes.io/component": "worker"},
        "10.244.3.8",
    )
    for attacker in (training, impostor):
        for target, port in (("redis", REDIS_PORT), ("postgresql", POSTGRES_PORT)):
            for any_port in (port, 6380, 16379, 5433):
                assert not network.ingress_allows(attacker, pods[target], any_port), (attacker.name, target)
        # nor the web directly (it takes the ingress controller's connections only) nor the metrics ports
        assert not network.ingress_allows(attacker, pods["web"], WEB_PORT)
        for component in ("worker", "supervisor"):
            assert not network.ingress_allows(attacker, pods[component], METRICS_PORT)


def test_dispatchs_pods_reach_redis_postgresql_and_the_dns(network: Network, pods: dict[str, Pod]) -> None:
    for pod in _dispatch_pods(pods):
        assert network.connects(pod, pods["redis"], REDIS_PORT), pod.name
        assert network.connects(pod, pods["postgresql"], POSTGRES_PORT), pod.name
        assert network.connects(pod, pods["dns"], 53, "UDP") and network.connects(pod, pods["dns"], 53), (
            pod.name
        )
        # but nothing else in the cluster: not a team's pods, not each other
        assert not network.connects(pod, pods["training"], 8080), pod.name
        assert not network.connects(pod, pods["web"], WEB_PORT), pod.name
    # Redis and PostgreSQL themselves connect nowhere.
    for store in ("redis", "postgresql"):
        assert not network.connects(pods[store], pods["dns"], 53, "UDP")
        assert not network.connects(pods[store], Address("203.0.113.10"), 443)


def test_the_api_server_is_reached_by_the_pods_that_talk_to_it(
    network: Network, pods: dict[str, Pod]
) -> None:
    for component in ("web", "worker", "beat", "supervisor"):
        for port in (443, 6443):
            assert network.connects(pods[component], API_SERVER, port), component
    # The migration has no token (automountServiceAccountToken: false) and no reason to; webhook deliveries
    # never talk to Kubernetes.
    for component in ("migrate", "webhooks"):
        assert not network.connects(pods[component], API_SERVER, 443), component


def test_only_the_webhooks_worker_delivers_and_only_to_public_https(
    network: Network, pods: dict[str, Pod]
) -> None:
    public = Address("203.0.113.10")
    assert network.connects(pods["webhooks"], public, 443)
    assert network.connects(pods["webhooks"], Address("2001:db8::10"), 443)
    assert not network.connects(pods["webhooks"], public, 80)
    for private in (
        "169.254.169.254",
        "100.100.100.200",
        "10.96.0.1",
        "192.168.1.1",
        "172.16.0.1",
        "fd00::1",
    ):
        assert not network.connects(pods["webhooks"], Address(private), 443), private
    # The worker that starts TrainJobs no longer delivers (deploy/base/worker.yaml: -Q celery).
    for component in ("web", "worker", "beat", "supervisor", "migrate"):
        assert not network.connects(pods[component], public, 443), component


def test_the_web_takes_connections_from_the_ingress_controllers_namespace_only(
    network: Network, pods: dict[str, Pod]
) -> None:
    assert network.connects(pods["ingress"], pods["web"], WEB_PORT)
    assert not network.connects(pods["ingress"], pods["redis"], REDIS_PORT)
    assert not network.connects(pods["ingress"], pods["worker"], METRICS_PORT)
    elsewhere = Pod("anything", "team-b", dict(pods["ingress"].labels), "10.244.4.4")
    assert not network.ingress_allows(elsewhere, pods["web"], WEB_PORT)
    assert not network.ingress_allows(Address("203.0.113.10"), pods["web"], WEB_PORT)


def test_the_base_alone_fails_closed_until_an_overlay_names_the_ingress_and_the_api_server() -> None:
    base = _render(BASE)
    for obj in base:
        obj["metadata"].setdefault("namespace", DISPATCH_NAMESPACE)
    network = Network([o for o in base if o["kind"] == "NetworkPolicy"], namespaces={})
    found = {p.labels["app.kubernetes.io/component"]: p for p in pods_of(base)}
    ingress = Pod("controller", INGRESS_NAMESPACE, {"app.kubernetes.io/name": "ingress-nginx"}, "10.244.2.3")
    assert not network.connects(ingress, found["web"], WEB_PORT)
    assert not network.connects(found["worker"], API_SERVER, 443)


def test_monitoring_opens_the_metrics_ports_to_prometheus_alone(
    example: list[dict[str, Any]], pods: dict[str, Pod]
) -> None:
    extra = yaml.safe_load((REPO / "deploy" / "monitoring" / "networkpolicy.yaml").read_text())
    network = Network([*(o for o in example if o["kind"] == "NetworkPolicy"), extra], namespaces={})
    prometheus = Pod("prometheus-k8s-0", "monitoring", {"app.kubernetes.io/name": "prometheus"}, "10.244.5.5")
    assert network.connects(prometheus, pods["web"], WEB_PORT)
    for component in ("worker", "supervisor"):
        assert network.connects(prometheus, pods[component], METRICS_PORT), component
    assert not network.connects(prometheus, pods["redis"], REDIS_PORT)
    for attacker in (
        pods["training"],
        Pod("grafana", "monitoring", {"app.kubernetes.io/name": "grafana"}, "10.244.5.6"),
    ):
        assert not network.ingress_allows(attacker, pods["worker"], METRICS_PORT), attacker.name
