"""Status derivation from real Kueue v0.19.2 objects (tests/jobs/supervision/kueue-fixtures, recorded by
tests/scripts/test_kueue_plane.py): an eviction ends the attempt, dispatch's own deactivation is recognised by
its mark, a user's is a cancellation, and a waiting Workload says why. Pure: no cluster, no database."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobs.supervision import status as st

FIXTURES = Path(__file__).parent / "kueue-fixtures"
NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
MARK = "dispatch.dev/kueue-deactivated"


def objects(name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads((FIXTURES / f"{name}.json").read_text())["items"]
    return copy.deepcopy(items)


def derive(items: list[dict[str, Any]]) -> st.DerivedStatus:
    return st.derive(items, st.Context(now=NOW, attempt=1))


def workload(items: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in items if o["kind"] == "Workload")


def test_a_preempted_workload_ends_the_attempt_preempted_and_asks_for_its_deactivation() -> None:
    items = objects("preempted")
    wl = workload(items)
    status = derive(items)
    assert (status.state, status.cause, status.stop) == (st.FAILED, st.PREEMPTED, True)
    fields = [(e["field"], str(e["value"]).split(":")[0]) for e in status.evidence]
    assert fields[:2] == [
        ("status.conditions[Evicted]", "Preempted"),
        ("status.conditions[Preempted]", "InClusterQueue"),
    ]
    assert "by workload UID 1b717cfe-7cfd-4b23-a236-ab4c60e6ff73" in status.message
    assert "due to prioritization in the ClusterQueue" in status.message
    act = status.deactivate or {}
    assert (act["namespace"], act["name"], act["uid"], act["key"]) == (
        wl["metadata"]["namespace"],
        wl["metadata"]["name"],
        wl["metadata"]["uid"],
        MARK,
    )
    assert act["mark"]["cause"] == st.PREEMPTED
    assert act["mark"]["evicted"]["reason"] == "Preempted"
    assert act["mark"]["preempted"]["reason"] == "InClusterQueue"


def test_dispatchs_own_deactivation_reads_as_the_recorded_cause_not_a_cancellation() -> None:
    """A second supervisor reads the Workload after the first deactivated it: spec.active false, Evicted
    now `Deactivated` (as Kueue writes it on an admitted Workload), and dispatch's mark: still preempted, with
    the original conditions as evidence, and nothing left to do."""
    first = derive(objects("preempted"))
    mark = {**(first.deactivate or {})["mark"], "at": "2026-12-01T08:49:32+00:00"}
    items = objects("deactivated-by-user")  # Evicted=True Deactivated, spec.active false
    wl = workload(items)
    wl["metadata"].setdefault("annotations", {})[MARK] = json.dumps(mark)
    status = derive(items)
    assert (status.state, status.cause, status.stop) == (st.FAILED, st.PREEMPTED, True)
    assert status.deactivate is None
    assert status.message == first.message
    assert any(e["field"] == f"metadata.annotations[{MARK}]" for e in status.evidence)
    assert any(str(e["value"]).startswith("Preempted: Preempted to accommodate") for e in status.evidence)


def test_a_marked_workload_made_active_again_is_deactivated_again() -> None:
    first = derive(objects("preempted"))
    items = objects("preempted")
    wl = workload(items)
    wl["metadata"]["annotations"] = {MARK: json.dumps((first.deactivate or {})["mark"])}
    assert wl["spec"]["active"] is True
    assert (derive(items).deactivate or {}).get("uid") == wl["metadata"]["uid"]


def test_a_mark_in_another_label_domain_is_not_dispatchs() -> None:
    items = objects("deactivated-by-user")
    workload(items)["metadata"]["annotations"] = {
        "other.example/kueue-deactivated": json.dumps({"cause": "preempted"})
    }
    status = derive(items)
    assert (status.state, status.cause) == (st.CANCELLED, st.CANCELLED)


def test_a_workload_a_user_deactivated_is_cancelled_outside_dispatch() -> None:
    status = derive(objects("deactivated-by-user"))
    assert (status.state, status.cause, status.deactivate) == (st.CANCELLED, st.CANCELLED, None)
    assert "deactivated outside dispatch" in status.message


def test_a_pods_ready_timeout_ends_the_attempt_evicted() -> None:
    status = derive(objects("pods-ready-timeout"))
    assert (status.state, status.cause, status.stop) == (st.FAILED, st.EVICTED, True)
    assert str(status.evidence[0]["value"]).startswith("PodsReadyTimeout: Exceeded the PodsReady timeout")
    assert (status.deactivate or {})["mark"]["cause"] == st.EVICTED


def test_kueues_own_deactivation_is_evicted_with_nothing_left_to_do() -> None:
    status = derive(objects("requeuing-limit-exceeded"))
    assert (status.state, status.cause, status.deactivate) == (st.FAILED, st.EVICTED, None)


def test_readmitted_after_an_eviction_dispatch_missed_still_ends_the_attempt() -> None:
    """Evicted and Preempted read False "Previously: ..." after re-admission; schedulingStats.evictions
    still counts the preemption: the same TrainJob's ranks ran again, so the attempt ends preempted."""
    status = derive(objects("readmitted-after-preemption"))
    assert (status.state, status.cause, status.stop) == (st.FAILED, st.PREEMPTED, True)
    assert any(e["field"] == "status.schedulingStats.evictions" for e in status.evidence)
    assert status.deactivate is not None


def test_a_workload_waiting_for_quota_says_so_with_its_queue() -> None:
    status = derive(objects("pending-insufficient-quota"))
    assert (status.state, status.cause) == (st.QUEUED, None)
    reason = status.queued_reason
    assert (reason["reason"], reason["local_queue"]) == ("awaiting-quota", "dispatch")
    assert reason["workload"] == workload(objects("pending-insufficient-quota"))["metadata"]["name"]
    assert (
        "insufficient unused quota for nvidia.com/gpu in flavor dispatch-kwok, 2 more needed"
        in reason["message"]
    )


def test_a_pending_workload_without_a_quota_condition_waits_for_quota() -> None:
    status = derive(objects("pending-equivalent-no-condition"))
    assert status.queued_reason["reason"] == "awaiting-quota"


# ---------------------------------------------------------------- Workloads Kueue will never run


def _pending_with(condition: dict[str, Any]) -> list[dict[str, Any]]:
    """The recorded pending job, its Workload's condition of that type replaced (or added)."""
    items = objects("pending-insufficient-quota")
    wl = workload(items)
    kept = [c for c in wl["status"]["conditions"] if c["type"] != condition["type"]]
    wl["status"]["conditions"] = [*kept, condition]
    return items


def test_a_workload_kueue_could_not_start_ends_the_job_config_error() -> None:
    """Kueue admitted it, could not unsuspend the TrainJob for a permanent reason, and marked the Workload
    Finished FailedToStart [Q: jobframework/reconciler.go]: nothing will ever run it. Was: `queued` for
    ever."""
    items = _pending_with(
        {
            "type": "Finished",
            "status": "True",
            "reason": "FailedToStart",
            "message": "invalid podSetsInfo: expecting 1 podset, got 2",
            "lastTransitionTime": "2026-12-01T08:50:00Z",
        }
    )
    status = derive(items)
    assert (status.state, status.cause, status.stop) == (st.FAILED, st.CONFIG_ERROR, True)
    assert "Kueue could not start the TrainJob and gave up: invalid podSetsInfo" in status.message
    assert [e["field"] for e in status.evidence] == ["status.conditions[Finished]"]
    assert status.evidence[0]["value"].startswith("FailedToStart: ")


def test_an_inadmissible_workload_waits_then_ends_the_job_config_error() -> None:
    """QuotaReserved=False Inadmissible (its ClusterQueue is missing [Q: core/workload_controller.go]): the
    job is queued with Kueue's words until INADMISSIBLE_AFTER_SECONDS, then fails config-error and dispatch
    stops it. Was: `queued` for ever."""
    since = "2026-12-01T08:57:00Z"  # 3 minutes before NOW
    items = _pending_with(
        {
            "type": "QuotaReserved",
            "status": "False",
            "reason": "Inadmissible",
            "message": "ClusterQueue gone-queue is terminating or missing",
            "lastTransitionTime": since,
        }
    )
    waiting = derive(items)
    assert (waiting.state, waiting.queued_reason["reason"]) == (st.QUEUED, "inadmissible")
    assert waiting.recheck_at == datetime(2026, 12, 1, 9, 2, tzinfo=UTC)  # since + 300 s
    ended = st.derive(items, st.Context(now=datetime(2026, 12, 1, 9, 2, tzinfo=UTC), attempt=1))
    assert (ended.state, ended.cause, ended.stop) == (st.FAILED, st.CONFIG_ERROR, True)
    assert ended.message == (
        "Kueue could not admit the Workload for 300 s: ClusterQueue gone-queue is terminating or missing"
    )
    assert ended.evidence[0]["field"] == "status.conditions[QuotaReserved]"


def test_a_stopped_queue_and_plain_waiting_for_quota_never_end_the_job() -> None:
    """A queue the platform team stopped is a hold it can lift, and quota may free up: both wait, however
    long."""
    late = st.Context(now=datetime(2026, 12, 31, tzinfo=UTC), attempt=1)
    stopped = _pending_with(
        {
            "type": "QuotaReserved",
            "status": "False",
            "reason": "Inadmissible",
            "message": "ClusterQueue dispatch is stopped",
            "lastTransitionTime": "2026-12-01T08:49:04Z",
        }
    )
    assert st.derive(stopped, late).state == st.QUEUED
    assert st.derive(objects("pending-insufficient-quota"), late).state == st.QUEUED


def test_a_multikueue_worker_lost_ends_the_attempt_cluster_lost() -> None:
    """The manager's Workload when its admitting worker stayed unreachable past workerLostTimeout: the
    MultiKueue check went Retry "Admitting remote lost" and Kueue evicted the Workload for it (kueue v0.19.2
    pkg/controller/admissionchecks/multikueue/workload.go, pkg/controller/core/workload_controller.go). The
    recorded PodsReady-timeout Workload, its Evicted condition rewritten to that eviction (a fixture recorded
    on the MultiKueue planes is still to come)."""
    items = objects("pods-ready-timeout")
    evicted = next(c for c in workload(items)["status"]["conditions"] if c["type"] == "Evicted")
    evicted["reason"] = "AdmissionCheck"
    evicted["message"] = (
        'Evicted due to AdmissionCheck in Retry state: "dispatch-multi" (Admitting remote lost)'
    )
    status = derive(items)
    assert (status.state, status.cause, status.stop) == (st.FAILED, st.CLUSTER_LOST, True)
    assert "Admitting remote lost" in str(status.evidence[0]["value"])
    assert (status.deactivate or {})["mark"]["cause"] == st.CLUSTER_LOST  # re-admission is refused

    evicted["message"] = 'Evicted due to AdmissionCheck in Retry state: "provisioning" (capacity not ready)'
    assert derive(items).cause == st.EVICTED  # another check's retry is no lost cluster


def test_the_worker_kueue_admitted_the_attempt_to_is_read_from_its_workload() -> None:
    items = objects("pods-ready-timeout")
    assert derive(items).cluster == ""  # not MultiKueue
    workload(items)["status"]["clusterName"] = "worker-2"
    assert derive(items).cluster == "worker-2"
