"""jobs.supervision.derive_all: how a cycle merges what the pod watch saw with what earlier cycles remembered.

The race it guards: an evicted pod vanishes between two reads, so a cycle remembers it as gone without its
DisruptionTarget; the watch's DELETED event then brings the pod's last state, which must still explain the
failure (status-facts §1.2: EvictionByEvictionAPI, then a DELETE)."""

from __future__ import annotations

import gc
from datetime import UTC, datetime
from typing import Any

import pytest

from jobs.supervision.cycle import Watched, derive_all
from jobs.supervision.grouping import StaticIndex
from jobs.supervision.status import condense_pod
from jobs.waits import Thresholds

NS, JOB, NAME = "team", "jabcdefghij", "jabcdefghij-1"
LABELS = {"dispatch.dev/job": JOB, "dispatch.dev/attempt": "1"}


def _owner(kind: str, name: str) -> dict[str, Any]:
    return {"ownerReferences": [{"kind": kind, "name": name, "uid": f"uid-{name}", "controller": True}]}


def _pod(disrupted: bool) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if disrupted:
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
                "lastTransitionTime": "2026-11-30T10:00:05Z",
            }
        )
    return {
        "kind": "Pod",
        "metadata": {
            "name": f"{NAME}-node-0-1-abcde",
            "namespace": NS,
            "uid": "pod-1",
            **_owner("Job", f"{NAME}-node-0"),
            "labels": {
                **LABELS,
                "batch.kubernetes.io/job-completion-index": "1",
                "jobset.sigs.k8s.io/restart-attempt": "0",
            },
            **({"deletionTimestamp": "2026-11-30T10:00:05Z"} if disrupted else {}),
        },
        "spec": {"nodeName": "kwok-node-0"},
        "status": {"phase": "Running", "conditions": conditions},
    }


def _observed() -> StaticIndex:
    meta = {"namespace": NS, "labels": LABELS}
    failed_job = {
        "kind": "Job",
        "metadata": {
            **meta,
            "name": f"{NAME}-node-0",
            "uid": f"uid-{NAME}-node-0",
            **_owner("JobSet", NAME),
            "labels": {**LABELS, "jobset.sigs.k8s.io/restart-attempt": "0"},
        },
        "status": {
            "failed": 1,
            "conditions": [
                {
                    "type": "FailureTarget",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                }
            ],
        },
    }
    trainjob = {"kind": "TrainJob", "metadata": {**meta, "name": NAME, "uid": f"uid-{NAME}"}, "status": {}}
    jobset = {
        "kind": "JobSet",
        "metadata": {**meta, "name": NAME, "uid": f"uid-{NAME}", **_owner("TrainJob", NAME)},
        "status": {"restarts": 0},
    }
    return StaticIndex([trainjob, jobset, failed_job], ["dispatch.dev"])


NODES = [{"kind": "Node", "metadata": {"name": "kwok-node-0"}, "status": {"conditions": []}}]


def _cycle_after_the_pod_was_found_gone(tombstones: list[dict[str, Any]]) -> Any:
    """A cycle after an earlier one remembered the pod as gone, without its DisruptionTarget."""
    remembered = condense_pod(_pod(disrupted=False), "dispatch.dev") | {"gone": "2026-11-30T10:00:06Z"}
    watched = [
        Watched(
            key=(JOB, 1),
            namespace=NS,
            trainjob_name=NAME,
            memory={"pod-1": remembered},
            identity_warned=False,
        )
    ]
    statuses = derive_all(
        _observed(),
        watched,
        now=datetime(2026, 11, 30, 10, 0, 8, tzinfo=UTC),
        thresholds=Thresholds(),
        tombstones={(JOB, 1): tombstones},
        nodes=NODES,
    )
    return statuses[(JOB, 1)]


def test_a_watched_deletion_explains_a_pod_an_earlier_cycle_already_found_gone() -> None:
    status = _cycle_after_the_pod_was_found_gone([_pod(disrupted=True)])
    assert (status.state, status.cause, status.rank) == ("failed", "evicted", 1)
    assert status.pods["pod-1"]["gone"] == "2026-11-30T10:00:06Z"  # when it was first found gone is kept


def test_without_the_watch_the_same_failure_has_no_explanation() -> None:
    status = _cycle_after_the_pod_was_found_gone([])
    assert (status.state, status.cause) == ("failed", "unknown-failure")


def test_the_garbage_collector_runs_again_after_a_cycle_even_one_that_raised() -> None:
    """derive_all pauses the cyclic collector while it derives (a fifth of a 5,000-job cycle went to
    collections): a worker must not be left without it, whether the derivation ends or raises."""
    assert gc.isenabled()
    derive_all(_observed(), [], now=datetime.now(UTC), thresholds=Thresholds())
    assert gc.isenabled()
    broken = [Watched(key=(JOB, 1), namespace=NS, trainjob_name=NAME, memory=None, identity_warned=False)]  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        derive_all(_observed(), broken, now=datetime.now(UTC), thresholds=Thresholds())
    assert gc.isenabled()
