"""The identity observer (scripts/identity_observer.py) against the real local control plane: it must be able
to fail. Rank reruns are made on purpose with raw JobSets the test creates with its own client (no dispatch
code involved): the Job controller replaces a failed pod under the same completion index when backoffLimit
allows it (KWOK fails the pod: KWOK_EXIT_CODE, scripts/k8s/kwok-stages.yaml), and the observer must name that
identity with both pod UIDs, which the test reads itself from the API server. A clean JobSet gives no
violation; one job's attempts overlapping, and a TrainJob made again under its name, are found too. Then
dispatch's own start path, with the identity published through env and through an init container, is read
the way the observer reads it.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from scripts.identity_observer import (
    RAN_TWICE,
    RESTARTED_IN_PLACE,
    IdentityObserver,
    attempt_overlaps,
    ranks_seen,
    trainjob_duplicates,
)
from tests.support.dispatch import trainer_job, wait_for

pytestmark = [pytest.mark.cluster]

JOBSET = ("jobset.x-k8s.io", "v1alpha2")
INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture
def observer(kubeconfig: str) -> Iterator[IdentityObserver]:
    started = IdentityObserver(kubeconfig).start()
    try:
        yield started
    finally:
        started.stop()


def _job_id() -> str:
    return "jt" + uuid.uuid4().hex[:9]


def _jobset(
    name: str,
    *,
    job: str,
    backoff_limit: int,
    completions: int = 2,
    publish: str = "env",
    kwok: dict[str, str] | None = None,
    sidecar: bool = False,
) -> dict[str, Any]:
    identity = [{"name": "DISPATCH_JOB", "value": job}, {"name": "DISPATCH_ATTEMPT", "value": "1"}]
    node_env = [{"name": k, "value": v} for k, v in (kwok or {}).items()]
    init: list[dict[str, Any]] = []
    if publish == "env":
        node_env += identity
    else:
        init.append(
            {"name": "identity", "image": "localhost/identity:v1", "command": ["true"], "env": identity}
        )
    if sidecar:
        init.append({"name": "proxy", "image": "localhost/proxy:v1", "restartPolicy": "Always"})
    return {
        "apiVersion": "/".join(JOBSET),
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "completionMode": "Indexed",
                            "completions": completions,
                            "parallelism": completions,
                            "backoffLimit": backoff_limit,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "initContainers": init,
                                    "containers": [
                                        {"name": "node", "image": "localhost/trainer:v1", "env": node_env}
                                    ],
                                }
                            },
                        }
                    },
                }
            ]
        },
    }


def _create(kube: Any, namespace: str, body: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(*JOBSET, namespace, "jobsets", body)


def _jobset_condition(kube: Any, namespace: str, name: str, kind: str) -> bool:
    jobset = kube.custom.get_namespaced_custom_object(*JOBSET, namespace, "jobsets", name)
    conditions = jobset.get("status", {}).get("conditions", [])
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def _pods(kube: Any, namespace: str, jobset: str) -> list[Any]:
    selector = f"jobset.sigs.k8s.io/jobset-name={jobset}"
    return list(kube.core.list_namespaced_pod(namespace, label_selector=selector).items)


def _uids_by_rank(kube: Any, namespace: str, jobset: str) -> dict[str, set[str]]:
    ranks: dict[str, set[str]] = {}
    for p in _pods(kube, namespace, jobset):
        ranks.setdefault(p.metadata.labels[INDEX], set()).add(p.metadata.uid)
    return ranks


def _seen(observer: IdentityObserver, uids: set[str], done: Callable[[dict[str, Any]], bool]) -> bool:
    records = {r["uid"]: r for r in observer.records()}
    return all(uid in records and done(records[uid]) for uid in uids)


def _ended(record: dict[str, Any]) -> bool:
    return bool(record["terminated_at"] or record["deleted_at"])


@pytest.mark.parametrize("publish", ["env", "initContainer"])
def test_a_failed_rank_replaced_under_the_same_index_is_reported_with_both_pod_uids(
    kube: Any, namespace: str, observer: IdentityObserver, publish: str
) -> None:
    """backoffLimit 1: rank 1 fails (exit 3), the Job controller creates a second pod for index 1 under the
    same JobSet restart-attempt, and it fails too, which fails the Job. Rank 0 keeps running until then
    (KWOK_FAIL_RANK=1). Exactly one identity ran twice: rank 1."""
    job = _job_id()
    kwok = {"KWOK_EXIT_CODE": "3", "KWOK_FAIL_RANK": "1", "KWOK_RUN_DURATION": "1s"}
    _create(kube, namespace, _jobset("rerun", job=job, backoff_limit=1, publish=publish, kwok=kwok))
    wait_for(lambda: _jobset_condition(kube, namespace, "rerun", "Failed"), timeout=120, what="JobSet Failed")

    # The test's own reading of the API server. The failed pods stay; rank 0's pod was deleted when the Job
    # failed (the observer counts it below).
    ranks = _uids_by_rank(kube, namespace, "rerun")
    assert len(ranks["1"]) == 2, ranks
    wait_for(lambda: _seen(observer, ranks["1"], _ended), what="the observer sees both rank-1 pods end")

    verdict = observer.verdict(namespaces={namespace})
    assert not verdict["ok"]
    [violation] = verdict["violations"]
    assert violation["kind"] == RAN_TWICE
    identity = {k: violation[k] for k in ("namespace", "job", "attempt", "restart_attempt", "replicated_job")}
    assert identity == {
        "namespace": namespace,
        "job": job,
        "attempt": "1",
        "restart_attempt": "0",
        "replicated_job": "node",
    }
    assert (violation["job_index"], violation["rank"]) == ("0", "1")
    assert {p["uid"] for p in violation["pods"]} == ranks["1"]
    for p in violation["pods"]:
        assert p["namespace"] == namespace and p["name"].startswith("rerun-node-0-1-")
        assert p["running_seen_at"] and p["terminated_at"] and "Failed" in p["phases"]
    first, second = violation["pods"]
    assert first["terminated_at"] <= second["first_seen"]  # the replacement came after the failure
    counts = verdict["counts"]
    assert (counts["rank_pods"], counts["identities"], counts["violations"]) == (3, 2, 1)
    assert verdict["watch"]["gaps"] == [] and verdict["watch"]["complete"] is True


@pytest.mark.parametrize("publish", ["env", "initContainer"])
def test_a_jobset_whose_ranks_each_run_once_gives_no_violation(
    kube: Any, namespace: str, observer: IdentityObserver, publish: str
) -> None:
    job = _job_id()
    _create(kube, namespace, _jobset("clean", job=job, backoff_limit=0, publish=publish))
    wait_for(lambda: _jobset_condition(kube, namespace, "clean", "Completed"), timeout=120, what="Completed")
    ranks = _uids_by_rank(kube, namespace, "clean")
    assert sorted(ranks) == ["0", "1"] and all(len(u) == 1 for u in ranks.values())
    every = set().union(*ranks.values())
    wait_for(lambda: _seen(observer, every, _ended), what="the observer sees both pods end")

    verdict = observer.verdict(namespaces={namespace})
    assert verdict["ok"], verdict
    counts = verdict["counts"]
    assert (counts["rank_pods"], counts["rank_pods_ran"], counts["identities"]) == (2, 2, 2)
    records = [r for r in observer.records() if r["namespace"] == namespace]
    assert {(r["job"], r["attempt"], r["rank"]) for r in records} == {(job, "1", "0"), (job, "1", "1")}
    source = "container node" if publish == "env" else "initContainer identity"
    assert {r["identity_source"] for r in records} == {source}


def _attempt_jobset(name: str, *, job: str, attempt: str) -> dict[str, Any]:
    body = _jobset(name, job=job, backoff_limit=0, kwok={"KWOK_STAY_RUNNING": "1"})
    node = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    node["env"] = [e if e["name"] != "DISPATCH_ATTEMPT" else {**e, "value": attempt} for e in node["env"]]
    return body


def test_attempt_2_running_while_a_pod_of_attempt_1_still_runs_is_an_overlap_and_after_it_is_not(
    kube: Any, namespace: str, observer: IdentityObserver
) -> None:
    """Raw JobSets carrying one job's attempts 1, 2 and 3: 2 starts while 1 still runs (an overlap, ordered
    by the resourceVersions of the writes the observer saw); 3 starts only once 2's pods are gone (none)."""
    job = _job_id()

    def running(name: str) -> set[str]:
        pods = _pods(kube, namespace, name)
        return (
            {p.metadata.uid for p in pods}
            if len(pods) == 2 and all(p.status.phase == "Running" for p in pods)
            else set()
        )

    _create(kube, namespace, _attempt_jobset("first", job=job, attempt="1"))
    first = wait_for(lambda: running("first"), what="attempt 1 running")
    _create(kube, namespace, _attempt_jobset("second", job=job, attempt="2"))
    second = wait_for(lambda: running("second"), what="attempt 2 running")
    wait_for(lambda: _seen(observer, first | second, lambda r: r["ran"]), what="the observer sees 4 pods run")
    kube.custom.delete_namespaced_custom_object(
        *JOBSET, namespace, "jobsets", "first", propagation_policy="Foreground"
    )
    kube.custom.delete_namespaced_custom_object(
        *JOBSET, namespace, "jobsets", "second", propagation_policy="Foreground"
    )
    wait_for(lambda: not _pods(kube, namespace, "first") and not _pods(kube, namespace, "second"))
    wait_for(lambda: _seen(observer, first | second, _ended), what="the observer sees them end")
    _create(kube, namespace, _attempt_jobset("third", job=job, attempt="3"))
    third = wait_for(lambda: running("third"), what="attempt 3 running")
    wait_for(lambda: _seen(observer, third, lambda r: r["ran"]), what="the observer sees attempt 3 run")

    records = [r for r in observer.records() if r["namespace"] == namespace]
    [overlap] = attempt_overlaps(records)
    assert (overlap["job"], overlap["earlier_attempt"], overlap["later_attempt"]) == (job, 1, 2)
    assert overlap["compared_by"] == "resourceVersion"
    assert overlap["later_pod_ran"]["uid"] in second and overlap["earlier_pod_ended"]["uid"] in first
    assert overlap["later_pod_ran"]["ran_rv"] < overlap["earlier_pod_ended"]["ended_rv"]
    # Attempt 3 against 1 and 2: their pods had all ended before any of 3's ran.
    assert {(o["earlier_attempt"], o["later_attempt"]) for o in attempt_overlaps(records)} == {(1, 2)}
    assert ranks_seen(records, {(namespace, job, "3"): 2}) == {(namespace, job, "3"): 2}
    assert ranks_seen(records, {(namespace, job, "4"): 2}) == {(namespace, job, "4"): 0}


def test_a_trainjob_deleted_and_made_again_under_its_name_is_a_duplicate_with_both_uids(
    kube: Any, kubeconfig: str, namespace: str
) -> None:
    """TrainJobs watched by UID: one deleted and created again under its name (suspended: no pods) is one
    duplicate naming both UIDs, which the test reads itself; another TrainJob made once is none."""
    observer = IdentityObserver(kubeconfig, trainjobs=True).start()
    try:
        labels = {"example.test/job": "jx", "example.test/attempt": "1"}
        trainjob: dict[str, Any] = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "spec": {
                "runtimeRef": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
                "suspend": True,
            },
        }
        group = ("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs")
        uids = []
        for _ in range(2):
            made = kube.custom.create_namespaced_custom_object(
                *group, {**trainjob, "metadata": {"name": "jx-1", "labels": labels}}
            )
            uids.append(made["metadata"]["uid"])
            kube.custom.delete_namespaced_custom_object(*group, "jx-1")
            wait_for(lambda: not kube.custom.list_namespaced_custom_object(*group)["items"], what="gone")
        kube.custom.create_namespaced_custom_object(
            *group, {**trainjob, "metadata": {"name": "jy-1", "labels": {"example.test/job": "jy"}}}
        )
        wait_for(
            lambda: (
                {"jy-1"} <= {r["name"] for r in observer.trainjob_records()}
                and set(uids) <= {r["uid"] for r in observer.trainjob_records()}
            ),
            what="the observer sees the three TrainJobs",
        )
    finally:
        observer.stop()
    [duplicate] = trainjob_duplicates(observer.trainjob_records(), namespaces={namespace})
    assert (duplicate["namespace"], duplicate["by"], duplicate["key"]) == (namespace, "labels", "jx/1")
    assert [t["uid"] for t in duplicate["trainjobs"]] == uids
    assert observer.watch_summary()["errors"] == [] and observer.watch_summary()["gaps"] == []


def test_a_container_restarted_in_place_is_reported_and_a_sidecar_restart_is_not(
    kube: Any, namespace: str, observer: IdentityObserver
) -> None:
    """KWOK has no kubelet, so nothing restarts a container in place (status-facts §9): the test writes the
    status a kubelet would write after one restart (restartCount 1, lastState.terminated exit 1) through the
    pods/status subresource, on rank 1's node container and on rank 0's sidecar. That injected status is the
    only fake here."""
    job = _job_id()
    body = _jobset("inplace", job=job, backoff_limit=0, kwok={"KWOK_STAY_RUNNING": "1"}, sidecar=True)
    _create(kube, namespace, body)
    pods = wait_for(
        lambda: (lambda ps: ps if len(ps) == 2 and all(p.status.phase == "Running" for p in ps) else None)(
            _pods(kube, namespace, "inplace")
        ),
        what="two running pods",
    )
    by_rank = {p.metadata.labels[INDEX]: p for p in pods}
    restarted = {"exitCode": 1, "reason": "Error", "startedAt": "2026-01-01T00:00:00Z"}
    restarted["finishedAt"] = restarted["startedAt"]

    def bump(pod: Any, key: str, name: str) -> None:
        raw = kube.core.read_namespaced_pod_status(pod.metadata.name, namespace, _preload_content=False)
        statuses = json.loads(raw.data)["status"][key]
        for status in statuses:
            if status["name"] == name:
                status["restartCount"] = 1
                status["lastState"] = {"terminated": restarted}
        kube.core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {key: statuses}})

    bump(by_rank["1"], "containerStatuses", "node")
    bump(by_rank["0"], "initContainerStatuses", "proxy")
    uids = {p.metadata.uid for p in pods}

    def bumped(record: dict[str, Any]) -> bool:
        return any(c["restart_count"] == 1 for c in record["containers"].values())

    wait_for(lambda: _seen(observer, uids, bumped), what="the observer sees both restarts")
    verdict = observer.verdict(namespaces={namespace})
    [violation] = verdict["violations"]
    assert violation["kind"] == RESTARTED_IN_PLACE and violation["rank"] == "1" and violation["job"] == job
    assert [p["uid"] for p in violation["pods"]] == [by_rank["1"].metadata.uid]
    assert [(c["container"], c["restart_count"]) for c in violation["containers"]] == [("node", 1)]


class _ExpiredWatch:
    """The answer of an API server to a watch from a resourceVersion it no longer holds: a 200 stream with one
    ERROR event, code 410 (k8s.io/apimachinery NewResourceExpired). It is sent once `release` is set."""

    connection = None

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        self.release.wait(120)
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410}
        yield json.dumps(
            {"type": "ERROR", "object": status | {"message": "too old resource version"}}
        ).encode()

    def release_conn(self) -> None:
        pass


def test_after_a_410_gone_the_observer_lists_again_keeping_every_record_and_marks_what_vanished(
    kube: Any, namespace: str, observer: IdentityObserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake: the local API server serves a watch from any old resourceVersion out of its young watch cache
    (tried: resourceVersion 1 streams every pod event since it started), so it cannot be made to answer 410
    Gone on demand. The test injects that one answer into the observer's next watch and holds it while the
    cluster changes unseen: pods of JobSet "before" are deleted and JobSet "after" starts. Everything else is
    real. After the 410 the observer records the gap, lists again, keeps the deleted pods' records (marked
    vanished, with their last state), records the new pods once, and reports no rerun."""
    _create(
        kube, namespace, _jobset("before", job=_job_id(), backoff_limit=0, kwok={"KWOK_STAY_RUNNING": "1"})
    )
    before = wait_for(lambda: (lambda ps: ps if len(ps) == 2 else None)(_pods(kube, namespace, "before")))
    before_uids = {p.metadata.uid for p in before}
    wait_for(lambda: _seen(observer, before_uids, lambda r: r["ran"]), what="the observer sees both pods run")

    release = threading.Event()
    [pods] = observer.pods
    real_call = pods._call
    injected: list[_ExpiredWatch] = []

    def next_watch_expires(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("watch") and not injected:
            injected.append(_ExpiredWatch(release))
            return injected[0]
        return real_call(*args, **kwargs)

    monkeypatch.setattr(pods, "_call", next_watch_expires)
    current = wait_for(lambda: pods._response, what="the observer's open watch")
    with contextlib.suppress(OSError):
        current.connection.sock.shutdown(socket.SHUT_RDWR)  # end the open watch; the next one expires
    wait_for(lambda: injected, what="the observer's next watch")

    kube.custom.delete_namespaced_custom_object(*JOBSET, namespace, "jobsets", "before")
    wait_for(lambda: not _pods(kube, namespace, "before"), what="the pods of 'before' gone")
    _create(
        kube, namespace, _jobset("after", job=_job_id(), backoff_limit=0, kwok={"KWOK_STAY_RUNNING": "1"})
    )
    after = wait_for(
        lambda: (lambda ps: ps if len(ps) == 2 and all(p.status.phase == "Running" for p in ps) else None)(
            _pods(kube, namespace, "after")
        )
    )
    after_uids = {p.metadata.uid for p in after}
    assert not {r["uid"] for r in observer.records()} & after_uids  # the observer is blind meanwhile
    release.set()
    wait_for(lambda: pods.gaps and "relisted_at" in pods.gaps[-1], what="a re-list after 410 Gone")

    [gap] = pods.gaps
    records = {r["uid"]: r for r in observer.records()}
    for uid in before_uids:
        assert records[uid]["vanished_at"] == gap["relisted_at"] and records[uid]["deleted_at"] is None
        assert records[uid]["ended_seen_at"] == gap["relisted_at"]  # ended by the re-list at the latest
        assert records[uid]["ran"] and records[uid]["phases"][-1]["phase"] == "Running"
    for uid in after_uids:
        assert records[uid]["first_seen"] == gap["relisted_at"] and records[uid]["ran"]
    verdict = observer.verdict(namespaces={namespace})
    assert verdict["ok"], verdict
    assert (verdict["counts"]["rank_pods"], verdict["counts"]["identities"]) == (4, 4)
    assert verdict["watch"]["gaps"] == [gap] and verdict["watch"]["complete"] is False


# ---------------------------------------------------------------- dispatch's own start path


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


@pytest.mark.django_db
@pytest.mark.parametrize("publish", ["env", "initContainer"])
def test_the_observer_reads_the_identity_where_dispatch_publishes_it(
    kube: Any,
    namespace: str,
    observer: IdentityObserver,
    submitter: tuple[User, str],
    namespaced_runtime: Callable[..., Any],
    django_capture_on_commit_callbacks: Any,
    publish: str,
) -> None:
    """A job started through dispatch's API: each pod's (job, attempt, restart-attempt, rank) as the observer
    reads it from the pod is the job's id, attempt 1, J 0 and ranks 0 and 1, under both publish settings."""
    from runtimes.models import SiteSettings

    mutate = None
    if publish == "initContainer":
        SiteSettings.objects.update_or_create(
            pk=1, defaults={"publish_via": "initContainer", "publish_container": "identity"}
        )

        def mutate(body: dict[str, Any]) -> None:
            pod = trainer_job(body)["template"]["spec"]["template"]["spec"]
            pod["initContainers"] = [
                {"name": "identity", "image": "localhost/identity:v1", "command": ["true"]}
            ]

    namespaced_runtime(mutate=mutate)
    job_body = {
        "runtime": {"kind": "TrainingRuntime", "name": "team-runtime"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
        "env": {"KWOK_STAY_RUNNING": "1"},
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = _api(submitter[1]).post("/api/v1/jobs", job_body, format="json")
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    pods = wait_for(
        lambda: (lambda ps: ps if len(ps) == 2 and all(p.status.phase == "Running" for p in ps) else None)(
            kube.core.list_namespaced_pod(namespace, label_selector=f"dispatch.dev/job={job_id}").items
        ),
        what="two running pods",
    )
    uids = {p.metadata.uid for p in pods}
    wait_for(lambda: _seen(observer, uids, lambda r: r["ran"]), what="the observer sees both pods run")
    records = [r for r in observer.records() if r["uid"] in uids]
    source = "container node" if publish == "env" else "initContainer identity"
    assert sorted(
        (r["job"], r["attempt"], r["restart_attempt"], r["rank"], r["identity_source"]) for r in records
    ) == [
        (job_id, "1", "0", "0", source),
        (job_id, "1", "0", "1", source),
    ]
    verdict = observer.verdict(namespaces={namespace})
    assert verdict["ok"] and verdict["counts"]["rank_pods"] == 2 and verdict["counts"]["identities"] == 2


def test_the_observer_gives_up_clearly_when_the_api_server_cannot_be_reached(tmp_path: Any) -> None:
    kubeconfig = tmp_path / "nowhere.kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: x}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\n"
    )
    with pytest.raises(RuntimeError, match="no pods list within"):
        IdentityObserver(str(kubeconfig)).start(timeout=2)


@pytest.mark.django_db
def test_an_interactive_sessions_pods_are_counted_as_a_sessions_and_never_judged(
    kube: Any, namespace: str, observer: IdentityObserver, submitter: tuple[User, str]
) -> None:
    """jobs/sessions.py builds a session's objects like a job's (DISPATCH_JOB=<session id>,
    DISPATCH_ATTEMPT=1) and labels them <label domain>/session=<session id>; a session is no job rank."""
    from tests.jobs.sessions.test_sessions import open_body, plain_runtime

    runtime = plain_runtime(kube, namespace)
    response = _api(submitter[1]).post(
        "/api/v1/sessions?wait=120", open_body(namespace, runtime, timeout_seconds=120), format="json"
    )
    assert response.status_code == 200 and response.json()["state"] == "running", response.json()
    session = response.json()
    pods = _pods(kube, namespace, session["trainjob_name"])
    uids = {p.metadata.uid for p in pods}
    assert len(uids) == 2
    wait_for(lambda: _seen(observer, uids, lambda r: r["ran"]), what="the observer sees the session's pods")
    assert {r["job"] for r in observer.records() if r["uid"] in uids} == {session["id"]}
    counts = observer.verdict(namespaces={namespace})["counts"]
    assert (counts["session_pods"], counts["rank_pods"]) == (2, 0)
    closed = _api(submitter[1]).delete(f"/api/v1/sessions/{session['id']}?wait=120")
    assert closed.status_code == 200, closed.content


def test_the_cli_watches_until_sigterm_writes_the_report_and_exits_1_on_a_violation(
    kube: Any, kubeconfig: str, namespace: str, tmp_path: Any
) -> None:
    out = tmp_path / "report.json"
    script = Path(__file__).resolve().parents[2] / "scripts" / "identity_observer.py"
    cli = subprocess.Popen(
        [
            sys.executable,
            str(script),
            "--kubeconfig",
            kubeconfig,
            "--out",
            str(out),
            "--namespace",
            namespace,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # It says so on stderr once the first list is recorded: pods created after that are all seen.
        assert cli.stderr is not None and "watching pods" in cli.stderr.readline()
        job = _job_id()
        kwok = {"KWOK_EXIT_CODE": "3", "KWOK_RUN_DURATION": "1s"}
        _create(kube, namespace, _jobset("rerun", job=job, backoff_limit=1, completions=1, kwok=kwok))
        wait_for(lambda: _jobset_condition(kube, namespace, "rerun", "Failed"), timeout=120, what="Failed")
        uids = _uids_by_rank(kube, namespace, "rerun")["0"]
        # No wait for the watch to catch up: stop() lists once more, and the failed pods stay.
        cli.send_signal(signal.SIGTERM)
        stdout, _ = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 1, stdout
    report = json.loads(out.read_text())
    [violation] = report["verdict"]["violations"]
    assert (violation["job"], {p["uid"] for p in violation["pods"]}) == (job, uids)
    assert uids <= {r["uid"] for r in report["records"]}
    assert json.loads(stdout.strip().splitlines()[-1])["violations"] == 1
