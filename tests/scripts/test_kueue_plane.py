"""Kueue v0.19.2 really queues, admits, preempts and evicts TrainJobs on the local control plane.

Raw TrainJobs on dispatch-kind, created with the tests' own client (no dispatch code), in a LocalQueue of the
test's own namespace on a ClusterQueue of its own with the shared queue's quota (cpu 4, memory 16Gi,
nvidia.com/gpu 2; preemption withinClusterQueue LowerPriority; scripts/k8s/kueue-queues.yaml). Kueue runs
with waitForPodsReady timeout 15 s, requeue backoff 1 s, backoffLimitCount 1 (scripts/cluster kueue_config).
KWOK plays the kubelet: pods become Running and Ready at once, then follow their env vars
(scripts/k8s/kwok-stages.yaml).

With DISPATCH_RECORD_KUEUE_FIXTURES=1 the tests also write the objects they saw to
tests/jobs/supervision/kueue-fixtures/ (see the README there).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from tests.support.cluster import Kube, KueueQueue
from tests.support.kueue import (
    JOBSET,
    KUEUE,
    KUEUE_MANAGER,
    Recorder,
    admitted,
    as_list,
    condition,
    conditions_summary,
    get_trainjob,
    is_true,
    pending_workloads,
    present,
    queued_trainjob,
    record_fixture,
    running_pods,
    to_dict,
    trainjob_pods,
    wait_for,
    wait_workload,
    workload_name,
    workload_of,
)

pytestmark = pytest.mark.cluster

PODS_READY_TIMEOUT = 15  # seconds; scripts/cluster KUEUE_PODS_READY_TIMEOUT
# Kueue's flavor assigner when a 2-GPU TrainJob meets a ClusterQueue whose 2 GPUs are taken.
QUOTA_MESSAGE = (
    "couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu in flavor "
    "dispatch-kwok, 2 more needed"
)


def kueue_patch(trainjob: dict[str, Any]) -> dict[str, Any]:
    """Kueue's runtimePatch without its ``time`` (which the Trainer's webhook stamps on each change)."""
    (patch,) = [p for p in trainjob["spec"].get("runtimePatches") or [] if p["manager"] == KUEUE_MANAGER]
    return {k: v for k, v in patch.items() if k != "time"}


def seconds_between(earlier: dict[str, Any] | None, later: dict[str, Any] | None) -> float:
    """Seconds between two conditions' lastTransitionTime."""
    assert earlier and later, (earlier, later)
    parse = lambda c: datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00"))  # noqa: E731
    return (parse(later) - parse(earlier)).total_seconds()


def test_queued_trainjob_is_suspended_by_the_webhook_then_admitted_runs_and_succeeds(
    kube: Kube, kueue_queue: KueueQueue
) -> None:
    ns = kueue_queue.namespace
    created = queued_trainjob(kube, kueue_queue, "first", env={"KWOK_RUN_DURATION": "2s"})

    # Kueue's mutating webhook: suspended at creation, with an (empty) runtimePatch owned by Kueue.
    assert created["spec"]["suspend"] is True
    assert kueue_patch(created) == {
        "manager": KUEUE_MANAGER,
        "trainingRuntimeSpec": {"template": {"spec": {}}},
    }

    wl = wait_workload(kube, created, admitted, "QuotaReserved and Admitted")
    uid = created["metadata"]["uid"]
    assert wl["metadata"]["name"] == workload_name("first", uid)
    assert wl["spec"]["queueName"] == kueue_queue.name
    assert wl["status"]["admission"]["clusterQueue"] == kueue_queue.cluster_queue
    assert (
        present(wl, "QuotaReserved")["message"]
        == f"Quota reserved in ClusterQueue {kueue_queue.cluster_queue}"
    )
    ((podset,),) = [wl["status"]["admission"]["podSetAssignments"]]
    assert (podset["name"], podset["count"]) == ("node", 2)
    assert podset["flavors"] == {"cpu": "dispatch-kwok", "memory": "dispatch-kwok"}
    assert podset["resourceUsage"] == {"cpu": "200m", "memory": "64Mi"}

    pods = wait_for("both pods Running", lambda: running_pods(kube, ns, "first", 2))
    # Admission unsuspended the TrainJob and filled Kueue's runtimePatch: the flavor's nodeLabels as a
    # nodeSelector, the Workload's name as a pod annotation.
    trainjob = get_trainjob(kube, ns, "first")
    assert trainjob["spec"]["suspend"] is False
    ((rjob,),) = [kueue_patch(trainjob)["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]
    assert rjob["name"] == "node"
    pod_patch = rjob["template"]["spec"]["template"]
    assert pod_patch["spec"]["nodeSelector"] == {"type": "kwok"}
    assert pod_patch["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == wl["metadata"]["name"]
    for pod in pods:
        assert pod.spec.node_selector == {"type": "kwok"}
        assert pod.metadata.annotations["kueue.x-k8s.io/workload"] == wl["metadata"]["name"]
    running_wl = wait_workload(kube, created, lambda w: is_true(w, "PodsReady", "Started"), "PodsReady=True")
    record_fixture("admitted-running", as_list(get_trainjob(kube, ns, "first"), running_wl))

    finished = wait_workload(kube, created, lambda w: is_true(w, "Finished"), "Finished=True")
    assert present(finished, "Finished")["reason"] == "Succeeded"
    assert is_true(get_trainjob(kube, ns, "first"), "Complete")
    record_fixture("finished-succeeded", as_list(get_trainjob(kube, ns, "first"), finished))


def test_trainjob_without_a_queue_label_is_not_managed_but_still_gets_kueues_empty_patch(
    kube: Kube, namespace: str, kueue_queue: KueueQueue
) -> None:
    """manageJobsWithoutQueueName is false: no Workload, not suspended. The webhook still runs on every
    TrainJob CREATE and appends its runtimePatch (empty) whatever the labels (trainjob_webhook.go Default)."""
    body = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "unqueued"},
        "spec": {"runtimeRef": {"name": "dispatch-kind"}},
    }
    created = kube.custom.create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", body
    )
    assert created["spec"].get("suspend") in (None, False)
    assert kueue_patch(created) == {
        "manager": KUEUE_MANAGER,
        "trainingRuntimeSpec": {"template": {"spec": {}}},
    }
    wait_for(
        "the TrainJob to complete", lambda: is_true(get_trainjob(kube, namespace, "unqueued"), "Complete")
    )
    assert workload_of(kube, created) is None


def test_second_job_waits_for_quota_with_its_position_then_runs_when_the_first_finishes(
    kube: Kube, kueue_queue: KueueQueue
) -> None:
    """Each job asks for the ClusterQueue's whole nvidia.com/gpu quota (2 nodes x 1 GPU). The first runs for
    20 s. The second waits with QuotaReserved=False reason Pending and the flavor assigner's message; the
    third, identical to the second, waits with no QuotaReserved condition at all. Both TrainJobs stay
    suspended (Trainer has created their JobSets, suspended; no pods), and the visibility API lists them at
    positions 0 and 1 in the LocalQueue and in the ClusterQueue. When the first finishes the second is
    admitted (the third is then at position 0), and the third when the second finishes."""
    ns = kueue_queue.namespace
    first = queued_trainjob(kube, kueue_queue, "first", env={"KWOK_RUN_DURATION": "20s"}, gpus=True)
    wait_workload(kube, first, admitted, "admitted")
    wait_for("the first job's pods Running", lambda: running_pods(kube, ns, "first", 2))

    message = QUOTA_MESSAGE

    def waiting_for_quota(wl: dict[str, Any]) -> bool:
        cond = condition(wl, "QuotaReserved")
        return bool(cond and cond["status"] == "False" and cond.get("message") == message)

    second = queued_trainjob(kube, kueue_queue, "second", gpus=True)
    pending = wait_workload(kube, second, waiting_for_quota, "QuotaReserved=False with the quota message")
    assert present(pending, "QuotaReserved")["reason"] == "Pending"
    assert condition(pending, "Admitted") is None
    # Equal priorities are ordered by the Workload's creationTimestamp, which has whole seconds, then by UID
    # (kueue pkg/cache/queue/cluster_queue.go baseCompareFunc): jobs created within one second are in no
    # defined order. The third is created in a later second than the second.
    time.sleep(1.05)
    third = queued_trainjob(kube, kueue_queue, "third", gpus=True)
    # The third asks for what the second asks for: with SchedulingEquivalenceHashing (beta, on since v0.18)
    # Kueue files it as inadmissible without trying it, so its Workload gets NO QuotaReserved condition at
    # all (only PodsReady=False WaitForStart), for as long as the quota stays taken.
    third_wl = wait_workload(kube, third, lambda w: condition(w, "PodsReady") is not None, "PodsReady=False")
    assert condition(third_wl, "QuotaReserved") is None, third_wl["status"]
    pods_ready = present(third_wl, "PodsReady")
    assert (pods_ready["status"], pods_ready["reason"]) == ("False", "WaitForStart"), pods_ready
    assert get_trainjob(kube, ns, "second")["spec"]["suspend"] is True
    jobset = kube.custom.get_namespaced_custom_object(*JOBSET, ns, "jobsets", "second")
    assert jobset["spec"]["suspend"] is True
    assert trainjob_pods(kube, ns, "second") == []

    def listed() -> dict[str, Any] | None:
        answer = pending_workloads(kube, kueue_queue)
        return answer if len(answer["items"]) == 2 else None

    answer = wait_for(
        "the visibility API to list both pending workloads",
        listed,
        state=lambda: pending_workloads(kube, kueue_queue)["items"],
    )
    positions = [
        (w["metadata"]["name"], w["positionInLocalQueue"], w["positionInClusterQueue"], w["localQueueName"])
        for w in answer["items"]
    ]
    assert positions == [
        (workload_name("second", second["metadata"]["uid"]), 0, 0, kueue_queue.name),
        (workload_name("third", third["metadata"]["uid"]), 1, 1, kueue_queue.name),
    ], positions
    by_cluster_queue = pending_workloads(kube, kueue_queue, cluster_queue=True)
    assert [w["metadata"]["name"] for w in by_cluster_queue["items"]] == [p[0] for p in positions]
    assert [w["metadata"]["namespace"] for w in by_cluster_queue["items"]] == [ns, ns]

    # The queues' status counters follow a little later.
    def counted(read: Any) -> dict[str, Any] | None:
        obj: dict[str, Any] = read()
        status = obj.get("status") or {}
        return obj if (status.get("pendingWorkloads"), status.get("admittedWorkloads")) == (2, 1) else None

    local_queue = wait_for(
        "LocalQueue status pendingWorkloads 2, admittedWorkloads 1",
        lambda: counted(
            lambda: kube.custom.get_namespaced_custom_object(*KUEUE, ns, "localqueues", kueue_queue.name)
        ),
    )
    cluster_queue = wait_for(
        "ClusterQueue status pendingWorkloads 2, admittedWorkloads 1",
        lambda: counted(
            lambda: kube.custom.get_cluster_custom_object(*KUEUE, "clusterqueues", kueue_queue.cluster_queue)
        ),
    )
    record_fixture(
        "pending-insufficient-quota",
        as_list(get_trainjob(kube, ns, "second"), pending, local_queue, cluster_queue),
    )
    record_fixture("pending-equivalent-no-condition", as_list(get_trainjob(kube, ns, "third"), third_wl))
    record_fixture("visibility-localqueue-pendingworkloads", answer)
    record_fixture("visibility-clusterqueue-pendingworkloads", by_cluster_queue)

    # The first job ends by itself (its pods succeed after 20 s); then the second is admitted.
    wait_workload(kube, first, lambda w: is_true(w, "Finished", "Succeeded"), "Finished", timeout=60)
    wait_workload(kube, second, admitted, "admitted once the first finished", timeout=30)
    assert workload_of(kube, third) is not None and not admitted(workload_of(kube, third) or {})
    after = pending_workloads(kube, kueue_queue)
    assert [(w["metadata"]["name"], w["positionInLocalQueue"]) for w in after["items"]] == [
        (workload_name("third", third["metadata"]["uid"]), 0)
    ]
    wait_workload(kube, third, admitted, "the third admitted once the second finished", timeout=60)


def test_low_priority_job_is_preempted_and_kueue_reruns_the_same_jobset_under_the_same_identity(
    kube: Kube, kueue_queue: KueueQueue
) -> None:
    """What Kueue v0.19.2 does to a running TrainJob it preempts, as a pod watch of the test's own sees it.

    `low` (dispatch-low, 100) runs with both GPUs (its pods keep running); `high` (dispatch-high, 1000)
    arrives in the same ClusterQueue. Observed sequence:

    1. low's Workload: Evicted=True reason Preempted and Preempted=True reason InClusterQueue, both with the
       message "Preempted to accommodate a workload (UID: <high's Workload>, JobUID: <high's TrainJob>) due to
       prioritization in the ClusterQueue; preemptor path: /<cq>; preemptee path: /<cq>"; QuotaReserved and
       Admitted still True for a moment. Events on the Workload: Preempted and EvictedDueToPreempted (the
       Preempted event's message adds the effective priorities); high's Workload gets PreemptedWorkload.
    2. Kueue sets low's TrainJob spec.suspend=true; Trainer suspends the JobSet, the JobSet suspends its Job,
       and the Job controller deletes both pods. The pods get a deletionTimestamp and vanish (KWOK deletes
       them at once, still phase Running): NO DisruptionTarget condition, no change of status before the
       DELETE; the Job counts no failure.
    3. Once no Job is active Kueue empties its runtimePatch (replicatedJobs removed) and emits Stopped on
       the TrainJob with the eviction message. (Trainer v2.3.0 then emits a Warning
       TrainJobResourcesCreationFailed: its JobSet update with `metadata: null` is invalid; harmless, the
       JobSet stays suspended.)
    4. low's Workload: QuotaReserved=False reason Pending (first with the eviction message, then with the
       flavor assigner's "insufficient unused quota" message), Admitted=False, Requeued=True reason
       Preempted; schedulingStats.evictions [{reason Preempted, underlyingCause "", count 1}]. high is
       admitted and runs.
    5. When high finishes, low is admitted again: Evicted=False and Preempted=False (reason QuotaReserved,
       message "Previously: ..."), Requeued stays True. Kueue refills its runtimePatch and unsuspends the SAME
       TrainJob: the same JobSet (UID, restarts 0) resumes the same Job (UID), which creates new pods (new
       UIDs and names) for the same completion indexes under the same jobset restart-attempt "0".

    So the same (TrainJob, restart-attempt, completion index) runs twice: the promise hole dispatch must
    close by deactivating the Workload when Evicted=True appears (deactivation stops it for good: see
    test_user_deactivating_a_running_workload_evicts_it_for_good).
    """
    ns = kueue_queue.namespace
    recorder = Recorder(kube, ns).start()
    try:
        low = queued_trainjob(
            kube, kueue_queue, "low", env={"KWOK_STAY_RUNNING": "1"}, priority="dispatch-low", gpus=True
        )
        low_wl = wait_workload(kube, low, lambda w: is_true(w, "PodsReady", "Started"), "running")
        assert low_wl["spec"]["priority"] == 100
        assert low_wl["spec"]["priorityClassRef"] == {
            "group": "kueue.x-k8s.io",
            "kind": "WorkloadPriorityClass",
            "name": "dispatch-low",
        }
        first_pods = wait_for("low's pods Running", lambda: running_pods(kube, ns, "low", 2))
        first_uids = {p.metadata.uid for p in first_pods}
        (job,) = kube.batch.list_namespaced_job(ns, label_selector="jobset.sigs.k8s.io/jobset-name=low").items
        jobset = kube.custom.get_namespaced_custom_object(*JOBSET, ns, "jobsets", "low")
        before = get_trainjob(kube, ns, "low")
        record_fixture("trainjob-before-preemption", as_list(before, low_wl))

        high = queued_trainjob(
            kube, kueue_queue, "high", env={"KWOK_RUN_DURATION": "3s"}, priority="dispatch-high", gpus=True
        )
        high_wl = wait_workload(kube, high, lambda w: "uid" in w["metadata"], "created")
        message = (
            f"Preempted to accommodate a workload (UID: {high_wl['metadata']['uid']}, JobUID: "
            f"{high['metadata']['uid']}) due to prioritization in the ClusterQueue; preemptor path: "
            f"/{kueue_queue.cluster_queue}; preemptee path: /{kueue_queue.cluster_queue}"
        )
        evicted = wait_workload(
            kube,
            low,
            lambda w: is_true(w, "Evicted", "Preempted") and not is_true(w, "QuotaReserved"),
            "Evicted=True Preempted and quota released",
        )
        assert present(evicted, "Evicted")["message"] == message
        preempted = present(evicted, "Preempted")
        assert (preempted["status"], preempted["reason"], preempted["message"]) == (
            "True",
            "InClusterQueue",
            message,
        )
        # QuotaReserved=False reason Pending carries the eviction message first; once the scheduler has tried
        # low again it carries the flavor assigner's "insufficient unused quota" message instead.
        released = [
            present(o.obj, "QuotaReserved")
            for o in recorder.of("Workload", low_wl["metadata"]["name"])
            if (condition(o.obj, "QuotaReserved") or {}).get("status") == "False"
        ]
        assert (released[0]["reason"], released[0]["message"]) == ("Pending", message), released[0]
        assert {(q["reason"], q["message"]) for q in released} <= {
            ("Pending", message),
            ("Pending", QUOTA_MESSAGE),
        }, released
        assert (condition(evicted, "Admitted") or {}).get("status") == "False"
        requeued = wait_workload(kube, low, lambda w: is_true(w, "Requeued", "Preempted"), "Requeued=True")
        assert requeued["status"]["schedulingStats"]["evictions"] == [
            {"reason": "Preempted", "underlyingCause": "", "count": 1}
        ]
        assert requeued["spec"]["active"] is True

        stopped = wait_for(
            "Kueue's Stopped event on low's TrainJob",
            lambda: [e for e in recorder.events_for("TrainJob", "low") if e["reason"] == "Stopped"],
        )
        assert stopped[0]["message"] == message
        after = get_trainjob(kube, ns, "low")
        assert after["spec"]["suspend"] is True
        assert after["metadata"]["uid"] == low["metadata"]["uid"]
        assert kueue_patch(after) == {
            "manager": KUEUE_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {}}},
        }
        assert is_true(after, "Suspended", "Suspended")
        record_fixture(
            "preempted",
            as_list(
                after,
                requeued,
                *recorder.events_for("Workload", requeued["metadata"]["name"]),
                *recorder.events_for("TrainJob", "low"),
            ),
        )

        # The first pods went away without a DisruptionTarget: the last state the watch saw before DELETED.
        for uid in first_uids:
            seen = [o for o in recorder.of("Pod") if o.obj["metadata"]["uid"] == uid]
            assert seen[-1].type == "DELETED", [(o.type, o.obj["status"].get("phase")) for o in seen]
            last = seen[-1].obj
            assert last["metadata"].get("deletionTimestamp"), last["metadata"]
            assert last["status"]["phase"] == "Running"
            assert "DisruptionTarget" not in {c["type"] for c in last["status"].get("conditions") or []}
        deleted = [
            o.obj
            for o in recorder.of("Pod")
            if o.type == "DELETED" and o.obj["metadata"]["uid"] in first_uids
        ]
        assert job.status.failed in (None, 0)

        # high runs and finishes; then Kueue admits low again and resumes the same objects.
        wait_workload(kube, high, lambda w: is_true(w, "Finished", "Succeeded"), "high finished", timeout=60)
        readmitted = wait_workload(
            kube,
            low,
            lambda w: admitted(w) and is_true(w, "PodsReady"),
            "low admitted again, pods ready",
            timeout=60,
        )
        for type_ in ("Evicted", "Preempted"):
            cond = present(readmitted, type_)
            assert (cond["status"], cond["reason"]) == ("False", "QuotaReserved"), cond
            assert cond["message"] == f"Previously: {message}", cond
        assert is_true(readmitted, "Requeued", "Preempted")
        second_pods = wait_for("low's pods Running again", lambda: running_pods(kube, ns, "low", 2))
        assert {p.metadata.uid for p in second_pods}.isdisjoint(first_uids)
        again = get_trainjob(kube, ns, "low")
        assert again["metadata"]["uid"] == low["metadata"]["uid"] and again["spec"]["suspend"] is False
        (job_again,) = kube.batch.list_namespaced_job(
            ns, label_selector="jobset.sigs.k8s.io/jobset-name=low"
        ).items
        jobset_again = kube.custom.get_namespaced_custom_object(*JOBSET, ns, "jobsets", "low")
        assert jobset_again["metadata"]["uid"] == jobset["metadata"]["uid"]
        assert jobset_again["status"].get("restarts", 0) == 0
        assert job_again.metadata.uid == job.metadata.uid
        identity = lambda pods: sorted(  # noqa: E731
            (
                p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"],
                p.metadata.labels["batch.kubernetes.io/job-completion-index"],
            )
            for p in pods
        )
        assert identity(second_pods) == identity(first_pods) == [("0", "0"), ("0", "1")]
        record_fixture(
            "readmitted-after-preemption",
            as_list(
                again,
                readmitted,
                jobset_again,
                to_dict(kube, job_again, "Job"),
                *deleted,
                *[to_dict(kube, p, "Pod") for p in second_pods],
            ),
        )
    finally:
        recorder.stop()


def test_pods_ready_timeout_evicts_then_requeues_then_deactivates(
    kube: Kube, kueue_queue: KueueQueue
) -> None:
    """A TrainJob whose pods never get Ready (KWOK_IMAGE_PULL_ERROR: Pending in ErrImagePull) is evicted
    PodsReadyTimeout after 15 s, requeued after the 1 s backoff, admitted again, and at the second timeout
    deactivated (backoffLimitCount 1): Evicted reason DeactivatedDueToRequeuingLimitExceeded, spec.active
    false."""
    ns = kueue_queue.namespace
    tj = queued_trainjob(kube, kueue_queue, "never-ready", env={"KWOK_IMAGE_PULL_ERROR": "1"})
    wl = wait_workload(kube, tj, admitted, "admitted")
    name = wl["metadata"]["name"]
    wait_for("both pods Pending", lambda: len(trainjob_pods(kube, ns, "never-ready")) == 2)

    evicted = wait_workload(
        kube,
        tj,
        lambda w: is_true(w, "Evicted", "PodsReadyTimeout"),
        "Evicted=True PodsReadyTimeout",
        timeout=PODS_READY_TIMEOUT + 30,
    )
    # Measured on the Workload's own condition times (whole seconds): admission to eviction is the timeout.
    waited = seconds_between(condition(wl, "Admitted"), condition(evicted, "Evicted"))
    assert PODS_READY_TIMEOUT - 1 <= waited <= PODS_READY_TIMEOUT + 3, waited
    assert present(evicted, "Evicted")["message"] == f"Exceeded the PodsReady timeout {ns}/{name}"
    pods_ready = present(evicted, "PodsReady")
    assert (pods_ready["status"], pods_ready["reason"]) == ("False", "WaitForStart"), pods_ready
    assert evicted["status"]["requeueState"]["count"] == 1
    assert evicted["spec"]["active"] is True
    stopped = wait_workload(kube, tj, lambda w: not is_true(w, "QuotaReserved"), "quota released")
    record_fixture("pods-ready-timeout", as_list(get_trainjob(kube, ns, "never-ready"), stopped))

    deactivated = wait_workload(
        kube,
        tj,
        lambda w: is_true(w, "Evicted", "DeactivatedDueToRequeuingLimitExceeded"),
        "deactivated at the second timeout",
        timeout=2 * PODS_READY_TIMEOUT + 30,
    )
    assert deactivated["spec"]["active"] is False
    assert present(deactivated, "Evicted")["message"] == (
        "The workload is deactivated due to exceeding the maximum number of re-queuing retries"
    )
    quiet = wait_workload(kube, tj, lambda w: not is_true(w, "QuotaReserved"), "quota released")
    wait_for("the pods deleted", lambda: trainjob_pods(kube, ns, "never-ready") == [])
    assert get_trainjob(kube, ns, "never-ready")["spec"]["suspend"] is True
    record_fixture("requeuing-limit-exceeded", as_list(get_trainjob(kube, ns, "never-ready"), quiet))


def test_user_deactivating_a_running_workload_evicts_it_for_good(kube: Kube, kueue_queue: KueueQueue) -> None:
    """spec.active=false on an admitted Workload (what a user or dispatch writes): Evicted=True reason
    Deactivated, the TrainJob is suspended and its pods deleted; the Workload is not requeued."""
    ns = kueue_queue.namespace
    tj = queued_trainjob(kube, kueue_queue, "stopped-by-user", env={"KWOK_STAY_RUNNING": "1"}, gpus=True)
    wl = wait_workload(kube, tj, lambda w: is_true(w, "PodsReady", "Started"), "running")
    kube.custom.patch_namespaced_custom_object(
        *KUEUE, ns, "workloads", wl["metadata"]["name"], {"spec": {"active": False}}
    )
    evicted = wait_workload(
        kube, tj, lambda w: is_true(w, "Evicted", "Deactivated"), "Evicted=True Deactivated"
    )
    assert present(evicted, "Evicted")["message"] == "The workload is deactivated"
    wait_for("the pods deleted", lambda: trainjob_pods(kube, ns, "stopped-by-user") == [])
    released = wait_workload(kube, tj, lambda w: not is_true(w, "QuotaReserved"), "quota released")
    assert get_trainjob(kube, ns, "stopped-by-user")["spec"]["suspend"] is True
    assert not is_true(released, "Requeued")
    record_fixture("deactivated-by-user", as_list(get_trainjob(kube, ns, "stopped-by-user"), released))
    # Nothing readmits it: a later job, which needs the same GPUs, is admitted in its place.
    later = queued_trainjob(kube, kueue_queue, "later", gpus=True)
    wait_workload(kube, later, admitted, "the later job admitted")
    still = workload_of(kube, tj) or {}
    assert not admitted(still) and still["spec"]["active"] is False, conditions_summary(still)


def test_visibility_api_answers_404_for_an_unknown_local_queue(kube: Kube, kueue_queue: KueueQueue) -> None:
    with pytest.raises(ApiException) as excinfo:
        pending_workloads(kube, KueueQueue("no-such-queue", kueue_queue.namespace, kueue_queue.cluster_queue))
    assert excinfo.value.status == 404
