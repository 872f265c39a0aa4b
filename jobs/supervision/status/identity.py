"""Identity findings: pods grouped by (attempt A, JobSet restart-attempt J, job index, rank). A container
restarted in place, or two pods for one rank within one (A, J), is a rank that ran twice under one identity.
Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def identity_findings(pods: Iterable[Mapping[str, Any]], *, warned: bool) -> list[dict[str, Any]]:
    """Ranks that ran twice under one identity (A, J, rank): a container restarted in place, or two pods."""
    groups: dict[tuple[int, int, int, int], list[Mapping[str, Any]]] = {}
    findings: list[dict[str, Any]] = []
    for pod in pods:
        rank = pod.get("rank")
        if rank is None:
            continue
        key = (pod.get("attempt") or 0, pod.get("restart_attempt") or 0, pod.get("job_index") or 0, rank)
        groups.setdefault(key, []).append(pod)
        for row in [*pod.get("containers", []), *pod.get("init_containers", [])]:
            if row.get("sidecar"):
                continue
            if row.get("restarts", 0) > 0 or row.get("last_terminated"):
                findings.append(
                    {
                        "rank": rank,
                        "attempt": key[0],
                        "restart_attempt": key[1],
                        "pods": [pod.get("name")],
                        "why": (
                            f"container {row['name']} of pod {pod.get('name')} restarted in place "
                            f"(restartCount {row.get('restarts', 0)}"
                            + (
                                f", previous run {row['last_terminated']}"
                                if row.get("last_terminated")
                                else ""
                            )
                            + ")"
                        ),
                        "expected": warned,
                    }
                )
    for (attempt, restart, _job_index, rank), members in sorted(groups.items()):
        if len(members) > 1:
            names = [str(p.get("name")) for p in sorted(members, key=lambda p: p.get("created") or "")]
            findings.append(
                {
                    "rank": rank,
                    "attempt": attempt,
                    "restart_attempt": restart,
                    "pods": names,
                    "why": (
                        f"{len(names)} pods ran rank {rank} in attempt {attempt}, restart-attempt {restart}"
                    ),
                    "expected": warned,
                }
            )
    for finding in findings:
        if warned:
            finding["why"] += " (expected: the plan's allowRankRestart identity warning)"
    findings.sort(key=lambda f: (f["attempt"], f["restart_attempt"], f["rank"]))
    return findings


# ---------------------------------------------------------------- the derivation
