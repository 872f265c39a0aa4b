"""jobs.supervision.derive_all: how a cycle merges what the pod watch saw with what earlier cycles remembered.

The race it guards: an evicted pod vanishes between two reads, so a cycle remembers it as gone without its
DisruptionTarget; the watch's DELETED event then brings the pod's last state, which must still explain the
failure (status-facts §1.2: EvictionByEvictionAPI, then a DELETE)."""

from __future__ import annotations

import gc
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from jobs.supervision import cycle
from jobs.supervision.cycle import Watched, derive_all
from jobs.supervision.grouping import StaticIndex, owned_objects
from jobs.supervision.status import TRAINJOB_GONE, DerivedStatus, condense_pod, with_tombstone
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


def _cycle_after_the_pod_was_found_gone(
    tombstones: list[dict[str, Any]], *, remembered_disrupted: bool = False
) -> Any:
    """A cycle after an earlier one remembered the pod as gone, without its DisruptionTarget (or with it:
    `remembered_disrupted`, an earlier cycle used the watch's deletion)."""
    remembered = condense_pod(_pod(disrupted=remembered_disrupted), "dispatch.dev") | {
        "gone": "2026-11-30T10:00:06Z"
    }
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


def test_a_stale_deletion_delivered_after_the_good_one_was_used_does_not_take_the_disruption_back() -> None:
    """A lagging watch (another supervisor's, or a re-list) delivers the pod deleted in an older state
    (Running, no DisruptionTarget) after a cycle already used the deletion that carried the eviction, whose
    tombstone is gone. Before, the stale tombstone replaced what the memory held: `unknown-failure`."""
    status = _cycle_after_the_pod_was_found_gone([_pod(disrupted=False)], remembered_disrupted=True)
    assert (status.state, status.cause, status.rank) == ("failed", "evicted", 1)


def test_a_stale_deletion_does_not_make_a_finished_pod_run_again() -> None:
    finished = _pod(disrupted=False) | {"status": {"phase": "Failed", "conditions": []}}
    remembered = condense_pod(finished, "dispatch.dev")
    merged = with_tombstone(remembered, condense_pod(_pod(disrupted=True), "dispatch.dev"))
    assert merged["phase"] == "Failed" and merged["disruption"]["reason"] == "EvictionByEvictionAPI"


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


# ---------------------------------------------------------------- the owner chain, FailedCreate, memory, TTL


def _chain_pod(name: str, rank: int, *, owner: bool = True, namespace: str = NS) -> dict[str, Any]:
    pod = _pod(disrupted=False)
    pod["metadata"] = {
        **pod["metadata"],
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "creationTimestamp": "2026-11-30T10:00:02Z",
        "labels": {**pod["metadata"]["labels"], "batch.kubernetes.io/job-completion-index": str(rank)},
    }
    if not owner:
        pod["metadata"].pop("ownerReferences")
    return pod


def test_labelled_objects_outside_the_owner_chain_are_ignored_and_named() -> None:
    index = StaticIndex(
        [
            *_observed_objects(failed=False),
            _chain_pod(f"{NAME}-node-0-0-aaaaa", 0),
            _chain_pod(f"{NAME}-node-0-1-bbbbb", 1),
            _chain_pod("stranger-here", 1, owner=False),
            _chain_pod("stranger-elsewhere", 1, namespace="elsewhere"),
        ],
        ["dispatch.dev"],
    )
    watched = [Watched(key=(JOB, 1), namespace=NS, trainjob_name=NAME, memory={}, identity_warned=False)]
    status = derive_all(
        index, watched, now=datetime(2026, 11, 30, 10, 0, 8, tzinfo=UTC), thresholds=Thresholds()
    )[(JOB, 1)]
    assert (status.state, status.identity_findings) == ("running", [])
    assert sorted(w["object"] for w in status.warnings) == [
        "Pod elsewhere/stranger-elsewhere",
        f"Pod {NS}/stranger-here",
    ]


def _observed_objects(*, failed: bool) -> list[dict[str, Any]]:
    meta = {"namespace": NS, "labels": LABELS}
    trainjob = {"kind": "TrainJob", "metadata": {**meta, "name": NAME, "uid": f"uid-{NAME}"}, "status": {}}
    jobset = {
        "kind": "JobSet",
        "metadata": {**meta, "name": NAME, "uid": f"uid-{NAME}", **_owner("TrainJob", NAME)},
        "status": {"restarts": 0},
    }
    job = {
        "kind": "Job",
        "metadata": {
            **meta,
            "name": f"{NAME}-node-0",
            "uid": f"uid-{NAME}-node-0",
            **_owner("JobSet", NAME),
            "labels": {**LABELS, "jobset.sigs.k8s.io/restart-attempt": "0"},
        },
        "status": {},
    }
    return [trainjob, jobset, job]


def test_an_old_failed_create_neither_pins_a_running_job_nor_skips_the_identity_check() -> None:
    """A FailedCreate (exceeded quota) at 10:00:00, then pods made at 10:00:02: resolved, says nothing. And
    two pods for rank 1 beside a FailedCreate still break the promise."""
    failed_create = {
        "kind": "Event",
        "metadata": {"namespace": NS, "name": "e1", "uid": "e1"},
        "involvedObject": {
            "kind": "Job",
            "namespace": NS,
            "name": f"{NAME}-node-0",
            "uid": f"uid-{NAME}-node-0",
        },
        "reason": "FailedCreate",
        "type": "Warning",
        "message": 'Error creating: pods "x" is forbidden: exceeded quota: q',
        "firstTimestamp": "2026-11-30T10:00:00Z",
        "lastTimestamp": "2026-11-30T10:00:00Z",
        "count": 3,
    }
    objects = [*_observed_objects(failed=False), failed_create]
    pods = [_chain_pod(f"{NAME}-node-0-0-aaaaa", 0), _chain_pod(f"{NAME}-node-0-1-bbbbb", 1)]
    watched = [Watched(key=(JOB, 1), namespace=NS, trainjob_name=NAME, memory={}, identity_warned=False)]
    now = datetime(2026, 11, 30, 10, 5, 0, tzinfo=UTC)
    running = derive_all(
        StaticIndex([*objects, *pods], ["dispatch.dev"]), watched, now=now, thresholds=Thresholds()
    )
    assert running[(JOB, 1)].state == "running"
    assert running[(JOB, 1)].queued_reason.get("reason") != "pods-not-created"
    twice = [*pods, _chain_pod(f"{NAME}-node-0-1-ccccc", 1)]
    broken = derive_all(
        StaticIndex([*objects, *twice], ["dispatch.dev"]), watched, now=now, thresholds=Thresholds()
    )
    assert (broken[(JOB, 1)].state, broken[(JOB, 1)].cause) == ("failed", "identity-violation")


def test_exceeded_quota_waits_the_no_capacity_threshold_not_fifteen_seconds() -> None:
    from jobs.supervision.status import Context, derive

    event = {
        "kind": "Event",
        "involvedObject": {"kind": "Job", "namespace": NS, "name": f"{NAME}-node-0"},
        "reason": "FailedCreate",
        "message": 'Error creating: pods "x" is forbidden: exceeded quota: q',
        "firstTimestamp": "2026-11-30T10:00:00Z",
        "lastTimestamp": "2026-11-30T10:00:40Z",
    }
    objects = [*_observed_objects(failed=False), event]
    thresholds = Thresholds(no_capacity_after=120)
    waiting = derive(objects, Context(now=datetime(2026, 11, 30, 10, 1, tzinfo=UTC), thresholds=thresholds))
    assert (waiting.state, waiting.queued_reason["reason"]) == ("queued", "pods-not-created")
    assert waiting.recheck_at == datetime(2026, 11, 30, 10, 2, tzinfo=UTC)
    late = derive(objects, Context(now=datetime(2026, 11, 30, 10, 2, 1, tzinfo=UTC), thresholds=thresholds))
    assert (late.state, late.cause, late.stop) == ("failed", "no-capacity", True)


def test_memory_is_only_added_to() -> None:
    from jobs.supervision.status import merge_memory

    disrupted = condense_pod(_pod(disrupted=True), "dispatch.dev")
    plain = condense_pod(_pod(disrupted=False), "dispatch.dev")
    other = {**plain, "uid": "pod-2"}
    merged = merge_memory({"pod-1": disrupted, "pod-2": other}, {"pod-1": plain})
    assert set(merged) == {"pod-1", "pod-2"}
    assert merged["pod-1"]["disruption"]["reason"] == "EvictionByEvictionAPI"


def test_the_runtime_copy_sets_no_jobset_ttl() -> None:
    """An attempt ends by deleting its TrainJob: a JobSet TTL would delete the JobSet of a failed TrainJob,
    and the Trainer v2.3.0 would build it again (status-facts §12)."""
    from jobs.plan import build_training_runtime
    from jobs.spec import JobSpec, RuntimeRef
    from runtimes.reasons import SiteRules

    runtime = {
        "spec": {
            "template": {
                "spec": {
                    "ttlSecondsAfterFinished": 60,
                    "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {}}}}}],
                }
            }
        }
    }
    ref = RuntimeRef(kind="ClusterTrainingRuntime", name="r", namespace=None)
    spec = JobSpec(runtime=ref, namespace=NS, image="localhost/trainer:v1")
    copy = build_training_runtime(
        spec=spec, runtime=runtime, rules=SiteRules(), job_id=JOB, attempt=1, label_domain="dispatch.dev"
    )
    assert "ttlSecondsAfterFinished" not in copy["spec"]["template"]["spec"]
    assert runtime["spec"]["template"]["spec"]["ttlSecondsAfterFinished"] == 60  # the original untouched


def test_a_job_that_ran_stays_running_while_its_pods_go_and_no_failure_is_written_yet() -> None:
    """Its pods seen running by an earlier cycle are being deleted (no condition says why yet): the job does
    not go back to queued (issue 18 item 12); a suspended TrainJob (Kueue's requeue) still reads queued."""
    running = condense_pod(_chain_pod(f"{NAME}-node-0-0-aaaaa", 0), "dispatch.dev")
    deleting = _chain_pod(f"{NAME}-node-0-0-aaaaa", 0)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:07Z"
    watched = [
        Watched(
            key=(JOB, 1),
            namespace=NS,
            trainjob_name=NAME,
            memory={running["uid"]: running},
            identity_warned=False,
        )
    ]
    now = datetime(2026, 11, 30, 10, 0, 8, tzinfo=UTC)
    objects = [*_observed_objects(failed=False), deleting]
    status = derive_all(StaticIndex(objects, ["dispatch.dev"]), watched, now=now, thresholds=Thresholds())
    assert status[(JOB, 1)].state == "running"
    suspended = [dict(o) for o in objects]
    suspended[0] = {**suspended[0], "spec": {"suspend": True}}
    requeued = derive_all(StaticIndex(suspended, ["dispatch.dev"]), watched, now=now, thresholds=Thresholds())
    assert requeued[(JOB, 1)].state == "queued"


def test_a_kueue_workload_counts_when_the_trainjob_owns_it() -> None:
    """Kueue's Workload is one more kind in the owner chain (a controller ownerReference to the TrainJob):
    once a source reads Workloads, the derivation's Kueue branches see it; one owned by another TrainJob of
    the same name (another UID) does not count."""
    evicted = {
        "type": "Evicted",
        "status": "True",
        "reason": "Preempted",
        "message": "Preempted to accommodate a workload",
        "lastTransitionTime": "2026-11-30T10:00:05Z",
    }
    ours: dict[str, Any] = {
        "kind": "Workload",
        "metadata": {
            "namespace": NS,
            "name": f"trainjob-{NAME}-1a2b3",
            "uid": "wl-1",
            **_owner("TrainJob", NAME),
        },
        "status": {"conditions": [evicted]},
    }
    theirs = {
        **ours,
        "metadata": {
            **ours["metadata"],
            "uid": "wl-2",
            "ownerReferences": [{"kind": "TrainJob", "name": NAME, "uid": "another-uid", "controller": True}],
        },
    }
    objects = _observed_objects(failed=False)
    objects[0] = {**objects[0], "spec": {"suspend": True}}
    watched = [Watched(key=(JOB, 1), namespace=NS, trainjob_name=NAME, memory={}, identity_warned=False)]
    now = datetime(2026, 11, 30, 10, 0, 8, tzinfo=UTC)
    with_ours = derive_all(
        StaticIndex([*objects, ours], ["dispatch.dev"]), watched, now=now, thresholds=Thresholds()
    )
    assert (with_ours[(JOB, 1)].state, with_ours[(JOB, 1)].cause) == ("failed", "preempted")
    assert (with_ours[(JOB, 1)].deactivate or {})["uid"] == "wl-1"
    only_theirs = derive_all(
        StaticIndex([*objects, theirs], ["dispatch.dev"]), watched, now=now, thresholds=Thresholds()
    )
    assert only_theirs[(JOB, 1)].cause is None and only_theirs[(JOB, 1)].deactivate is None


# ---------------------------------------------------------------- a disrupted pod no cycle ever read

POD_NAME = f"{NAME}-node-0-1-abcde"


def _event(reason: str, message: str, uid: str) -> dict[str, Any]:
    return {
        "kind": "Event",
        "metadata": {"name": f"{POD_NAME}.{uid}", "namespace": NS, "uid": uid},
        "involvedObject": {"kind": "Pod", "name": POD_NAME, "namespace": NS, "uid": "pod-never-seen"},
        "reason": reason,
        "message": message,
        "lastTimestamp": "2026-11-30T10:00:05Z",
    }


def _named_by_the_job(events: list[dict[str, Any]]) -> StaticIndex:
    """The Job failed through a runtime's FailJob rule on DisruptionTarget; the pod is gone, never read."""
    observed = _observed()
    objects = [o for key in observed._named.values() for o in key]
    for obj in objects:
        if obj["kind"] == "Job":
            obj["status"]["conditions"] = [
                {
                    "type": "FailureTarget",
                    "status": "True",
                    "reason": "PodFailurePolicy",
                    "message": (
                        f"Pod {NS}/{POD_NAME} has condition DisruptionTarget matching FailJob rule at index 0"
                    ),
                }
            ]
    return StaticIndex([*objects, *events], ["dispatch.dev"])


def _never_read(events: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> Any:
    watched = [Watched(key=(JOB, 1), namespace=NS, trainjob_name=NAME, memory={}, identity_warned=False)]
    source = _named_by_the_job(events)
    statuses = derive_all(
        source,
        watched,
        now=datetime(2026, 11, 30, 10, 0, 8, tzinfo=UTC),
        thresholds=Thresholds(),
        tombstones={},
        nodes=nodes,
    )
    return statuses[(JOB, 1)]


SCHEDULED = _event("Scheduled", f"Successfully assigned {NS}/{POD_NAME} to kwok-node-0", "ev-scheduled")


def test_a_disrupted_pod_gone_before_any_cycle_read_it_is_evicted_on_the_right_rank() -> None:
    """The Eviction API leaves no event: the Job's failure names the pod, and nothing else took it."""
    status = _never_read([SCHEDULED], NODES)
    assert (status.state, status.cause, status.rank) == ("failed", "evicted", 1)
    assert "Job jabcdefghij-1-node-0's failure names it" in status.message
    assert any("DisruptionTarget matching FailJob" in str(e["value"]) for e in status.evidence)


def test_without_the_jobs_words_the_same_gone_pod_is_still_unexplained() -> None:
    """A Job that failed with BackoffLimitExceeded (no rule could be added to its runtime) says nothing."""
    watched = [Watched(key=(JOB, 1), namespace=NS, trainjob_name=NAME, memory={}, identity_warned=False)]
    status = derive_all(
        StaticIndex([*[o for v in _observed()._named.values() for o in v], SCHEDULED], ["dispatch.dev"]),
        watched,
        now=datetime(2026, 11, 30, 10, 0, 8, tzinfo=UTC),
        thresholds=Thresholds(),
        tombstones={},
        nodes=NODES,
    )[(JOB, 1)]
    assert (status.state, status.cause) == ("failed", "unknown-failure")


def test_the_schedulers_preempted_event_makes_the_gone_pod_preempted() -> None:
    preempted = _event("Preempted", "Preempted by pod 1234 on node kwok-node-0", "ev-preempted")
    status = _never_read([SCHEDULED, preempted], NODES)
    assert (status.state, status.cause, status.rank) == ("failed", "preempted", 1)


def test_the_node_its_scheduled_event_names_is_read_and_when_gone_it_is_node_lost() -> None:
    from jobs.supervision.nodes import needs_nodes

    source = _named_by_the_job([SCHEDULED])
    objects = [o for v in source._named.values() for o in v] + source.events_of_pod(NS, POD_NAME)
    assert needs_nodes(objects, {}, []) == {"kwok-node-0"}  # the cycle reads that node by name
    status = _never_read([SCHEDULED], [])  # ... and it was not found
    assert (status.state, status.cause, status.rank) == ("failed", "node-lost", 1)
    assert "kwok-node-0" in status.message


def test_a_pod_the_memory_holds_that_is_no_longer_read_needs_its_node() -> None:
    """A pod deleted with its Job between two cycles (its TrainJob deleted outside dispatch, say) is gone as
    of this cycle: its node is read, so an existing node is not taken for a lost one."""
    from jobs.supervision.nodes import needs_nodes

    remembered = {"pod-1": condense_pod(_pod(disrupted=False), "dispatch.dev")}
    assert needs_nodes([_pod(disrupted=False)], remembered, []) == set()  # running: no read
    assert needs_nodes([], remembered, []) == {"kwok-node-0"}
    watched = [
        Watched(key=(JOB, 1), namespace=NS, trainjob_name=NAME, memory=remembered, identity_warned=False)
    ]
    status = derive_all(
        StaticIndex([], ["dispatch.dev"]),
        watched,
        now=datetime(2026, 11, 30, 10, 0, 8, tzinfo=UTC),
        thresholds=Thresholds(),
        nodes=NODES,  # what the cycle read, now that it asks
    )[(JOB, 1)]
    assert (status.state, status.cause, status.message) == ("cancelled", "cancelled", TRAINJOB_GONE)


# ---------------------------------------------------------------- the TrainJob by the UID its start recorded


def _trainjob(uid: str) -> dict[str, Any]:
    return {"kind": "TrainJob", "metadata": {"namespace": NS, "name": NAME, "uid": uid, "labels": LABELS}}


def _watched(trainjob_uid: str) -> Watched:
    return Watched(
        key=(JOB, 1),
        namespace=NS,
        trainjob_name=NAME,
        memory={},
        identity_warned=False,
        trainjob_uid=trainjob_uid,
    )


def test_a_trainjob_under_the_jobs_name_and_labels_with_another_uid_is_a_strangers() -> None:
    """The TrainJob was deleted outside dispatch and another made under its name and labels: it is not the
    execution's (whose TrainJob is gone) but a stranger's, named as one. A row without a recorded UID (from
    before the field) goes by name and label, as before."""
    source = StaticIndex([_trainjob("uid-theirs")], ["dispatch.dev"])
    ours = _watched("uid-ours")
    grouped = owned_objects(source, ours)
    assert grouped.objects == []
    assert [w["object"] for w in grouped.strangers] == [f"TrainJob {NS}/{NAME}"]
    assert (
        "not the TrainJob dispatch created (UID uid-theirs, not uid-ours)" in grouped.strangers[0]["message"]
    )
    status = derive_all(
        source, [ours], now=datetime(2026, 11, 30, 10, 0, 8, tzinfo=UTC), thresholds=Thresholds()
    )
    assert status[(JOB, 1)].message == TRAINJOB_GONE
    # The recorded UID: the TrainJob is the execution's.
    assert owned_objects(source, replace(ours, trainjob_uid="uid-theirs")).objects == [
        _trainjob("uid-theirs")
    ]
    older = owned_objects(source, replace(ours, trainjob_uid=""))
    assert older.objects == [_trainjob("uid-theirs")] and older.strangers == []


def test_a_trainjob_the_api_server_has_under_another_uid_confirms_the_jobs_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """_gone_unconfirmed's one GET: an answer with the recorded UID (the watch has not delivered it yet), or
    any answer for a row without one, keeps the execution for the next cycle; another UID confirms that the
    execution's TrainJob is gone."""
    answers = {"theirs": _trainjob("uid-theirs"), "ours": _trainjob("uid-ours")}
    answer: list[str] = []
    monkeypatch.setattr(cycle.gateway, "get_namespaced", lambda kind, ns, name: answers[answer[0]])
    gone = {(JOB, 1): DerivedStatus(state="cancelled", cause="cancelled", message=TRAINJOB_GONE)}

    def unconfirmed(recorded: str, served: str) -> bool:
        answer[:] = [served]
        return (JOB, 1) in cycle._gone_unconfirmed(gone, [_watched(recorded)])

    assert not unconfirmed("uid-ours", "theirs")
    assert unconfirmed("uid-ours", "ours")
    assert unconfirmed("", "theirs")
