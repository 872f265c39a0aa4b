"""scripts/identity_observer.py, the pure part (scripts/identity_verdict.py): pod observations in, records
out; records in, verdict out.

The pods are API objects as the API server serves them (camelCase dicts), shaped like the ones JobSet, the Job
controller and KWOK produce on the local control plane (tests/scripts/test_identity_observer_cluster.py runs
the same decisions on real pods). No cluster, no database.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from scripts.identity_observer import (
    ATTEMPT_OVERLAP,
    IDENTITY_CONFLICT,
    NO_ATTEMPT,
    NO_COMPLETION_INDEX,
    RAN_TWICE,
    RESTARTED_IN_PLACE,
    TRAINJOB_DUPLICATE,
    attempt_overlaps,
    mark_vanished,
    observe,
    observe_trainjob,
    ranks_seen,
    trainjob_duplicates,
    verdict,
)

REPO = Path(__file__).resolve().parents[2]
T0 = "2026-12-01T10:00:00+00:00"


def _at(second: int) -> str:
    return f"2026-12-01T10:00:{second:02d}+00:00"


def pod(
    uid: str,
    *,
    job: str | None = "jaaaaaaaaaa",
    attempt: str | None = "1",
    rank: str | None = "0",
    restart_attempt: str = "0",
    replicated_job: str = "node",
    job_index: str = "0",
    namespace: str = "team",
    phase: str = "Running",
    publish: str = "env",
    restart_count: int = 0,
    last_terminated: dict[str, Any] | None = None,
    sidecar: dict[str, Any] | None = None,
    owner_kind: str | None = "Job",
    labels: dict[str, str] | None = None,
    container_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A JobSet rank pod. publish: where DISPATCH_JOB/DISPATCH_ATTEMPT are ("env": container node;
    "initContainer": init container identity). sidecar: {"restart_count": n} adds a sidecar init container."""
    identity: list[dict[str, Any]] = [{"name": "DISPATCH_JOB", "value": job}] if job is not None else []
    if attempt is not None:
        identity.append({"name": "DISPATCH_ATTEMPT", "value": attempt})
    identity.append(
        {
            "name": "DISPATCH_RANK",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
            },
        }
    )
    node_env: list[dict[str, Any]] = [{"name": "LEARNING_RATE", "value": "0.1"}]
    node = {"name": "node", "image": "localhost/trainer:v1", "env": node_env}
    init: list[dict[str, Any]] = []
    if publish == "env":
        node_env += identity
    else:
        init.append({"name": "identity", "image": "localhost/identity:v1", "env": identity})
    if sidecar is not None:
        init.append({"name": "proxy", "image": "localhost/proxy:v1", "restartPolicy": "Always"})
    jobset_labels = {
        "jobset.sigs.k8s.io/jobset-name": "train",
        "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
        "jobset.sigs.k8s.io/job-index": job_index,
        "jobset.sigs.k8s.io/restart-attempt": restart_attempt,
        "dispatch.dev/job": str(job),
    }
    if rank is not None:
        jobset_labels["batch.kubernetes.io/job-completion-index"] = rank
    running = phase == "Running"
    state = container_state or (
        {"running": {"startedAt": T0}}
        if running
        else {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": T0, "finishedAt": _at(5)}}
        if phase in ("Succeeded", "Failed")
        else {"waiting": {"reason": "ContainerCreating"}}
    )
    statuses = (
        []
        if phase == "Pending" and container_state is None
        else [
            {
                "name": "node",
                "restartCount": restart_count,
                "state": state,
                "lastState": {"terminated": last_terminated} if last_terminated else {},
            }
        ]
    )
    init_statuses = []
    if sidecar is not None:
        init_statuses.append(
            {
                "name": "proxy",
                "restartCount": sidecar.get("restart_count", 0),
                "state": {"running": {"startedAt": T0}},
                "lastState": (
                    {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": T0, "finishedAt": T0}}
                    if sidecar.get("restart_count")
                    else {}
                ),
            }
        )
    owners = (
        [
            {
                "apiVersion": "batch/v1",
                "kind": owner_kind,
                "name": "train-node-0",
                "uid": "job-uid",
                "controller": True,
            }
        ]
        if owner_kind
        else []
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "uid": uid,
            "name": f"train-node-0-{rank}-{uid[-5:]}",
            "namespace": namespace,
            "labels": {**jobset_labels, **(labels or {})},
            "annotations": {"batch.kubernetes.io/job-completion-index": rank} if rank is not None else {},
            "ownerReferences": owners,
            "resourceVersion": "1",
        },
        "spec": {"restartPolicy": "Never", "initContainers": init, "containers": [node]},
        "status": {"phase": phase, "containerStatuses": statuses, "initContainerStatuses": init_statuses},
    }


def record(*observations: tuple[dict[str, Any], str], start: int = 0) -> dict[str, Any]:
    """One pod's record after these (pod, event) observations, one second apart."""
    current = None
    for i, (obj, event) in enumerate(observations):
        current = observe(current, obj, event=event, at=_at(start + i))
    assert current is not None
    return current


def ran(uid: str, start: int = 0, **kw: Any) -> dict[str, Any]:
    """A pod seen created Pending, then Running, then Failed (exit 3)."""
    return record(
        (pod(uid, phase="Pending", **kw), "ADDED"),
        (pod(uid, phase="Running", **kw), "MODIFIED"),
        (pod(uid, phase="Failed", **kw), "MODIFIED"),
        start=start,
    )


def uids(finding: dict[str, Any]) -> list[str]:
    return [p["uid"] for p in finding["pods"]]


def judge(records: Iterable[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return verdict(list(records), **kw)


# ---------------------------------------------------------------- records


def test_one_pod_seen_in_many_events_and_a_relist_is_one_record_with_its_phase_history() -> None:
    uid = "u-0000000001"
    r = record(
        (pod(uid, phase="Pending"), "LISTED"),
        (pod(uid, phase="Pending"), "MODIFIED"),
        (pod(uid, phase="Running"), "MODIFIED"),
        (pod(uid, phase="Running"), "LISTED"),
        (pod(uid, phase="Succeeded"), "MODIFIED"),
        (pod(uid, phase="Succeeded"), "DELETED"),
    )
    assert r["events"] == 6
    assert [(p["phase"], p["at"]) for p in r["phases"]] == [
        ("Pending", _at(0)),
        ("Running", _at(2)),
        ("Succeeded", _at(4)),
    ]
    assert (r["first_seen"], r["running_seen_at"], r["terminated_at"], r["deleted_at"]) == (
        _at(0),
        _at(2),
        _at(4),
        _at(5),
    )
    assert r["ran"] and r["started_at"] == T0
    assert (r["job"], r["attempt"], r["restart_attempt"], r["replicated_job"], r["job_index"], r["rank"]) == (
        "jaaaaaaaaaa",
        "1",
        "0",
        "node",
        "0",
        "0",
    )
    assert r["identity_source"] == "container node"
    assert r["owner_references"] == [
        {"kind": "Job", "name": "train-node-0", "uid": "job-uid", "controller": True}
    ]
    v = judge([r])
    assert v["ok"] and v["violations"] == []
    assert v["counts"]["pods_seen"] == 1 and v["counts"]["rank_pods"] == 1 and v["counts"]["identities"] == 1


def test_a_deleted_event_keeps_the_last_state_and_a_vanished_pod_keeps_its_record() -> None:
    uid = "u-0000000002"
    r = record((pod(uid, phase="Running", restart_count=1), "ADDED"), (pod(uid, phase="Running"), "DELETED"))
    assert r["containers"]["node"]["restart_count"] == 1  # the highest ever seen, not the last
    assert r["deleted_at"] == _at(1) and r["vanished_at"] is None
    assert mark_vanished(r, at=_at(9)) == r  # it was seen deleted: nothing vanished

    seen_once = record((pod("u-0000000003"), "LISTED"))
    gone = mark_vanished(seen_once, at=_at(9))
    assert gone["vanished_at"] == _at(9) and gone["ran"] and gone["phases"] == seen_once["phases"]


def test_a_pod_seen_only_after_it_ended_ran_if_a_container_started() -> None:
    assert record((pod("u-0000000004", phase="Succeeded"), "LISTED"))["ran"]
    assert not record((pod("u-0000000005", phase="Pending"), "ADDED"))["ran"]
    # Rejected by the kubelet before any container started: Failed, but it never ran.
    rejected = pod("u-0000000006", phase="Failed", container_state={"terminated": {"exitCode": 137}})
    assert not record((rejected, "ADDED"))["ran"]


def test_the_identity_is_read_from_the_init_container_dispatch_publishes_into() -> None:
    r = record((pod("u-0000000007", publish="initContainer"), "ADDED"))
    assert (r["job"], r["attempt"], r["identity_source"]) == ("jaaaaaaaaaa", "1", "initContainer identity")


# ---------------------------------------------------------------- ran twice


def test_a_replacement_that_ran_under_the_same_identity_is_a_violation_with_both_pods() -> None:
    first, second = ran("u-first00001"), ran("u-second0001", start=20)
    v = judge([second, first])
    assert not v["ok"]
    [finding] = v["violations"]
    assert finding["kind"] == RAN_TWICE
    identity = {k: finding[k] for k in ("namespace", "job", "attempt", "restart_attempt", "replicated_job")}
    assert identity == {
        "namespace": "team",
        "job": "jaaaaaaaaaa",
        "attempt": "1",
        "restart_attempt": "0",
        "replicated_job": "node",
    }
    assert (finding["job_index"], finding["rank"]) == ("0", "0")
    assert uids(finding) == ["u-first00001", "u-second0001"]  # in the order they appeared
    assert finding["pods"][0]["name"] == first["name"] and finding["pods"][0]["namespace"] == "team"
    assert finding["pods"][1]["running_seen_at"] == _at(21)
    assert finding["pods"][0]["phases"] == ["Pending", "Running", "Failed"]
    assert (v["counts"]["rank_pods"], v["counts"]["identities"], v["counts"]["violations"]) == (2, 1, 1)


def test_a_pod_created_and_deleted_while_pending_never_ran_so_its_replacement_is_no_rerun() -> None:
    pending = record(
        (pod("u-pending0001", phase="Pending"), "ADDED"), (pod("u-pending0001", phase="Pending"), "DELETED")
    )
    v = judge([pending, ran("u-running0001", start=5)])
    assert v["ok"] and v["violations"] == []
    assert (v["counts"]["rank_pods"], v["counts"]["rank_pods_ran"], v["counts"]["identities"]) == (2, 1, 1)


@pytest.mark.parametrize(
    "other",
    [
        {"restart_attempt": "1"},  # the JobSet restarted: J differs
        {"attempt": "2"},  # dispatch's next attempt
        {"rank": "1"},
        {"job_index": "1"},  # another Job of the same replicated job
        {"replicated_job": "launcher"},
        {"job": "jbbbbbbbbbb"},
    ],
)
def test_pods_that_differ_in_any_part_of_the_identity_are_different_ranks(other: dict[str, str]) -> None:
    v = judge([ran("u-one0000001"), ran("u-two0000001", start=5, **other)])
    assert v["ok"] and v["counts"]["identities"] == 2


def test_a_strangers_pod_in_another_namespace_with_the_same_env_and_labels_is_no_rerun() -> None:
    ours, strangers = ran("u-ours000001"), ran("u-stranger01", start=5, namespace="someone-else")
    v = judge([ours, strangers])
    assert v["ok"] and v["counts"]["identities"] == 2  # counted under its own namespace
    scoped = judge([ours, strangers], namespaces={"team"})
    assert (
        scoped["ok"]
        and scoped["counts"]["pods_outside_namespaces"] == 1
        and scoped["counts"]["rank_pods"] == 1
    )
    # ...but the stranger's own rerun, in its own namespace, is reported there unless scoped away.
    rerun = judge([ours, strangers, ran("u-stranger02", start=9, namespace="someone-else")])
    [finding] = rerun["violations"]
    assert finding["namespace"] == "someone-else" and uids(finding) == ["u-stranger01", "u-stranger02"]
    assert judge([ours, strangers, ran("u-stranger02", namespace="someone-else")], namespaces={"team"})["ok"]


# ---------------------------------------------------------------- restarted in place


def test_a_restart_count_or_a_last_terminated_state_on_a_regular_container_is_a_violation() -> None:
    counted = record((pod("u-restart0001", restart_count=1), "MODIFIED"))
    last = {"exitCode": 1, "reason": "Error", "startedAt": T0, "finishedAt": T0}
    terminated_before = record((pod("u-laststate01", rank="1", last_terminated=last), "MODIFIED"), start=1)
    all_restarting = record(
        (
            pod(
                "u-allrestart1",
                rank="2",
                restart_count=1,
                last_terminated={"exitCode": 137, "reason": "RestartingAllContainers"},
            ),
            "MODIFIED",
        ),
        start=2,
    )
    v = judge([counted, terminated_before, all_restarting])
    assert [(f["kind"], f["rank"]) for f in v["violations"]] == [
        (RESTARTED_IN_PLACE, "0"),
        (RESTARTED_IN_PLACE, "1"),
        (RESTARTED_IN_PLACE, "2"),
    ]
    assert v["violations"][1]["containers"] == [
        {"container": "node", "restart_count": 0, "last_terminated": last}
    ]
    assert uids(v["violations"][0]) == ["u-restart0001"]


def test_a_sidecar_restart_is_no_violation() -> None:
    r = record((pod("u-sidecar0001", sidecar={"restart_count": 3}), "MODIFIED"))
    assert r["containers"]["proxy"]["kind"] == "sidecar" and r["containers"]["proxy"]["restart_count"] == 3
    assert judge([r])["ok"]


# ---------------------------------------------------------------- nothing waived, excluded, anomalies


def test_every_jobs_rerun_is_a_violation_none_is_waived() -> None:
    """The verdict takes no list of jobs to let off (the chaos harness once waived every job whose plan
    carried an identity warning: a regression in that warning would have moved the expectation with it)."""
    import inspect

    assert list(inspect.signature(verdict).parameters) == ["records", "namespaces"]
    both = [ran("u-one0000001"), ran("u-one0000002", start=5)]
    other = [ran("u-other00001", job="jbbbbbbbbbb"), ran("u-other00002", start=5, job="jbbbbbbbbbb")]
    v = judge([*both, *other])
    assert [f["job"] for f in v["violations"]] == ["jaaaaaaaaaa", "jbbbbbbbbbb"] and "allowed" not in v


def test_pods_that_are_not_dispatch_job_ranks_are_counted_and_never_judged() -> None:
    no_env = [
        ran("u-noenv00001", job=None, attempt=None),
        ran("u-noenv00002", start=5, job=None, attempt=None),
    ]
    # jobs/sessions.py: DISPATCH_JOB=<session id>, DISPATCH_ATTEMPT=1, no session label on the pods (a label
    # <domain>/session=<id> would do too).
    sessions = [
        ran("u-session001", job="saaaaaaaaaa"),
        ran("u-session002", start=5, job="saaaaaaaaaa"),
        ran("u-session003", job="jcccccccccc", labels={"dispatch.dev/session": "jcccccccccc"}),
        ran("u-session004", start=5, job="jcccccccccc", labels={"dispatch.dev/session": "jcccccccccc"}),
    ]
    bare = [ran("u-bare000001", owner_kind=None), ran("u-bare000002", start=5, owner_kind=None)]
    v = judge([*no_env, *sessions, *bare])
    assert v["ok"]
    counts = v["counts"]
    assert (
        counts["not_dispatch_pods"],
        counts["session_pods"],
        counts["dispatch_env_not_job_controlled"],
    ) == (2, 4, 2)
    assert counts["rank_pods"] == 0 and counts["pods_seen"] == 8
    # A session label naming another id does not make a job's pod a session's.
    mislabelled = ran("u-mislabel01", labels={"dispatch.dev/session": "sbbbbbbbbbb"})
    assert judge([mislabelled])["counts"]["rank_pods"] == 1


def test_two_containers_carrying_different_identities_are_an_anomaly_and_node_wins() -> None:
    body = pod("u-conflict01", publish="initContainer")
    # A runtime stating its own DISPATCH_* on node while the site publishes into an init container.
    body["spec"]["containers"][0]["env"] += [
        {"name": "DISPATCH_JOB", "value": "jstaticvalue"},
        {"name": "DISPATCH_ATTEMPT", "value": "1"},
    ]
    r = record((body, "ADDED"))
    assert (r["job"], r["identity_source"]) == ("jstaticvalue", "container node")
    v = judge([r])
    assert not v["ok"] and v["violations"] == []
    [anomaly] = v["anomalies"]
    assert anomaly["kind"] == IDENTITY_CONFLICT
    assert {(e["container"], e["job"]) for e in anomaly["identity_env"]} == {
        ("identity", "jaaaaaaaaaa"),
        ("node", "jstaticvalue"),
    }


def test_a_rank_pod_without_completion_index_or_attempt_is_an_anomaly_not_a_guess() -> None:
    no_index = [ran("u-noindex001", rank=None), ran("u-noindex002", start=5, rank=None)]
    v = judge([*no_index, ran("u-noattempt1", attempt=None, rank="3")])
    assert v["violations"] == [] and not v["ok"]
    assert sorted(a["kind"] for a in v["anomalies"]) == [NO_ATTEMPT, NO_COMPLETION_INDEX, NO_COMPLETION_INDEX]


# ---------------------------------------------------------------- the CLI on an earlier report


def test_the_cli_judges_an_earlier_reports_records_again(tmp_path: Path) -> None:
    records = [ran("u-first00001"), ran("u-second0001", start=5)]
    earlier = tmp_path / "report.json"
    earlier.write_text(json.dumps({"records": records, "watch": {"gaps": []}, "verdict": judge(records)}))

    def cli(*args: str) -> tuple[int, dict[str, Any]]:
        out = tmp_path / "again.json"
        script = str(REPO / "scripts" / "identity_observer.py")
        run = subprocess.run(
            [sys.executable, script, "--from-report", str(earlier), "--out", str(out), *args],
            capture_output=True,
            text=True,
            check=False,
        )
        return run.returncode, json.loads(out.read_text())

    code, report = cli()
    assert code == 1 and [uids(f) for f in report["verdict"]["violations"]] == [
        ["u-first00001", "u-second0001"]
    ]
    code, report = cli("--namespace", "elsewhere")
    assert code == 0 and report["verdict"]["counts"]["pods_outside_namespaces"] == 2


# ---------------------------------------------------------------- attempts overlapping


def at_rv(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}


def attempt_pod(uid: str, attempt: str, rank: str, *, ran_rv: int, ended_rv: int | None) -> dict[str, Any]:
    """A rank pod of attempt `attempt` seen Running at resourceVersion ran_rv and deleted at ended_rv (None:
    still running at the end)."""
    observations = [
        (at_rv(pod(uid, attempt=attempt, rank=rank, phase="Pending"), ran_rv - 1), "ADDED"),
        (at_rv(pod(uid, attempt=attempt, rank=rank, phase="Running"), ran_rv), "MODIFIED"),
    ]
    if ended_rv is not None:
        observations.append(
            (at_rv(pod(uid, attempt=attempt, rank=rank, phase="Running"), ended_rv), "DELETED")
        )
    return record(*observations)


def test_a_pod_of_attempt_2_running_before_the_last_pod_of_attempt_1_ended_is_an_overlap() -> None:
    one = [
        attempt_pod("u-a1r0", "1", "0", ran_rv=10, ended_rv=30),
        attempt_pod("u-a1r1", "1", "1", ran_rv=11, ended_rv=50),
    ]
    early = [
        attempt_pod("u-a2r0", "2", "0", ran_rv=45, ended_rv=None),
        attempt_pod("u-a2r1", "2", "1", ran_rv=60, ended_rv=None),
    ]
    [overlap] = attempt_overlaps([*one, *early])
    assert overlap["kind"] == ATTEMPT_OVERLAP
    assert (overlap["job"], overlap["earlier_attempt"], overlap["later_attempt"]) == ("jaaaaaaaaaa", 1, 2)
    assert overlap["compared_by"] == "resourceVersion"
    assert (overlap["later_pod_ran"]["uid"], overlap["later_pod_ran"]["ran_rv"]) == ("u-a2r0", 45)
    assert (overlap["earlier_pod_ended"]["uid"], overlap["earlier_pod_ended"]["ended_rv"]) == ("u-a1r1", 50)
    # The same pods once attempt 1's last pod ended first: none. (The observer's clock says the opposite
    # here, one second per observation: the resourceVersions decide.)
    late = [attempt_pod("u-a2r0", "2", "0", ran_rv=51, ended_rv=None)]
    assert attempt_overlaps([*one, *late]) == []


def test_an_earlier_attempt_never_seen_ending_still_runs_and_pods_that_never_ran_do_not_count() -> None:
    running = attempt_pod("u-a1r0", "1", "0", ran_rv=10, ended_rv=None)
    later = attempt_pod("u-a3r0", "3", "0", ran_rv=99, ended_rv=None)
    assert [(o["earlier_attempt"], o["later_attempt"]) for o in attempt_overlaps([running, later])] == [
        (1, 3)
    ]
    never_ran = record(
        (at_rv(pod("u-a1pend", phase="Pending"), 5), "ADDED"),
        (at_rv(pod("u-a1pend", phase="Pending"), 6), "DELETED"),
    )
    assert attempt_overlaps([never_ran, later]) == []
    # Other jobs, other namespaces, sessions and bare pods are not attempts of this job.
    assert (
        attempt_overlaps([running, record((at_rv(pod("u-b", job="jbbbbbbbbbb", attempt="2"), 20), "ADDED"))])
        == []
    )
    assert attempt_overlaps([running, later], namespaces={"elsewhere"}) == []


def test_a_vanished_pod_ended_at_the_relist_that_missed_it() -> None:
    seen = attempt_pod("u-a1r0", "1", "0", ran_rv=10, ended_rv=None)
    gone = mark_vanished(seen, at=_at(40), rv=70)
    assert (gone["ended_rv"], gone["ended_seen_at"]) == (70, _at(40))
    assert attempt_overlaps([gone, attempt_pod("u-a2r0", "2", "0", ran_rv=65, ended_rv=None)])
    assert not attempt_overlaps([gone, attempt_pod("u-a2r0", "2", "0", ran_rv=71, ended_rv=None)])


def test_records_of_several_clusters_are_ordered_by_the_observers_clock() -> None:
    first = record((at_rv(pod("u-c1"), 900), "MODIFIED"), (at_rv(pod("u-c1"), 901), "DELETED"), start=0)
    first["cluster"] = "worker-1"
    second = record((at_rv(pod("u-c2", attempt="2"), 5), "MODIFIED"), start=3)  # a later moment, lower rv
    second["cluster"] = "worker-2"
    assert attempt_overlaps([first, second]) == []
    early = record((at_rv(pod("u-c3", attempt="2"), 5), "MODIFIED"), start=0)
    early["cluster"] = "worker-2"
    [overlap] = attempt_overlaps([first, early])
    assert overlap["compared_by"] == "the observer's clock"


# ---------------------------------------------------------------- coverage and TrainJob duplicates


def test_ranks_seen_counts_each_rank_that_ran_once_per_wanted_attempt() -> None:
    records = [
        ran("u-r0"),
        ran("u-r0-again", start=5),  # the same rank twice: one rank seen
        record((pod("u-r1", rank="1", phase="Pending"), "ADDED")),  # never ran
        ran("u-bare", rank="1", owner_kind=None),  # not made by a Job
        ran("u-other", attempt="2", rank="1"),
    ]
    wanted = {
        ("team", "jaaaaaaaaaa", "1"): 2,
        ("team", "jaaaaaaaaaa", "2"): 2,
        ("team", "jzzzzzzzzzz", "1"): 2,
    }
    assert ranks_seen(records, wanted) == {
        ("team", "jaaaaaaaaaa", "1"): 1,
        ("team", "jaaaaaaaaaa", "2"): 1,
        ("team", "jzzzzzzzzzz", "1"): 0,
    }


def trainjob(uid: str, name: str, labels: dict[str, str], *, namespace: str = "team") -> dict[str, Any]:
    return {
        "metadata": {
            "uid": uid,
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "resourceVersion": "7",
        }
    }


def test_two_uids_under_one_name_or_one_job_and_attempt_are_a_duplicate() -> None:
    labels = {"dispatch.dev/job": "jaaaaaaaaaa", "dispatch.dev/attempt": "1"}
    first = observe_trainjob(None, trainjob("t-1", "jaaaaaaaaaa-1", labels), event="ADDED", at=_at(0))
    first = observe_trainjob(first, trainjob("t-1", "jaaaaaaaaaa-1", labels), event="DELETED", at=_at(1))
    again = observe_trainjob(None, trainjob("t-2", "jaaaaaaaaaa-1", labels), event="ADDED", at=_at(2))
    [duplicate] = trainjob_duplicates([first, again])
    # One finding for the pair: by (job, attempt) from the labels (the same pair by name is not repeated).
    assert duplicate["kind"] == TRAINJOB_DUPLICATE
    assert (duplicate["by"], duplicate["key"]) == ("labels", "jaaaaaaaaaa/1")
    assert [(t["uid"], t["deleted_at"]) for t in duplicate["trainjobs"]] == [("t-1", _at(1)), ("t-2", None)]
    # Another name, the same job and attempt by its labels; the same name without labels.
    renamed = observe_trainjob(None, trainjob("t-3", "other-name", labels), event="ADDED", at=_at(3))
    [by_labels] = trainjob_duplicates([first, renamed])
    assert (by_labels["by"], by_labels["key"]) == ("labels", "jaaaaaaaaaa/1")
    unlabelled = observe_trainjob(None, trainjob("t-6", "jaaaaaaaaaa-1", {}), event="ADDED", at=_at(6))
    [by_name] = trainjob_duplicates([first, unlabelled])
    assert (by_name["by"], by_name["key"]) == ("name", "jaaaaaaaaaa-1")
    # Attempt 2 is another TrainJob; the same name in another namespace is another TrainJob.
    attempt_2 = {"dispatch.dev/job": "jaaaaaaaaaa", "dispatch.dev/attempt": "2"}
    next_one = observe_trainjob(None, trainjob("t-4", "jaaaaaaaaaa-2", attempt_2), event="ADDED", at=_at(4))
    elsewhere = observe_trainjob(
        None, trainjob("t-5", "jaaaaaaaaaa-1", labels, namespace="other"), event="ADDED", at=_at(5)
    )
    assert trainjob_duplicates([first, next_one, elsewhere]) == []
    assert trainjob_duplicates([first, again], namespaces={"other"}) == []


def test_session_and_job_ids_as_dispatch_makes_them_are_told_apart() -> None:
    from jobs.models import _new_session_id
    from jobs.naming import new_job_id

    for _ in range(50):
        session, job = _new_session_id(), new_job_id()
        v = judge([ran("u-s" + session, job=session), ran("u-j" + job, job=job)])
        assert (v["counts"]["session_pods"], v["counts"]["rank_pods"]) == (1, 1), (session, job)


def test_clusters_whose_kubeconfigs_share_a_context_name_get_distinct_names(tmp_path: Path) -> None:
    """The local planes' kubeconfigs (manager and workers) all say current-context `dispatch-local`: one
    name for all would compare resourceVersions across API servers and take MultiKueue's copy of a TrainJob
    for a duplicate. Each then carries its file's name; distinct contexts are kept as they are."""
    from scripts.identity_observer import cluster_names

    def kubeconfig(name: str, context: str) -> str:
        path = tmp_path / name
        path.write_text(f"apiVersion: v1\nkind: Config\ncurrent-context: {context}\n")
        return str(path)

    same = [
        kubeconfig("worker-1.kubeconfig", "dispatch-local"),
        kubeconfig("worker-2.kubeconfig", "dispatch-local"),
    ]
    assert cluster_names(same, None) == ["worker-1", "worker-2"]
    distinct = [kubeconfig("a.kubeconfig", "east"), kubeconfig("b.kubeconfig", "west")]
    assert cluster_names(distinct, None) == ["east", "west"]
    assert cluster_names(distinct[:1], None) == [""]
