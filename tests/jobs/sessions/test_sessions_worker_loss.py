"""The pure decision about a session's lost MultiKueue worker (jobs.sessions.loss): which Workloads say the
worker is lost, what the session is told, and whether the Workload is still to be deactivated. No DB, no
cluster."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from jobs.naming import WORKER_LOST, kueue_mark_key
from jobs.sessions.loss import CLUSTER_LOST, WorkerLoss, loss_mark, worker_loss

DOMAIN = "dispatch.dev"
LOST_TEXT = f'Evicted due to AdmissionCheck in Retry state: "dispatch-multi" ({WORKER_LOST})'


def _workload(
    *,
    uid: str = "tj-1",
    controller: bool = True,
    active: bool = True,
    evicted: dict[str, Any] | None = None,
    mark: dict[str, Any] | None = None,
    cluster: str = "",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "namespace": "default",
        "name": "trainjob-s1-abcde",
        "uid": "wl-uid",
        "ownerReferences": [{"kind": "TrainJob", "uid": uid, "controller": controller}],
    }
    if mark is not None:
        meta["annotations"] = {kueue_mark_key(DOMAIN): json.dumps(mark)}
    status: dict[str, Any] = {"conditions": [{"type": "Evicted", **evicted}] if evicted else []}
    if cluster:
        status["clusterName"] = cluster
    return {"metadata": meta, "spec": {"active": active}, "status": status}


def _loss(*workloads: dict[str, Any]) -> WorkerLoss | None:
    return worker_loss(list(workloads), trainjob_uid="tj-1", label_domain=DOMAIN, worker="worker-2")


def test_an_eviction_for_the_lost_worker_ends_the_session_naming_it_and_asks_for_the_deactivation() -> None:
    loss = _loss(_workload(evicted={"status": "True", "reason": "AdmissionCheck", "message": LOST_TEXT}))
    assert loss is not None
    assert "worker worker-2 was lost" in loss.message and WORKER_LOST in loss.message
    assert "Workload default/trainjob-s1-abcde Evicted AdmissionCheck" in loss.evidence
    assert loss.workload == {"namespace": "default", "name": "trainjob-s1-abcde", "uid": "wl-uid"}


def test_an_eviction_kueue_already_followed_by_an_admission_elsewhere_is_still_the_loss() -> None:
    # Kueue admitted it again on the other worker before dispatch looked: Evicted reads False "Previously".
    previously = {"status": "False", "reason": "Admitted", "message": f"Previously: {LOST_TEXT}"}
    loss = _loss(_workload(evicted=previously, cluster="worker-1"))
    assert loss is not None and loss.workload is not None


def test_dispatchs_own_mark_is_the_decision_made_before_and_an_inactive_workload_needs_nothing() -> None:
    first = _loss(_workload(evicted={"status": "True", "reason": "AdmissionCheck", "message": LOST_TEXT}))
    assert first is not None
    mark = loss_mark(first, worker="worker-2", now=datetime(2026, 12, 4, tzinfo=UTC))
    assert mark["cause"] == CLUSTER_LOST and mark["worker"] == "worker-2"
    # Deactivated: Kueue's eviction now reads Deactivated, the mark keeps what was decided.
    again = _loss(_workload(active=False, mark=mark, evicted={"status": "True", "reason": "Deactivated"}))
    assert again == WorkerLoss(first.message, first.evidence, None)
    # Somebody made it active again: deactivated again.
    redo = _loss(_workload(active=True, mark=mark))
    assert redo is not None and redo.workload is not None


def test_no_loss_without_kueues_word_or_on_somebody_elses_workload() -> None:
    assert _loss() is None
    assert _loss(_workload()) is None  # admitted, running
    assert _loss(_workload(evicted={"status": "True", "reason": "Preempted", "message": "preempted"})) is None
    # dispatch deactivated it for a close: not a loss.
    assert _loss(_workload(active=False, mark={"cause": "closed", "by": "dispatch"})) is None
    lost = {"status": "True", "reason": "AdmissionCheck", "message": LOST_TEXT}
    assert _loss(_workload(uid="tj-2", evicted=lost)) is None  # another TrainJob's
    assert _loss(_workload(controller=False, evicted=lost)) is None  # merely owned
    assert worker_loss([_workload(evicted=lost)], trainjob_uid="", label_domain=DOMAIN, worker="w") is None
