"""Supervision's acts on Kueue in a cycle (jobs.supervision.cycle): the queue positions of the executions
waiting for quota, read from the visibility API once per LocalQueue, and the deactivation of the Workloads an
eviction ended (status-facts §12), with dispatch's mark, before the failure is written."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from datetime import timedelta

from django.utils import timezone

from cluster import kueue
from cluster.errors import ClusterError
from jobs.supervision.status import DerivedStatus

logger = logging.getLogger(__name__)

QUEUED_FOR_QUOTA = ("awaiting-quota", "inadmissible")
POSITION_RECHECK_SECONDS = 10.0
# A deactivation the API server refuses (not an outage: a webhook, a policy, RBAC) this many cycles in a row
# stops holding the failure back: it is applied, and deleting the TrainJob takes the Workload with it.
DEACTIVATE_TRIES = 5

_refused: dict[tuple[str, int], int] = {}  # refusals in a row, per execution, in this process
_refused_lock = threading.Lock()


def queue_positions(statuses: Mapping[tuple[str, int], DerivedStatus]) -> None:
    """The queue position of each execution waiting in a Kueue LocalQueue, from the visibility API: one call
    per LocalQueue that has such executions this cycle, never one per job. Stored in its queued_reason
    (`position`: 1 is the next to be admitted in the LocalQueue; `position_in_cluster_queue` likewise). A
    read that fails leaves the position out and says so among the warnings."""
    waiting: dict[tuple[str, str], list[DerivedStatus]] = {}
    for status in statuses.values():
        reason = status.queued_reason
        if status.state != "queued" or reason.get("reason") not in QUEUED_FOR_QUOTA:
            continue
        namespace = str(reason.get("namespace") or "")
        local_queue = str(reason.get("local_queue") or "")
        if namespace and local_queue and reason.get("workload"):
            waiting.setdefault((namespace, local_queue), []).append(status)
    for (namespace, local_queue), group in sorted(waiting.items(), key=lambda pair: pair[0]):
        try:
            pending = {p.name: p for p in kueue.pending_workloads(namespace, local_queue)}
        except ClusterError as exc:
            for status in group:
                status.warnings.append(
                    {
                        "kind": "read",
                        "object": f"LocalQueue {namespace}/{local_queue} (pending workloads)",
                        "message": f"{exc}: the queue position is not known",
                    }
                )
            continue
        for status in group:
            found = pending.get(str(status.queued_reason.get("workload")))
            if found is None:
                continue
            status.queued_reason = {
                **status.queued_reason,
                "position": found.position_in_local_queue + 1,
                "position_in_cluster_queue": found.position_in_cluster_queue + 1,
            }
            # Positions move when other jobs are admitted, with no object of this one changing.
            recheck = timezone.now() + timedelta(seconds=POSITION_RECHECK_SECONDS)
            status.recheck_at = min(status.recheck_at or recheck, recheck)


def deactivate_evicted(
    statuses: Mapping[tuple[str, int], DerivedStatus],
) -> tuple[set[tuple[str, int]], list[str]]:
    """Deactivate the Kueue Workloads the derivation says must be (an eviction ended the attempt), with
    dispatch's mark, before the failure is written and the TrainJob deleted: Kueue can then never resume
    that TrainJob. The keys whose status may be applied: all but those whose Workload could not be
    deactivated (left for the next cycle), and what failed. A Workload the API server refuses to deactivate
    DEACTIVATE_TRIES cycles in a row (refused, not unreachable) holds the failure back no longer: it is
    applied with a warning naming the refusal, since deleting the TrainJob takes its Workload with it (and
    the admission guard refuses to admit an evicted dispatch Workload again meanwhile)."""
    ok = set(statuses)
    errors: list[str] = []
    for key, status in statuses.items():
        act = status.deactivate
        if not act:
            continue
        mark = {**(act.get("mark") or {}), "at": timezone.now().isoformat()}
        try:
            outcome = kueue.deactivate_workload(
                namespace=str(act["namespace"]),
                name=str(act["name"]),
                uid=str(act.get("uid") or ""),
                annotations={str(act["key"]): json.dumps(mark, sort_keys=True)},
            )
        except ClusterError as exc:
            errors.append(f"deactivating {exc}")
            tries = _note_refused(key) if not exc.transient else 0
            if tries < DEACTIVATE_TRIES:
                ok.discard(key)
                continue
            _forget_refused(key)
            status.warnings.append(
                {
                    "kind": "kueue",
                    "object": f"Workload {act['namespace']}/{act['name']}",
                    "message": f"could not be deactivated ({tries} tries, each refused: {exc}); the failure "
                    "is applied without it: deleting the TrainJob takes the Workload with it",
                }
            )
            continue
        _forget_refused(key)
        logger.info(
            "supervision: Workload %s/%s %s (%s)", act["namespace"], act["name"], outcome, status.cause
        )
    return ok, errors


def _note_refused(key: tuple[str, int]) -> int:
    with _refused_lock:
        _refused[key] = _refused.get(key, 0) + 1
        return _refused[key]


def _forget_refused(key: tuple[str, int]) -> None:
    with _refused_lock:
        _refused.pop(key, None)
