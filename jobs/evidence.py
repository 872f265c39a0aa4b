"""Which controller's Events dispatch takes as evidence. Pure.

An Event's reason alone proves nothing: anyone who may create Events in a namespace can write `FailedCreate`
about a job's Job, and supervision would fail the job `config-error` on it (status-facts §10). The Events
that decide a cause on their own count only when they come from the controller that writes them, named as
Kubernetes names it (`reportingController`, or the legacy `source.component`). The admission guard
(deploy/guard/doors.yaml, dispatch-evidence-from-its-reporter) lets only that controller's identity write an
Event in its name in a managed namespace; together the two close the door: a forged Event under another
reporter passes the door and is not read, one under the controller's name is refused at the door.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from cluster.logs import event_reporter

# reason -> the reporters whose Event of that reason is evidence (status-facts §5). The scheduler reports
# under its profile's name: `default-scheduler` unless a platform runs other profiles.
EVIDENCE_REPORTERS: Final[Mapping[str, frozenset[str]]] = {
    "FailedCreate": frozenset({"job-controller"}),
    "Preempted": frozenset({"default-scheduler"}),
    "Evicted": frozenset({"kubelet"}),
    # The taint-eviction controller reports under its own name since Kubernetes 1.29 (node-controller before).
    "TaintManagerEviction": frozenset({"taint-eviction-controller", "node-controller"}),
    "JobCreationFailed": frozenset({"jobset"}),
    "TrainJobResourcesCreationFailed": frozenset({"trainer-trainjob-controller"}),
}


def from_its_reporter(event: Mapping[str, Any]) -> bool:
    """False for an Event whose reason is evidence but whose reporter is not the controller that writes
    it; True for every other Event."""
    expected = EVIDENCE_REPORTERS.get(str(event.get("reason", "")))
    return expected is None or event_reporter(event) in expected


def reporter_accepted(reason: str, reporter: str) -> bool:
    """from_its_reporter for an Event already read into a row (cluster.logs.EventRow)."""
    expected = EVIDENCE_REPORTERS.get(reason)
    return expected is None or reporter in expected
