"""The Nodes a cycle reads (jobs.supervision.cycle): by name, only those the pods of an execution ran on, and
only once a pod is gone, being deleted or disrupted (only then can a node's loss explain it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cluster import gateway
from cluster.errors import ClusterError, NotFound
from cluster.where import on_cluster
from jobs.supervision.grouping import Grouped, Watched
from jobs.supervision.status import disrupted_pods_named, event_view, scheduled_node


def nodes_of_unread_disruptions(objects: Sequence[Mapping[str, Any]]) -> set[str]:
    """A disrupted pod gone before it was read, named by its Job's failure (a FailJob rule on
    DisruptionTarget): the node its Scheduled event names."""
    gone = {pod for _, _, pod in disrupted_pods_named(o for o in objects if o.get("kind") == "Job")}
    if not gone:
        return set()
    events = [event_view(o) for o in objects if o.get("kind") == "Event"]
    return {node for pod in gone if (node := scheduled_node(events, pod))}


def needs_nodes(
    objects: Iterable[Mapping[str, Any]], memory: Mapping[str, Any], dead: Sequence[Any]
) -> set[str]:
    """The nodes an execution's derivation needs: those its pods ran on, once a pod is gone, being deleted or
    disrupted (only then can a node's loss explain it). A running execution needs none. A pod the memory
    holds that is not among the objects is gone as of this cycle (the derivation marks it so, after this
    read): without its node, a pod deleted with its Job (the TrainJob deleted outside dispatch) read as lost
    with its node."""
    objects = list(objects)
    names = nodes_of_unread_disruptions(objects)
    needed = bool(dead) or bool(names)
    present: set[str] = set()
    for obj in objects:
        if obj.get("kind") != "Pod":
            continue
        meta = obj.get("metadata") or {}
        present.add(str(meta.get("uid") or ""))
        names.add(str((obj.get("spec") or {}).get("nodeName") or ""))
        conditions = (obj.get("status") or {}).get("conditions") or []
        if meta.get("deletionTimestamp") or any(c.get("type") == "DisruptionTarget" for c in conditions):
            needed = True
    for pod_uid, pod in memory.items():
        names.add(str(pod.get("node") or ""))
        if pod.get("gone") or pod.get("deleting") or pod.get("disruption") or pod_uid not in present:
            needed = True
    for pod in dead:
        names.add(str((pod.get("spec") or {}).get("nodeName") or ""))
    names.discard("")
    return names if needed else set()


def read_nodes(
    groups: Mapping[tuple[str, int], Grouped],
    watched: Sequence[Watched],
    dead: Mapping[tuple[str, int], Sequence[Any]],
) -> tuple[dict[str, dict[str, dict[str, Any]]], frozenset[str], dict[tuple[str, int], list[dict[str, Any]]]]:
    """Nodes by cluster ("" here; a MultiKueue worker's pods ran on its own nodes) and name, as the pods need
    them (get by name); the names that could not be read, and per execution the warnings naming them."""
    wanted = {w.key: needs_nodes(groups[w.key].objects, w.memory, dead.get(w.key, [])) for w in watched}
    clusters = {w.key: w.cluster for w in watched}
    per_cluster: dict[str, set[str]] = {}
    for key, names in wanted.items():
        per_cluster.setdefault(clusters[key], set()).update(names)
    nodes: dict[str, dict[str, dict[str, Any]]] = {}
    unread: dict[tuple[str, str], str] = {}
    for cluster, names in sorted(per_cluster.items()):
        with on_cluster(cluster):
            for name in sorted(names):
                try:
                    node = gateway.get_node(name)
                except NotFound:
                    continue
                except ClusterError as exc:
                    unread[(cluster, name)] = str(exc)
                    continue
                if node is not None:
                    nodes.setdefault(cluster, {})[name] = node
    errors = {
        key: [
            {
                "kind": "read",
                "object": f"Node {n}",
                "message": f"{unread[(clusters[key], n)]}: not judged for node loss",
            }
            for n in sorted(names)
            if (clusters[key], n) in unread
        ]
        for key, names in wanted.items()
        if any((clusters[key], n) in unread for n in names)
    }
    return nodes, frozenset(name for _, name in unread), errors


# ---------------------------------------------------------------- the derivation (pure)


def nodes_for(
    objects: Iterable[Mapping[str, Any]], memory: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]
) -> list[Any]:
    objects = list(objects)
    names = {str((o.get("spec") or {}).get("nodeName") or "") for o in objects if o.get("kind") == "Pod"}
    names |= {str(p.get("node") or "") for p in memory.values()}
    names |= nodes_of_unread_disruptions(objects)
    return [nodes[n] for n in sorted(names) if n and n in nodes]
