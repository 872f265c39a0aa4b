"""Pod tombstones: the last state of a pod of an active execution that a watch saw deleted (PodTombstone).

One pod can be delivered deleted more than once, and not always newest last: the informer's periodic re-list
reports a pod the watch has not yet said is gone in its last state seen (say Running, no DisruptionTarget),
and the watch then delivers the deletion with the eviction's DisruptionTarget; two supervisors each write
what their own watch saw. One tombstone is kept per (execution, pod uid), and `supersedes` (pure) decides
which: the one carrying a DisruptionTarget condition (often the only evidence of a preemption, eviction or
lost node), else the one with the newer resourceVersion. A replaced tombstone is deleted and the new one
written as a new row (a new id): a cycle that read the old one and commits deletes only the ids it used
(jobs.supervision.apply), never the newer one it did not see."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction

from cluster.informer import uid_of, version_of
from jobs.models import Execution, JobState, PodTombstone
from jobs.supervision.apply import SUPERVISED

# The states of an execution whose pods' tombstones a cycle may still use: supervised, or being started (a
# rank can go between the TrainJob's create and the start's record). The watch writes tombstones only for
# these, and the full re-read deletes those of any other.
TOMBSTONE_STATES = frozenset({*SUPERVISED, JobState.PENDING})


def disrupted(pod: Mapping[str, Any]) -> bool:
    """The pod carries a DisruptionTarget condition that is True."""
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in conditions)


def newer_version(candidate: str, kept: str) -> bool:
    """`candidate` is a newer resourceVersion than `kept`. The API calls resourceVersions opaque, but etcd's
    are its revision, an integer that only grows: compared as integers when both are decimal. Otherwise
    nothing says which is newer, and the one kept stays."""
    if candidate.isdecimal() and kept.isdecimal():
        return int(candidate) > int(kept)
    return False


def supersedes(candidate: Mapping[str, Any], kept: Mapping[str, Any]) -> bool:
    """The tombstone `candidate` replaces `kept` (the same pod): it has a DisruptionTarget and `kept` has
    none, or neither or both have one and its resourceVersion is newer. A tie keeps `kept`."""
    if disrupted(candidate) != disrupted(kept):
        return disrupted(candidate)
    return newer_version(version_of(candidate), version_of(kept))


def keep_tombstones(dead: Sequence[tuple[int, dict[str, Any]]]) -> None:
    """Write the tombstones of executions still supervised, or being started (a rank can go between the
    TrainJob's create and the start's record); those of an execution whose status left supervision
    (finished, retried, cancelled) are dropped, since no cycle would ever use them. The executions' rows are
    locked (in primary-key order) while the rows go in, so a status write that ends an execution (it locks
    the row and deletes its tombstones) comes wholly before or wholly after, no tombstone outlives its
    execution's supervision, and two writers of one execution's tombstones take turns. Of two deliveries
    of one pod, the one `supersedes` prefers is kept, whichever came first."""
    with transaction.atomic():
        live = set(
            Execution.objects.select_for_update(no_key=True)
            .filter(pk__in={pk for pk, _ in dead}, state__in=TOMBSTONE_STATES)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        best: dict[tuple[int, str], dict[str, Any]] = {}
        for pk, pod in dead:
            if pk not in live:
                continue
            key = (pk, uid_of(pod)[:64])
            if key not in best or supersedes(pod, best[key]):
                best[key] = pod
        if not best:
            return
        kept = PodTombstone.objects.filter(
            execution_id__in={pk for pk, _ in best}, pod_uid__in={uid for _, uid in best}
        ).values_list("pk", "execution_id", "pod_uid", "pod")
        replaced: list[int] = []
        for row, execution_id, pod_uid, pod in kept:
            key = (execution_id, pod_uid)
            if key not in best:
                continue
            if supersedes(best[key], pod):
                replaced.append(row)
            else:
                del best[key]
        PodTombstone.objects.filter(pk__in=replaced).delete()
        PodTombstone.objects.bulk_create(
            [PodTombstone(execution_id=pk, pod_uid=uid, pod=pod) for (pk, uid), pod in best.items()],
            ignore_conflicts=True,
        )
