"""Identity findings: pods grouped by (attempt A, JobSet restart-attempt J, job index, rank). A container
restarted in place, or two pods for one rank within one (A, J), is a rank that ran twice under one identity.
Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
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


def ended_attempt_findings(
    remembered: Iterable[Mapping[str, Any]],
    new: Iterable[Mapping[str, Any]],
    *,
    attempt: int,
    ended_at: datetime | None,
    warned: bool,
) -> list[dict[str, Any]]:
    """Findings on attempt A after dispatch ended it, from the pods its memory holds (`remembered`) and pods
    of A the cluster shows that the memory does not (`new`, condensed): a rank of A that ran again (with
    the remembered pods, by the rule above), or a pod made after A ended (creationTimestamp, whole seconds,
    later than the second A ended in): a rank ran under A's identity after dispatch ended A. Only findings
    that name a new pod."""
    fresh = [p for p in new if p.get("attempt") == attempt]
    names = {str(p.get("name")) for p in fresh}
    findings = [
        f
        for f in identity_findings([*remembered, *fresh], warned=warned)
        if names.intersection(str(n) for n in f["pods"])
    ]
    named = {str(n) for f in findings for n in f["pods"]}
    ended_second = ended_at.replace(microsecond=0) if ended_at is not None else None
    for pod in fresh:
        created = _parse(pod.get("created"))
        if (
            str(pod.get("name")) in named
            or ended_second is None
            or created is None
            or created <= ended_second
        ):
            continue
        findings.append(
            {
                "rank": pod.get("rank"),
                "attempt": attempt,
                "restart_attempt": pod.get("restart_attempt") or 0,
                "pods": [pod.get("name")],
                "why": (
                    f"pod {pod.get('name')} (rank {pod.get('rank')}) was made at {pod.get('created')}, "
                    f"after attempt {attempt} ended"
                ),
                "expected": False,
            }
        )
    findings.sort(
        key=lambda f: (f["attempt"], f["restart_attempt"], f["rank"] if f["rank"] is not None else -1)
    )
    return findings


def _parse(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
