"""The pure parts of sessions: which runtime can serve one, which pod is the trainer pod, what the error
channel's status means, how a command becomes argv. No DB, no cluster."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from cluster.errors import ClusterUnavailable, NotFound, Rejected
from cluster.exec import PodInfo, parse_exec_status, translate_handshake
from cluster.logs import EventRow
from jobs.models import Session, SessionState
from jobs.objects import is_worker_copy
from jobs.sessions.rules import (
    Chain,
    Placement,
    SessionRequest,
    chained_pods,
    command_argv,
    creation_failure,
    decide_start,
    leftover_pods,
    pick_trainer_pod,
    placement_of,
    session_objects,
    session_runtime_check,
    session_spec,
    trainer_pod_claims,
)
from jobs.spec import RuntimeRef
from runtimes.digest import review_digest, reviewed_metadata
from runtimes.reasons import REVIEW_CONTENT, AllowListMiss, Review

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "dispatch-kind.yaml"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def _plain() -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(FIXTURE.read_text())
    return body


def _mpi(labelled: bool = True, launcher_containers: tuple[str, ...] = ("node",)) -> dict[str, Any]:
    launcher: dict[str, Any] = {
        "name": "launcher",
        "template": {
            "spec": {
                "template": {"spec": {"containers": [{"name": n, "image": "x"} for n in launcher_containers]}}
            }
        },
    }
    if labelled:
        launcher["template"]["metadata"] = {"labels": {ANCESTOR: "trainer"}}
    node = {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [{"name": "node"}]}}}}}
    return {
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "mpi-interactive"},
        "spec": {
            "mlPolicy": {"numNodes": 4, "mpi": {"runLauncherAsNode": True}},
            "template": {"spec": {"replicatedJobs": [launcher, node]}},
        },
    }


def _codes(runtime: dict[str, Any] | None, miss: AllowListMiss | None = None) -> tuple[list[str], str]:
    reasons, job = session_runtime_check(runtime, miss=miss, ref="ClusterTrainingRuntime/x")
    return [r.code for r in reasons], job


def test_an_mpi_runtime_serves_sessions_from_its_labelled_launcher_though_jobs_refuse_it() -> None:
    assert _codes(_mpi()) == ([], "launcher")


def test_without_the_trainer_label_the_launcher_serves_and_a_plain_runtime_cannot() -> None:
    assert _codes(_mpi(labelled=False)) == ([], "launcher")
    plain = _plain()
    del plain["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["metadata"]
    assert _codes(plain) == (["no-trainer-job"], "")


def test_the_trainer_pod_needs_a_container_named_node() -> None:
    codes, job = _codes(_mpi(labelled=False, launcher_containers=("main",)))
    assert (codes, job) == (["no-node-container"], "launcher")
    plain = _plain()
    plain["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]["name"] = "main"
    assert _codes(plain) == (["no-node-container"], "node")


def test_the_job_only_rules_do_not_refuse_a_session_runtime() -> None:
    plain = _plain()
    job = plain["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    del job["backoffLimit"]
    job["template"]["spec"]["restartPolicy"] = "OnFailure"
    assert _codes(plain) == ([], "node")


def test_not_allowed_for_sessions_and_not_found_are_both_reported() -> None:
    miss = AllowListMiss(purpose="sessions", listed_for=("jobs",))
    reasons, _ = session_runtime_check(None, miss=miss, ref="ClusterTrainingRuntime/x")
    assert [r.code for r in reasons] == ["runtime-not-allowed", "runtime-not-found"]
    assert "for jobs only, not for sessions" in reasons[0].message


def test_a_runtime_changed_since_its_review_serves_no_session() -> None:
    reviewed = _plain()
    review = Review(
        REVIEW_CONTENT,
        review_digest(reviewed),
        copy.deepcopy(reviewed["spec"]),
        "reviewed by pat",
        metadata=reviewed_metadata(reviewed),
    )
    assert session_runtime_check(reviewed, miss=None, ref="ClusterTrainingRuntime/x", review=review)[0] == []
    edited = copy.deepcopy(reviewed)
    pod = edited["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["image"] = "registry.example/other:2"
    reasons, _ = session_runtime_check(edited, miss=None, ref="ClusterTrainingRuntime/x", review=review)
    assert [r.code for r in reasons] == ["runtime-changed-since-review"]
    assert "changed since it was reviewed (reviewed by pat)" in reasons[0].message


def _pod(name: str, rjob: str, job_index: int = 0, index: int = 0, deleting: bool = False) -> PodInfo:
    return PodInfo(name, "ns", "Running", rjob, job_index, index, deleting, ("node",), {})


def test_the_trainer_pod_is_never_a_pod_of_another_replicated_job() -> None:
    nodes = [_pod("s-node-0-0", "node"), _pod("s-node-0-1", "node", index=1)]
    assert pick_trainer_pod(nodes, "launcher") is None  # the launcher does not exist yet
    launcher = _pod("s-launcher-0-0", "launcher")
    assert pick_trainer_pod([*nodes, launcher], "launcher") == launcher


def test_the_trainer_pod_is_the_first_index_and_not_one_being_deleted() -> None:
    second = _pod("s-node-0-1", "node", index=1)
    first = _pod("s-node-0-0", "node")
    assert pick_trainer_pod([second, first], "node") == first
    assert pick_trainer_pod([second, _pod("s-node-0-0", "node", deleting=True)], "node") == second


def test_two_pods_at_the_trainer_pods_place_are_neither_taken_and_the_session_says_so() -> None:
    """A pod forged into the owner chain (labels, index and the Job's ownerReference copied) under a name
    that sorts first used to be the trainer pod; now neither is, and a starting session fails naming both."""
    real = _pod("s-node-0-0-bcdfg", "node")
    forged = _pod("s-a", "node")
    assert pick_trainer_pod([real, forged], "node") is None
    claims = trainer_pod_claims([real, forged], "node")
    assert [p.name for p in claims] == ["s-a", "s-node-0-0-bcdfg"]
    session = Session(id="s", name="s", namespace="ns", timeout_seconds=60)
    decision = decide_start(session, None, expired=False, claims=claims)
    assert decision.state == SessionState.FAILED and decision.pod == ""
    assert decision.message.startswith(
        "2 pods claim the trainer pod's place (replicated job 'node', job index 0, completion index 0) in "
        "the owner chain of TrainJob ns/s: s-a (uid ), s-node-0-0-bcdfg (uid )."
    )
    # A negative index is no place a Job gives: it never comes before index 0.
    assert pick_trainer_pod([real, _pod("s-0", "node", index=-1)], "node") == real


def _obj(uid: str, *owners: tuple[str, str, str]) -> dict[str, Any]:
    """An object of this UID naming (kind, name, uid) owners."""
    refs = [{"kind": k, "name": n, "uid": u, "controller": True} for k, n, u in owners]
    return {"metadata": {"uid": uid, "ownerReferences": refs}}


def _owned_pod(name: str, job_uid: str, kind: str = "Job") -> PodInfo:
    return PodInfo(
        name,
        "ns",
        "Running",
        "node",
        0,
        0,
        False,
        ("node",),
        {},
        uid=f"pod-{name}",
        owner_uid=job_uid,
        owner_kind=kind,
        owner_name="s-node-0" if job_uid else "",
    )


# The session "s": its TrainJob (uid tj), its JobSet (js, owned by tj), its Job (job, owned by js).
OURS = {"jobsets": [_obj("js", ("TrainJob", "s", "tj"))], "jobs": [_obj("job", ("JobSet", "s", "js"))]}


def test_only_pods_in_the_recorded_trainjobs_chain_are_the_sessions() -> None:
    ours = _owned_pod("s-node-0-0", "job")
    unowned = _owned_pod("a-stranger", "")  # the session's labels copied, no owner
    by_replicaset = _owned_pod("b-stranger", "rs", kind="ReplicaSet")
    chain = Chain.of(name="s", trainjob_uid="tj", **OURS)
    assert chained_pods([unowned, by_replicaset, ours], chain) == [ours]
    # Somebody's Job carrying the JobSet's name label, owned by a JobSet of another name or by nothing.
    theirs = _owned_pod("c-stranger", "their-job")
    for job in (_obj("their-job", ("JobSet", "other", "js")), _obj("their-job")):
        chain = Chain.of(name="s", trainjob_uid="tj", jobsets=OURS["jobsets"], jobs=[*OURS["jobs"], job])
        assert chained_pods([theirs, ours], chain) == [ours]
    # The TrainJob made again under the name by somebody else: its JobSet and Job are not the session's.
    again = Chain.of(
        name="s",
        trainjob_uid="tj",
        jobsets=[_obj("js2", ("TrainJob", "s", "tj2"))],
        jobs=[_obj("job2", ("JobSet", "s", "js2"))],
    )
    assert chained_pods([_owned_pod("s-node-0-0", "job2")], again) == []
    # Every link must be there: a Job whose JobSet is gone, or no TrainJob UID known, is no trainer pod.
    assert chained_pods([ours], Chain.of(name="s", trainjob_uid="tj", jobsets=[], jobs=OURS["jobs"])) == []
    assert chained_pods([ours], Chain.of(name="s", trainjob_uid="", **OURS)) == []


def test_closing_waits_for_the_sessions_pods_and_those_being_collected_but_not_for_strangers() -> None:
    ours = _owned_pod("s-node-0-0", "job")
    orphan = _owned_pod("s-node-0-1", "gone-job")  # its Job already deleted: the garbage collector takes it
    unowned = _owned_pod("a-stranger", "")
    theirs = _owned_pod("c-stranger", "their-job")
    pods = [ours, orphan, unowned, theirs]
    foreign = _obj("their-job", ("JobSet", "s", "js2"))
    chain = Chain.of(
        name="s",
        trainjob_uid="tj",
        jobsets=[*OURS["jobsets"], _obj("js2", ("TrainJob", "s", "tj2"))],
        jobs=[*OURS["jobs"], foreign],
    )
    assert leftover_pods(pods, chain) == [ours, orphan]
    # The JobSet already gone (deleted with the TrainJob): its Jobs' pods are still waited for.
    gone = Chain.of(name="s", trainjob_uid="tj", jobsets=[], jobs=OURS["jobs"])
    assert leftover_pods([ours, unowned], gone) == [ours]
    # A Job owned by nothing is somebody's own.
    lone = Chain.of(name="s", trainjob_uid="tj", jobsets=[], jobs=[_obj("their-job")])
    assert leftover_pods([theirs], lone) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{metadata: {}, status: Success}", (0, "")),
        (
            '{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code",'
            '"reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}',
            (3, ""),
        ),
        (
            '{"status":"Failure","message":"error executing command","reason":"InternalError"}',
            (None, "error executing command"),
        ),
        ("", (None, "the API server sent no exit status")),
    ],
)
def test_the_exit_code_comes_from_the_error_channel_or_is_none(
    text: str, expected: tuple[int | None, str]
) -> None:
    assert parse_exec_status(text) == expected


def test_a_string_runs_with_sh_c_and_a_list_as_it_is() -> None:
    assert command_argv("echo $(hostname)") == ["sh", "-c", "echo $(hostname)"]
    argv = ["echo", "a b"]
    assert command_argv(argv) == ["echo", "a b"]
    assert command_argv(copy.copy(argv)) is not argv


def test_a_refused_exec_handshake_becomes_the_typed_error_with_the_api_servers_message() -> None:
    body = (
        b'{"kind":"Status","status":"Failure","message":"pods \\"gone\\" not found",'
        b'"reason":"NotFound","code":404}'
    )
    reason = f"Handshake status 404 Not Found -+-+- {{'audit-id': 'x'}} -+-+- {body!r}"
    error = translate_handshake(ApiException(status=0, reason=reason), "Pod ns/gone")
    assert isinstance(error, NotFound)
    assert (error.target, error.message, error.status) == ("Pod ns/gone", 'pods "gone" not found', 404)
    refused = translate_handshake(
        ApiException(status=0, reason=reason.replace("404 Not Found", "400 Bad Request")), "Pod ns/p"
    )
    assert isinstance(refused, Rejected)
    bare = translate_handshake(
        ApiException(status=0, reason="Handshake status 404 Not Found -+-+- {'audit-id': 'x'} -+-+- None"),
        "Pod ns/p",
    )
    assert isinstance(bare, NotFound)
    assert bare.message == "the API server answered HTTP 404 to the exec request"  # no raw headers
    down = translate_handshake(ApiException(status=0, reason="[Errno 111] Connection refused"), "Pod ns/p")
    assert isinstance(down, ClusterUnavailable) and "Connection refused" in down.message


# ---------------------------------------------------------------- a creation failure fails a starting session

CREATED = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


REPORTERS = {
    "TrainJobResourcesCreationFailed": "trainer-trainjob-controller",
    "FailedCreate": "job-controller",
}


def _event(
    seconds: float, kind_name: str, reason: str, message: str = "denied", reporter: str | None = None
) -> EventRow:
    """An Event as its controller reports it (the reporter a real one carries), unless `reporter` says."""
    at = (CREATED + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    who = REPORTERS.get(reason, "kubelet") if reporter is None else reporter
    return EventRow(
        at=at, type="Warning", reason=reason, object=kind_name, message=message, count=1, reporter=who
    )


@pytest.mark.parametrize(
    ("events", "now", "expected"),
    [
        # The Trainer cannot build the JobSet, still 12 s after creation, looked at after 20 s.
        (
            [_event(12, "TrainJob s1", "TrainJobResourcesCreationFailed", "webhook denied")],
            20,
            "the Trainer cannot build the TrainJob's JobSet: webhook denied",
        ),
        # A Job's pods are forbidden (admission, LimitRange).
        (
            [_event(18, "Job s1-node-0", "FailedCreate", "forbidden: maximum cpu")],
            20,
            "Job s1-node-0 cannot create its pods: forbidden: maximum cpu",
        ),
        # Too early to judge: the same failure seen at 10 s.
        ([_event(8, "Job s1-node-0", "FailedCreate")], 10, None),
        # Only right after creation: the Trainer's cache lag on the new runtime copy, already over.
        ([_event(1, "TrainJob s1", "TrainJobResourcesCreationFailed")], 60, None),
        # An exceeded quota may free up: the session keeps waiting (its timeout decides).
        ([_event(30, "Job s1-node-0", "FailedCreate", "exceeded quota: pods")], 40, None),
        # Another session's objects, or another reason.
        ([_event(30, "TrainJob s10", "TrainJobResourcesCreationFailed")], 40, None),
        ([_event(30, "Job s10-node-0", "FailedCreate")], 40, None),
        ([_event(30, "Job s1-node-0", "SuccessfulCreate")], 40, None),
        # Written by a namespace member under another reporter: not evidence (jobs.evidence).
        ([_event(18, "Job s1-node-0", "FailedCreate", reporter="kubectl")], 20, None),
        ([_event(12, "TrainJob s1", "TrainJobResourcesCreationFailed", reporter="")], 20, None),
    ],
)
def test_creation_failure(events: list[EventRow], now: float, expected: str | None) -> None:
    assert creation_failure(events, "s1", CREATED, CREATED + timedelta(seconds=now)) == expected


# ---------------------------------------------------------------- the objects a session is made of


def test_the_keep_alive_replaces_the_launchers_args_and_the_nodes_are_marked_as_peers() -> None:
    """An MPI launcher with args (`mpirun /home/mpiuser/pi`): a TrainJob command alone would leave the args,
    and `sleep infinity /home/mpiuser/pi` exits 1 a second after the open. The other replicated jobs' pods are
    marked peers (their daemons keep running; the local plane keeps them so)."""
    runtime = _mpi()
    launcher = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    launcher["template"]["spec"]["template"]["spec"]["containers"][0] |= {
        "command": ["mpirun"],
        "args": ["/home/mpiuser/pi"],
    }
    session = Session(id="sabc234def2", name="my-session", namespace="team-a")
    request = SessionRequest(
        runtime=RuntimeRef(kind="ClusterTrainingRuntime", name="mpi-interactive"),
        namespace="team-a",
        image="img:1",
    )
    copy_, train_job = session_objects(
        session=session, spec=session_spec(request), runtime=runtime, label_domain="dispatch.dev"
    )
    assert (train_job["spec"]["trainer"]["command"], train_job["spec"]["trainer"]["args"]) == (
        ["sleep"],
        ["infinity"],
    )
    roles = {
        job["name"]: job["template"]["spec"]["template"]["metadata"]["labels"].get(
            "dispatch.dev/session-role"
        )
        for job in copy_["spec"]["template"]["spec"]["replicatedJobs"]
    }
    assert roles == {"launcher": None, "node": "peer"}
    # A caller's own command runs as given, with no keep-alive args added.
    own = session_spec(
        SessionRequest(
            runtime=RuntimeRef(kind="ClusterTrainingRuntime", name="mpi-interactive"),
            namespace="team-a",
            image="img:1",
            command=("sh", "-c", "x"),
        )
    )
    assert (own.command, own.args) == (("sh", "-c", "x"), ())


# ---------------------------------------------------------------- MultiKueue placement (issue 35)


def _workload(name: str, owner_uid: str, cluster: str = "", controller: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "ownerReferences": [{"kind": "TrainJob", "uid": owner_uid, "controller": controller}],
        },
        "status": {"clusterName": cluster} if cluster else {},
    }


def test_a_sessions_placement_is_read_from_the_workloads_its_trainjob_controls_only() -> None:
    assert placement_of([_workload("wl-a", "uid-1", "worker-2")], "uid-1") == Placement("worker-2", ("wl-a",))
    # Not admitted yet (or evicted): no worker, the Workload's name all the same.
    assert placement_of([_workload("wl-a", "uid-1")], "uid-1") == Placement("", ("wl-a",))
    # Somebody's Workload labelled with our UID but controlled by another TrainJob, or merely owned: not ours.
    strangers = [
        _workload("wl-x", "uid-2", "worker-1"),
        _workload("wl-y", "uid-1", "worker-1", controller=False),
    ]
    assert placement_of(strangers, "uid-1") == Placement("", ())
    assert placement_of([_workload("wl-a", "uid-1", "worker-2")], "") == Placement("", ())


def test_a_workers_trainjob_copy_is_ours_only_with_our_label_and_a_workload_of_ours_named() -> None:
    def copy(job: str, prebuilt: str | None) -> dict[str, Any]:
        annotations = {"kueue.x-k8s.io/prebuilt-workload-name": prebuilt} if prebuilt else {}
        return {"metadata": {"labels": {"dispatch.dev/job": job}, "annotations": annotations}}

    assert is_worker_copy(copy("s1", "wl-a"), "dispatch.dev", "s1", ["wl-a"])
    assert not is_worker_copy(copy("s1", "wl-b"), "dispatch.dev", "s1", ["wl-a"])  # another Workload's
    assert not is_worker_copy(copy("s2", "wl-a"), "dispatch.dev", "s1", ["wl-a"])  # another owner's label
    assert not is_worker_copy(
        copy("s1", None), "dispatch.dev", "s1", ["wl-a"]
    )  # made by hand, not MultiKueue
    assert not is_worker_copy(copy("s1", ""), "dispatch.dev", "s1", [""])
