"""The pure status derivation (jobs.status.derive) on recorded objects.

Every fixture under status-fixtures/ is a Kubernetes List written by hand from the Kubernetes, JobSet,
Trainer and Kueue sources quoted in shared/reference/status-facts.md (each file's header says which), never
from derive's output: the conditions, reasons, messages, labels and container states are the ones those
controllers write. The expected state and cause of each case come from status-facts.md §10 (evidence ->
cause, and its precedence).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobs.supervision import status as st
from jobs.supervision.status import Context, DerivedStatus, derive
from jobs.waits import Thresholds
from runtimes.management.commands.check_runtime import load_objects

FIXTURES = Path(__file__).parent / "status-fixtures"
TJ = "jq7xk2mf4ab-1"
NS = "team-a"
P0 = f"{TJ}-node-0-0-h4q9z"  # rank 0, restart-attempt 0
P1 = f"{TJ}-node-0-1-p2m7w"  # rank 1, restart-attempt 0
P2 = f"{TJ}-node-0-2-k8d3r"  # rank 2
# Every fixture's story happens between 10:00 and 11:00 on this day; judged at 11:30 unless said otherwise.
LATER = datetime(2026, 9, 1, 11, 30, tzinfo=UTC)
UNSCHEDULABLE = (
    "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available: "
    "4 No preemption victims found for incoming pod."
)
ANY: Any = object()  # "not asserted" in a table row


def at(hh_mm_ss: str) -> datetime:
    return datetime.fromisoformat(f"2026-09-01T{hh_mm_ss}+00:00")


def objects(name: str) -> list[Mapping[str, Any]]:
    return load_objects(str(FIXTURES / name))  # the loader derive_status uses


def run(
    name: str,
    *,
    now: datetime = LATER,
    warned: bool = False,
    thresholds: Thresholds | None = None,
    memory: Mapping[str, Mapping[str, Any]] | None = None,
) -> DerivedStatus:
    ctx = Context(now=now, identity_warned=warned, thresholds=thresholds or Thresholds())
    return derive(objects(name), ctx, memory=memory)


def pod(name: str) -> str:
    return f"Pod {NS}/{name}"


def has_evidence(status: DerivedStatus, obj: str, text: str) -> bool:
    """Some evidence item is about `obj` and mentions `text` in its field or value."""
    return any(
        e["object"] == obj and (text in str(e["value"]) or text in str(e["field"])) for e in status.evidence
    )


@dataclass(frozen=True)
class Case:
    fixture: str
    state: str
    cause: str | None
    rank: int | None = ANY
    exit_code: int | None = ANY
    # (object, text): an evidence item about that object mentions that text (the reason, message or value).
    evidence: Sequence[tuple[str, str]] = field(default_factory=tuple)
    now: datetime = LATER

    def __str__(self) -> str:
        return self.fixture


CASES = [
    Case("succeeded.yaml", st.SUCCEEDED, None, rank=None, exit_code=None),
    Case("running.yaml", st.RUNNING, None, rank=None, exit_code=None),
    # app-error: which rank, which exit code. Rank 0's 143 came later (the Job controller killed it).
    Case(
        "app-error-rank1-exit3.yaml",
        st.FAILED,
        st.APP_ERROR,
        rank=1,
        exit_code=3,
        evidence=[(pod(P1), "3"), (f"Job {NS}/{TJ}-node-0", "BackoffLimitExceeded")],
    ),
    # The first rank to fail (rank 2 at 10:05:00) is the cause; rank 0 (10:05:03, exit 2) is evidence.
    Case(
        "several-ranks-failing.yaml",
        st.FAILED,
        st.APP_ERROR,
        rank=2,
        exit_code=1,
        evidence=[(pod(P2), "1"), (pod(P0), "exit code 2")],
    ),
    # §10 precedence 3: exit 137 without OOMKilled and no disruption is app-error.
    Case("app-error-exit137.yaml", st.FAILED, st.APP_ERROR, rank=0, exit_code=137),
    # A podFailurePolicy FailJob rule: the pod is gone, the Job's message names pod and exit code. An Indexed
    # Job's pod is named <job>-<index>-<suffix> [K: podGenerateNameWithIndex], so the message names the rank.
    Case(
        "app-error-pod-failure-policy.yaml",
        st.FAILED,
        st.APP_ERROR,
        rank=1,
        exit_code=42,
        evidence=[(f"Job {NS}/{TJ}-node-0", "exit code 42")],
    ),
    # §10 precedence 1: OOMKilled + BackoffLimitExceeded is oom.
    Case(
        "oom-backofflimit.yaml",
        st.FAILED,
        st.OOM,
        rank=0,
        exit_code=137,
        evidence=[(pod(P0), "OOMKilled")],
    ),
    # OOMKilled in lastState (restarted in place under OnFailure) still proves oom.
    Case(
        "oom-last-state-restart.yaml",
        st.FAILED,
        st.OOM,
        rank=1,
        exit_code=137,
        evidence=[(pod(P1), "OOMKilled")],
    ),
    # §10: PreemptionByScheduler + exit 143 is preempted, not app-error.
    Case(
        "preempted-exit143.yaml",
        st.FAILED,
        st.PREEMPTED,
        rank=1,
        evidence=[(pod(P1), "PreemptionByScheduler")],
    ),
    # Kubelet critical-pod preemption (status.reason Preempting, TerminationByKubelet): 137 is the kill.
    Case("preempted-kubelet-critical-pod.yaml", st.FAILED, st.PREEMPTED, rank=0),
    # Kueue preemption: no pod condition, pods deleted, TrainJob suspended. Kueue would resume the same
    # TrainJob (same identity): the attempt ends preempted (status-facts §12), the cycle deactivates.
    Case(
        "kueue-preempted.yaml",
        st.FAILED,
        st.PREEMPTED,
        evidence=[(f"Workload {NS}/trainjob-{TJ}-3f9a1", "Preempted to accommodate a workload")],
    ),
    Case(
        "node-lost-taint.yaml",
        st.FAILED,
        st.NODE_LOST,
        rank=1,
        evidence=[(pod(P1), "DeletionByTaintManager"), ("Node gpu-node-2", "node.kubernetes.io/unreachable")],
    ),
    Case(
        "node-lost-podgc.yaml",
        st.FAILED,
        st.NODE_LOST,
        rank=1,
        evidence=[(pod(P1), "DeletionByPodGC")],
    ),
    Case("node-lost-shutdown.yaml", st.FAILED, st.NODE_LOST, rank=0),
    Case(
        "evicted-eviction-api.yaml",
        st.FAILED,
        st.EVICTED,
        rank=0,
        evidence=[(pod(P0), "EvictionByEvictionAPI")],
    ),
    # §10: a memory-pressure eviction is evicted, not oom (the container was SIGKILLed: 137, Error).
    Case(
        "evicted-memory-pressure.yaml",
        st.FAILED,
        st.EVICTED,
        rank=0,
        evidence=[(pod(P0), "TerminationByKubelet")],
    ),
    # A local-storage limit eviction sets no DisruptionTarget; status.reason Evicted is enough.
    Case("evicted-local-storage.yaml", st.FAILED, st.EVICTED, rank=0, evidence=[(pod(P0), "Evicted")]),
    # DeletionByTaintManager from a user's own taint on a Ready node: not node-lost.
    Case("evicted-user-taint.yaml", st.FAILED, st.EVICTED, rank=0),
    Case(
        "no-capacity-kubelet-rejected.yaml",
        st.FAILED,
        st.NO_CAPACITY,
        rank=0,
        evidence=[(pod(P0), "OutOfnvidia.com/gpu")],
    ),
    Case(
        "config-error-start-error.yaml",
        st.FAILED,
        st.CONFIG_ERROR,
        rank=0,
        exit_code=128,
        evidence=[(pod(P0), "StartError")],
    ),
    Case(
        "config-error-failed-create.yaml",
        st.FAILED,
        st.CONFIG_ERROR,
        evidence=[(f"Job {NS}/{TJ}-node-0", "violates PodSecurity")],
    ),
    Case(
        "timeout-trainjob-deadline.yaml",
        st.FAILED,
        st.TIMEOUT,
        evidence=[(f"TrainJob {NS}/{TJ}", "DeadlineExceeded")],
    ),
    # §10 precedence 4: the deadline fired while a rank was unschedulable: timeout, the pending cause as
    # evidence.
    Case(
        "timeout-while-unschedulable.yaml",
        st.FAILED,
        st.TIMEOUT,
        evidence=[(f"TrainJob {NS}/{TJ}", "DeadlineExceeded"), (pod(P1), "Insufficient nvidia.com/gpu")],
    ),
    # §10 precedence 1 and 4: the chain ends at the Job's DeadlineExceeded; the pods' 143 is the kill, not
    # the cause.
    Case(
        "timeout-job-deadline.yaml",
        st.FAILED,
        st.TIMEOUT,
        evidence=[(f"Job {NS}/{TJ}-node-0", "DeadlineExceeded")],
    ),
    # Kueue deactivated the Workload for its maximum execution time: it is not requeued ([Q: reconciler.go]).
    Case(
        "kueue-max-execution-time.json",
        st.FAILED,
        st.TIMEOUT,
        evidence=[(f"Workload {NS}/trainjob-{TJ}-3f9a1", "DeactivatedDueToMaximumExecutionTimeExceeded")],
    ),
    # A user set the Workload's spec.active to false: stopped outside dispatch, never admitted again.
    Case(
        "kueue-deactivated.json",
        st.CANCELLED,
        st.CANCELLED,
        evidence=[(f"Workload {NS}/trainjob-{TJ}-3f9a1", "Deactivated: The workload is deactivated")],
    ),
    # Evicted once too often (waitForPodsReady.requeuingStrategy.backoffLimitCount): evicted for good.
    Case(
        "kueue-requeuing-limit.json",
        st.FAILED,
        st.EVICTED,
        evidence=[(f"Workload {NS}/trainjob-{TJ}-3f9a1", "DeactivatedDueToRequeuingLimitExceeded")],
    ),
    Case(
        "runtime-missing.yaml",
        st.FAILED,
        st.RUNTIME_MISSING,
        evidence=[(f"TrainJob {NS}/{TJ}", "TrainingRuntime specified in TrainJob is not found")],
    ),
    Case("identity-restart-in-place.yaml", st.FAILED, st.IDENTITY_VIOLATION, rank=1),
    Case("identity-two-pods.yaml", st.FAILED, st.IDENTITY_VIOLATION, rank=0),
    # §10 precedence 7: the preemption caused the rerun; it is the cause, the identity finding is attached.
    Case(
        "identity-replaced-after-preemption.yaml",
        st.FAILED,
        st.PREEMPTED,
        rank=1,
        evidence=[(pod(P1), "PreemptionByScheduler")],
    ),
    # §10 precedence 3: exit 143 after the pod's deletion was asked for is the kill, never the cause; with
    # nothing else observed, the failure is unknown and the kills are its evidence (was: app-error 143).
    Case(
        "killed-by-deletion.yaml",
        st.FAILED,
        st.UNKNOWN_FAILURE,
        rank=1,
        evidence=[(pod(P1), "metadata.deletionTimestamp"), (pod(P0), "metadata.deletionTimestamp")],
    ),
    Case("cancelled-trainjob-deleting.yaml", st.CANCELLED, st.CANCELLED),
    Case("cancelled-trainjob-gone.yaml", st.CANCELLED, st.CANCELLED),
    Case("jobset-restart.yaml", st.RUNNING, None, evidence=[(f"JobSet {NS}/{TJ}", "status.restarts")]),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_derivation(case: Case) -> None:
    status = run(case.fixture, now=case.now)
    got = (status.state, status.cause)
    assert got == (case.state, case.cause), f"{case.fixture}: {status.message}; evidence {status.evidence}"
    if case.rank is not ANY:
        assert status.rank == case.rank
    if case.exit_code is not ANY:
        assert status.exit_code == case.exit_code
    for obj, text in case.evidence:
        assert has_evidence(status, obj, text), f"no evidence on {obj} mentioning {text!r}: {status.evidence}"


def test_every_cause_has_a_case() -> None:
    """The table covers the vocabulary; unknown-failure and image-pull have their own tests below."""
    covered = {c.cause for c in CASES} | {st.UNKNOWN_FAILURE, st.IMAGE_PULL}
    causes = {
        st.PREEMPTED,
        st.NODE_LOST,
        st.OOM,
        st.TIMEOUT,
        st.NO_CAPACITY,
        st.IMAGE_PULL,
        st.EVICTED,
        st.CONFIG_ERROR,
        st.APP_ERROR,
        st.RUNTIME_MISSING,
        st.IDENTITY_VIOLATION,
        st.CANCELLED,
        st.UNKNOWN_FAILURE,
    }
    assert causes <= covered


# --- a kill is evidence, never the cause


def test_a_rank_killed_by_its_pods_deletion_is_evidence_under_the_real_cause() -> None:
    """The app error of rank 1 is the cause when rank 0's 143 came from its pod's deletion, even though the
    kill's time is earlier (the Job controller deleted rank 0 as soon as rank 1's pod was seen failing, and
    the kubelet reported rank 1's exit a second later): the kill is listed under it."""
    items = objects("killed-by-deletion.yaml")
    rank1 = next(o for o in items if o["metadata"]["name"] == P1)
    rank1["metadata"].pop("deletionTimestamp")
    rank1["status"]["containerStatuses"][0]["state"]["terminated"].update(
        exitCode=3, finishedAt="2026-09-01T10:05:05Z"
    )
    status = derive(items, Context(now=LATER))
    assert (status.state, status.cause, status.rank, status.exit_code) == (st.FAILED, st.APP_ERROR, 1, 3)
    assert has_evidence(status, pod(P0), "metadata.deletionTimestamp"), status.evidence


def test_a_143_before_the_deletion_was_asked_for_is_still_the_applications() -> None:
    """A container that ended 143 before its pod's deletion was asked for was not killed by it: app-error."""
    items = objects("killed-by-deletion.yaml")
    for obj in items:
        if obj.get("kind") == "Pod":
            obj["metadata"]["deletionTimestamp"] = "2026-09-01T10:06:30Z"  # asked for at 10:06:00
    status = derive(items, Context(now=LATER))
    assert (status.state, status.cause, status.rank, status.exit_code) == (st.FAILED, st.APP_ERROR, 1, 143)


def test_a_preempted_rank_that_exited_0_is_evidence_and_a_warning_on_a_success() -> None:
    """§12: a rank whose application exits 0 on SIGTERM completes its index, so the job succeeds; the
    preemption is on the status as evidence, in the message, and as a warning (was: succeeded, no word)."""
    status = run("preempted-exit0-complete.yaml")
    assert (status.state, status.cause) == (st.SUCCEEDED, None)
    assert has_evidence(status, pod(P1), "PreemptionByScheduler"), status.evidence
    assert has_evidence(status, pod(P1), "exit code 0"), status.evidence
    assert "rank 1 was preempted and exited 0" in status.message, status.message
    assert [(w["kind"], w["object"]) for w in status.warnings] == [("disruption", pod(P1))]
    assert "exited 0 on SIGTERM" in status.warnings[0]["message"]
    # Without the disruption, a success says nothing more.
    plain = run("succeeded.yaml")
    assert (plain.evidence, plain.warnings) == ([], [])


# --- the Trainer's requests that the API server did not answer


def test_a_trainer_whose_requests_got_no_answer_keeps_the_job_waiting_not_config_error() -> None:
    """The API server was down while the Trainer built the TrainJob: its TrainJobResourcesCreationFailed
    events carry Go's url.Error (`Patch "<url>": dial tcp ...: connection refused`), and it retries. An
    outage, not the job's configuration: the job waits (awaiting-jobset, the Trainer's words shown), long
    past the 15 s a real creation failure gets. Was: `config-error` 15 s after the first event (make chaos
    seed 3 at 4459875: 11 jobs built during kube-apiserver's kill)."""
    status = run("trainer-api-unreachable.yaml")
    assert (status.state, status.cause, status.stop) == (st.QUEUED, None, False)
    assert status.queued_reason["reason"] == "awaiting-jobset"
    assert "the API server did not answer it" in status.queued_reason["message"]
    assert "connection refused" in status.queued_reason["message"]


def test_a_trainer_refused_by_the_api_server_is_still_a_configuration_error() -> None:
    """The same event with an answer from the API server (RBAC refusing the snapshot) is the configuration's
    fault: config-error after 15 s, as before."""
    items = [dict(o) for o in objects("trainer-api-unreachable.yaml")]
    items[1] = {
        **items[1],
        "note": "TrainJob resources reconciliation failed: creating runtime snapshot: applying runtime "
        'snapshot ConfigMap: configmaps "jq7xk2mf4ab-1-runtime-snapshot" is forbidden: User '
        '"system:serviceaccount:kubeflow-system:trainer" cannot patch resource "configmaps" in API group "" '
        'in the namespace "team-a"',
    }
    status = derive(items, Context(now=LATER))
    assert (status.state, status.cause, status.stop) == (st.FAILED, st.CONFIG_ERROR, True)


# --- a JobSet that cannot create its Jobs


def test_a_jobset_that_cannot_create_its_jobs_waits_then_fails_config_error() -> None:
    """JobCreationFailed on the JobSet, repeated with backoff (its series): queued with the API server's
    words for RESOURCES_FAILED_AFTER (15 s) from the first, then config-error with the event as evidence,
    and dispatch stops the TrainJob. Was: `queued awaiting-pods "the JobSet's pods are being created"` for
    ever."""
    waiting = run("jobset-job-creation-failed.yaml", now=at("10:00:10"))
    assert waiting.state == st.QUEUED
    assert waiting.queued_reason["reason"] == "jobs-not-created"
    assert "Limit must be set for non overcommitable resources" in waiting.queued_reason["message"]
    assert waiting.recheck_at == at("10:00:16").replace(microsecond=200000)  # first seen 10:00:01.2 + 15 s
    failed = run("jobset-job-creation-failed.yaml")
    assert (failed.state, failed.cause, failed.stop) == (st.FAILED, st.CONFIG_ERROR, True)
    assert failed.message.startswith("the JobSet could not create its Jobs for ")
    assert has_evidence(failed, f"JobSet {NS}/{TJ}", "Limit must be set for non overcommitable resources")


def test_a_job_made_after_the_last_creation_failure_resolves_it() -> None:
    items = objects("jobset-job-creation-failed.yaml")
    items.append(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"{TJ}-node-0",
                "namespace": NS,
                "uid": "9e41b7c2-3d5f-4a8b-b0c1-4c3a00000003",
                "creationTimestamp": "2026-09-01T10:02:30Z",  # after the last failure, 10:02:10
                "labels": {"jobset.sigs.k8s.io/restart-attempt": "0", "dispatch.dev/job": "jq7xk2mf4ab"},
            },
            "status": {},
        }
    )
    status = derive(items, Context(now=LATER))
    assert status.state == st.QUEUED and status.queued_reason["reason"] == "awaiting-pods", status.message


# --- unknown-failure: only when nothing explains the failure, with the raw conditions kept


def test_unknown_failure_keeps_the_raw_conditions() -> None:
    status = run("unknown-failure.yaml")
    assert (status.state, status.cause, status.rank, status.exit_code) == (
        st.FAILED,
        st.UNKNOWN_FAILURE,
        None,
        None,
    )
    first_failed = "jobset failed due to one or more job failures (first failed job: jq7xk2mf4ab-1-node-0)"
    assert has_evidence(status, f"TrainJob {NS}/{TJ}", first_failed)
    assert has_evidence(status, f"JobSet {NS}/{TJ}", "FailedJobs")
    assert has_evidence(status, f"Job {NS}/{TJ}-node-0", "Job has reached the specified backoff limit")


# --- queued, and the waiting causes that fail after their threshold


def test_unschedulable_is_queued_with_the_schedulers_message_and_since_when() -> None:
    status = run("unschedulable.yaml", now=at("10:02:00"))
    assert (status.state, status.cause) == (st.QUEUED, None)
    assert status.queued_reason["reason"] == "unschedulable"
    assert status.queued_reason["message"] == UNSCHEDULABLE
    assert st.parse_time(status.queued_reason["since"]) == at("10:00:03")  # the first rank to wait
    assert not status.stop


def test_unschedulable_past_the_threshold_is_no_capacity() -> None:
    limit = Thresholds().no_capacity_after
    just_before = run("unschedulable.yaml", now=at("10:00:03") + timedelta(seconds=limit - 1))
    assert (just_before.state, just_before.cause) == (st.QUEUED, None)

    status = run("unschedulable.yaml", now=at("10:00:03") + timedelta(seconds=limit + 1))
    assert (status.state, status.cause, status.rank) == (st.FAILED, st.NO_CAPACITY, 0)
    assert has_evidence(status, pod(P0), "Insufficient nvidia.com/gpu")
    assert status.stop  # dispatch stops the TrainJob itself: nothing in the cluster will


def test_the_no_capacity_threshold_is_a_setting() -> None:
    short = Thresholds(no_capacity_after=60)
    assert run("unschedulable.yaml", now=at("10:00:50"), thresholds=short).state == st.QUEUED
    status = run("unschedulable.yaml", now=at("10:01:10"), thresholds=short)
    assert (status.state, status.cause) == (st.FAILED, st.NO_CAPACITY)


def test_awaiting_admission_is_queued_with_kueues_message() -> None:
    status = run("awaiting-admission.yaml")
    assert (status.state, status.cause) == (st.QUEUED, None)
    assert status.queued_reason["reason"] == "awaiting-quota"
    assert "insufficient unused quota for nvidia.com/gpu" in status.queued_reason["message"]


def test_a_trainjob_suspended_by_hand_is_queued_and_says_nothing_will_resume_it() -> None:
    """No Workload and no queue label: not Kueue's suspension, so not "awaiting admission"."""
    status = run("suspended.yaml")
    assert (status.state, status.cause) == (st.QUEUED, None)
    assert status.queued_reason["reason"] == "suspended"
    assert "until spec.suspend is set back to false" in status.queued_reason["message"]
    assert st.parse_time(status.queued_reason["since"]) == at("10:00:01")


def test_image_pull_waits_then_fails_after_its_threshold() -> None:
    waiting = run("image-pull.yaml", now=at("10:01:00"))
    assert (waiting.state, waiting.cause) == (st.QUEUED, None)
    assert waiting.queued_reason["reason"] == st.IMAGE_PULL
    assert "ImagePullBackOff" in waiting.queued_reason["message"]
    assert st.parse_time(waiting.queued_reason["since"]) == at("10:00:05")  # the first "Failed to pull image"

    limit = Thresholds().stuck_after
    status = run("image-pull.yaml", now=at("10:00:05") + timedelta(seconds=limit + 1))
    assert (status.state, status.cause, status.rank) == (st.FAILED, st.IMAGE_PULL, 0)
    assert has_evidence(status, pod(P0), "ImagePullBackOff")
    assert status.stop


def test_a_missing_secret_waits_then_is_a_config_error() -> None:
    waiting = run("config-error-secret-missing.yaml", now=at("10:01:00"))
    assert waiting.state == st.QUEUED
    assert 'secret "hf-token" not found' in waiting.queued_reason["message"]

    status = run("config-error-secret-missing.yaml", now=at("10:10:00"))
    assert (status.state, status.cause, status.rank) == (st.FAILED, st.CONFIG_ERROR, 0)
    assert has_evidence(status, pod(P0), "CreateContainerConfigError")


def test_pods_not_created_are_queued_until_the_threshold() -> None:
    status = run("config-error-failed-create.yaml", now=at("10:00:05"))
    assert (status.state, status.cause) == (st.QUEUED, None)
    assert "violates PodSecurity" in status.queued_reason["message"]


# --- several ranks, JobSet restarts, identity


def test_the_other_failed_ranks_are_evidence_not_the_cause() -> None:
    status = run("several-ranks-failing.yaml")
    first = [r for r in status.ranks if r["first_failure"]]
    assert [(r["rank"], r["pod"], r["exit_code"]) for r in first] == [(2, P2, 1)]
    assert {(r["rank"], r["exit_code"]) for r in status.ranks} == {(0, 2), (1, 143), (2, 1)}


def test_a_jobset_restart_is_visible_and_not_an_identity_violation() -> None:
    status = run("jobset-restart.yaml")
    assert status.restart_attempt == 1
    assert status.identity_findings == []
    # Both restart-attempts are in the per-rank view: the attempt-0 rank 1 that exited 1 is not hidden.
    rows = {(r["restart_attempt"], r["rank"]): r for r in status.ranks}
    assert set(rows) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert rows[(0, 1)]["exit_code"] == 1
    assert (rows[(1, 0)]["phase"], rows[(1, 1)]["phase"]) == ("Running", "Running")
    assert [e["value"] for e in status.evidence if e["field"] == "status.restarts"] == [1]


def test_a_container_restart_in_place_is_an_identity_finding() -> None:
    status = run("identity-restart-in-place.yaml")
    assert [(f["rank"], f["attempt"], f["restart_attempt"], f["pods"]) for f in status.identity_findings] == [
        (1, 1, 0, [P1])
    ]
    assert "restart" in status.identity_findings[0]["why"]
    assert not status.identity_findings[0]["expected"]
    assert has_evidence(status, pod(P1), "restart")
    assert status.stop


def test_two_pods_for_one_rank_is_an_identity_finding_naming_both_pods_oldest_first() -> None:
    status = run("identity-two-pods.yaml")
    two_pods = [f for f in status.identity_findings if len(f["pods"]) == 2]
    assert [(f["rank"], f["attempt"], f["restart_attempt"], f["pods"]) for f in two_pods] == [
        (0, 1, 0, [P0, f"{TJ}-node-0-0-w8n5c"])
    ]


def test_under_the_identity_warning_a_rerun_is_expected_not_a_failure() -> None:
    status = run("identity-restart-in-place.yaml", warned=True)
    assert (status.state, status.cause) == (st.RUNNING, None)
    assert [f["rank"] for f in status.identity_findings] == [1]
    assert status.identity_findings[0]["expected"] is True
    assert "expected" in status.identity_findings[0]["why"]
    assert not status.stop

    two = run("identity-two-pods.yaml", warned=True)
    assert (two.state, two.cause) == (st.RUNNING, None)
    assert two.identity_findings and all(f["expected"] for f in two.identity_findings)


def test_a_rerun_caused_by_preemption_keeps_its_identity_finding() -> None:
    status = run("identity-replaced-after-preemption.yaml")
    assert [(f["rank"], f["pods"]) for f in status.identity_findings] == [(1, [P1, f"{TJ}-node-0-1-c5j7t"])]


def test_an_oom_restart_in_place_is_oom_with_the_identity_finding_attached() -> None:
    status = run("oom-last-state-restart.yaml")
    assert status.cause == st.OOM
    assert [f["rank"] for f in status.identity_findings] == [1]


# --- memory: what earlier cycles saw of pods that are gone now


def test_a_disruption_seen_in_an_earlier_cycle_still_explains_the_failure() -> None:
    alone = run("memory-preempted-cycle2.yaml", now=at("10:05:10"))
    assert (alone.state, alone.cause) == (
        st.FAILED,
        st.UNKNOWN_FAILURE,
    )  # the DisruptionTarget left with the pod

    cycle1 = run("memory-preempted-cycle1.yaml", now=at("10:04:35"))
    assert cycle1.state == st.RUNNING
    status = run("memory-preempted-cycle2.yaml", now=at("10:05:10"), memory=cycle1.pods)
    assert (status.state, status.cause, status.rank) == (st.FAILED, st.PREEMPTED, 1)
    assert has_evidence(status, pod(P1), "PreemptionByScheduler")
    gone = {r["pod"]: r["phase"] for r in status.ranks}
    assert gone[P1] == "Gone"


def test_a_pod_gone_with_its_deleted_node_is_node_lost() -> None:
    cycle1 = run("memory-node-deleted-cycle1.yaml", now=at("10:04:00"))
    assert cycle1.state == st.RUNNING
    status = run("memory-node-deleted-cycle2.yaml", now=at("10:06:00"), memory=cycle1.pods)
    assert (status.state, status.cause, status.rank) == (st.FAILED, st.NODE_LOST, 1)
    assert any(e["object"] == "Node gpu-node-2" for e in status.evidence)


def test_a_preempted_event_explains_a_pod_deleted_between_two_cycles() -> None:
    """No cycle saw the DisruptionTarget; the scheduler's event (events.k8s.io shape) names the pod."""
    cycle1 = run("memory-node-deleted-cycle1.yaml", now=at("10:04:00"))
    status = run("memory-preempted-event-cycle2.yaml", now=at("10:04:40"), memory=cycle1.pods)
    assert (status.state, status.cause, status.rank) == (st.FAILED, st.PREEMPTED, 1)
    assert has_evidence(status, pod(P1), "Preempted by pod 44d0e2a1-9b3c-4d5e-8f60-7a1b2c3d4e5f")


def test_memory_is_json_and_carries_across_more_cycles() -> None:
    """The supervisor stores `pods` between cycles; a pod remembered as gone stays explained."""
    import json

    cycle1 = run("memory-preempted-cycle1.yaml", now=at("10:04:35"))
    stored = json.loads(json.dumps(cycle1.pods))
    cycle2 = run("memory-preempted-cycle2.yaml", now=at("10:05:10"), memory=stored)
    cycle3 = run(
        "memory-preempted-cycle2.yaml", now=at("10:05:20"), memory=json.loads(json.dumps(cycle2.pods))
    )
    assert (cycle3.cause, cycle3.rank) == (st.PREEMPTED, 1)


# --- the contract shape


def test_contract_shape() -> None:
    status = run("app-error-rank1-exit3.yaml")
    out = status.contract()
    assert list(out) == ["state", "cause", "rank", "exit_code", "evidence", "identity_findings"]
    assert (out["state"], out["cause"], out["rank"], out["exit_code"]) == ("failed", "app-error", 1, 3)
    assert out["evidence"] and all(list(e) == ["object", "field", "value"] for e in out["evidence"])

    finding = run("identity-two-pods.yaml").contract()["identity_findings"][0]
    assert list(finding) == ["rank", "attempt", "restart_attempt", "pods", "why"]
