"""Which connections a set of Kubernetes NetworkPolicies allows, worked out from the manifests (the local
plane's pods have no network of their own, and np-guard's analyzer is not served by the Go module proxy here).

The semantics are networking.k8s.io/v1's: a pod is isolated for a direction when a policy of its namespace
selects it with that direction in its policyTypes (Ingress always, Egress when the policy says so or has
egress rules); an isolated pod allows what any selecting policy's rules allow (rules add up, nothing
subtracts); a connection needs the source's egress and the destination's ingress. A peer is a podSelector
(pods of the policy's namespace), a namespaceSelector (every pod of the matching namespaces), both (the pods
matching both), or an ipBlock. ipBlocks are matched against pods' addresses too, which some network plugins
do not do: the analysis can only find more connections than a cluster makes, never fewer."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: dict[str, str]
    ip: str
    ports: dict[str, int] = field(default_factory=dict)  # named container ports


@dataclass(frozen=True)
class Address:
    """Something outside the pod network: the API server, a webhook receiver, cloud metadata."""

    ip: str


Peer = Pod | Address


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector ({} selects everything)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


@dataclass
class Network:
    policies: list[dict[str, Any]]
    namespaces: dict[str, dict[str, str]]  # namespace -> labels

    def namespace_labels(self, name: str) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": name, **self.namespaces.get(name, {})}

    def _selecting(self, pod: Pod, direction: str) -> list[dict[str, Any]]:
        chosen = []
        for policy in self.policies:
            spec = policy["spec"]
            types = spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])
            if (
                policy["metadata"].get("namespace") == pod.namespace
                and direction in types
                and selects(spec.get("podSelector"), pod.labels)
            ):
                chosen.append(policy)
        return chosen

    def isolated(self, pod: Pod, direction: str) -> bool:
        return bool(self._selecting(pod, direction))

    def _peer_matches(self, peer: dict[str, Any], policy_namespace: str, other: Peer) -> bool:
        if "ipBlock" in peer:
            block = peer["ipBlock"]
            address = ipaddress.ip_address(other.ip)
            if address not in ipaddress.ip_network(block["cidr"]):
                return False
            return not any(address in ipaddress.ip_network(e) for e in block.get("except") or [])
        if not isinstance(other, Pod):
            return False
        if "namespaceSelector" in peer:
            if not selects(peer["namespaceSelector"], self.namespace_labels(other.namespace)):
                return False
        elif other.namespace != policy_namespace:
            return False
        return "podSelector" not in peer or selects(peer["podSelector"], other.labels)

    @staticmethod
    def _port_matches(
        ports: list[dict[str, Any]] | None, destination: Peer, port: int, protocol: str
    ) -> bool:
        if not ports:
            return True
        for entry in ports:
            if entry.get("protocol", "TCP") != protocol:
                continue
            wanted = entry.get("port")
            if wanted is None:
                return True
            if isinstance(wanted, str):
                if isinstance(destination, Pod) and destination.ports.get(wanted) == port:
                    return True
                continue
            if wanted <= port <= entry.get("endPort", wanted):
                return True
        return False

    def _allows(
        self, pod: Pod, direction: str, other: Peer, destination: Peer, port: int, protocol: str
    ) -> bool:
        policies = self._selecting(pod, direction)
        if not policies:
            return True
        rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
        for policy in policies:
            for rule in policy["spec"].get(rules_key) or []:
                peers = rule.get(peers_key)
                if peers and not any(self._peer_matches(p, pod.namespace, other) for p in peers):
                    continue
                if self._port_matches(rule.get("ports"), destination, port, protocol):
                    return True
        return False

    def ingress_allows(self, source: Peer, destination: Pod, port: int, protocol: str = "TCP") -> bool:
        return self._allows(destination, "Ingress", source, destination, port, protocol)

    def egress_allows(self, source: Pod, destination: Peer, port: int, protocol: str = "TCP") -> bool:
        return self._allows(source, "Egress", destination, destination, port, protocol)

    def connects(self, source: Peer, destination: Peer, port: int, protocol: str = "TCP") -> bool:
        """Both ends allow it (an Address end has no policy of its own)."""
        if isinstance(source, Pod) and not self.egress_allows(source, destination, port, protocol):
            return False
        return not isinstance(destination, Pod) or self.ingress_allows(source, destination, port, protocol)


def pods_of(objects: list[dict[str, Any]], first_ip: str = "10.244.0.10") -> list[Pod]:
    """The pods the workloads among `objects` run (one per Deployment, StatefulSet, DaemonSet or Job), with
    their template's labels and named ports, and made-up addresses in the pod network."""
    pods = []
    address = ipaddress.ip_address(first_ip)
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            continue
        template = obj["spec"]["template"]
        ports = {
            p["name"]: p["containerPort"]
            for c in template["spec"]["containers"]
            for p in c.get("ports") or []
            if "name" in p
        }
        pods.append(
            Pod(
                name=obj["metadata"]["name"],
                namespace=obj["metadata"]["namespace"],
                labels=dict(template["metadata"].get("labels") or {}),
                ip=str(address),
                ports=ports,
            )
        )
        address += 1
    return pods
