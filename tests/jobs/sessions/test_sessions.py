"""Interactive sessions through REST against the real control plane; pods/exec served by KWOK, which runs
the command on this host (as nobody), so the exit codes, stdout and stderr are real processes'.

The seed's nine end-to-end checks (spec/interactive-sessions.md) on a runtime shaped like mpi-interactive,
then the open timeout, an already finished trainer pod, a pod that disappears, the refusals and the audit
rows.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from dispatch_site.models import AuditEvent
from jobs.models import Session, SessionState
from jobs.sessions.tasks import session_watch
from runtimes.models import AllowListEntry, SiteSettings
from tests.support.dispatch import (
    GROUP,
    VERSION,
    runtime_body,
    trainer_job,
    trainjob_exists,
    trainjob_made_again,
    wait_for,
)

pytestmark = pytest.mark.cluster

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
IMAGE = "localhost/dispatch-busybox:kind"
PROBE = "launcher-probe"  # a container only the launcher pod has: the API server refuses it for any other pod
EXEC_CONTAINERS = "dispatch.dev/exec-containers"


def mpi_interactive(
    namespace: str, name: str = "mpi-runtime", node_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """The shape of the seed's mpi-interactive runtime: the MPI node replicated job and the launcher (the
    trainer ancestor, started only once the nodes are Ready; JobSet wants it after the job it depends on),
    runLauncherAsNode. The nodes run `sleep infinity`
    where the real runtime runs sshd."""
    node_container: dict[str, Any] = {"name": "node", "image": IMAGE, "command": ["sleep", "infinity"]}
    if node_env:
        node_container["env"] = [{"name": k, "value": v} for k, v in node_env.items()]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRuntime",
        # The launcher's probe container is one commands may run in (besides node): the runtime says so.
        "metadata": {"name": name, "namespace": namespace, "annotations": {EXEC_CONTAINERS: PROBE}},
        "spec": {
            "mlPolicy": {
                "numNodes": 3,
                "mpi": {"numProcPerNode": 1, "mpiImplementation": "OpenMPI", "runLauncherAsNode": True},
            },
            "template": {
                "spec": {
                    "network": {"publishNotReadyAddresses": True},
                    "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {"spec": {"template": {"spec": {"containers": [node_container]}}}},
                        },
                        {
                            "name": "launcher",
                            "dependsOn": [{"name": "node", "status": "Ready"}],
                            "template": {
                                "metadata": {"labels": {ANCESTOR: "trainer"}},
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "containers": [
                                                {"name": "node", "image": IMAGE},
                                                {
                                                    "name": PROBE,
                                                    "image": IMAGE,
                                                    "command": ["sleep", "infinity"],
                                                },
                                            ]
                                        }
                                    }
                                },
                            },
                        },
                    ],
                }
            },
        },
    }


def create_runtime(
    kube: Any, namespace: str, body: dict[str, Any], *, sessions: bool = True, jobs: bool = False
) -> str:
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", body)
    name = str(body["metadata"]["name"])
    if sessions or jobs:
        AllowListEntry.objects.create(
            kind="TrainingRuntime", namespace=namespace, name=name, for_jobs=jobs, for_sessions=sessions
        )
    return name


def plain_runtime(kube: Any, namespace: str, name: str = "plain") -> str:
    return create_runtime(kube, namespace, runtime_body("TrainingRuntime", name, namespace))


def open_body(namespace: str, runtime: str, **extra: Any) -> dict[str, Any]:
    return {
        "runtime": {"kind": "TrainingRuntime", "name": runtime},
        "namespace": namespace,
        "image": IMAGE,
    } | extra


def run(api: APIClient, session_id: str, command: Any, **extra: Any) -> dict[str, Any]:
    response = api.post(f"/api/v1/sessions/{session_id}/exec", {"command": command} | extra, format="json")
    assert response.status_code == 200, response.content
    data: dict[str, Any] = response.json()
    return data


def pods_of(kube: Any, namespace: str, trainjob: str) -> list[Any]:
    return list(kube.core.list_namespaced_pod(namespace, label_selector=f"{JOBSET_NAME}={trainjob}").items)


# ---------------------------------------------------------------- the seed's nine checks


def test_the_nine_end_to_end_checks_on_an_mpi_interactive_runtime(
    kube: Any, namespace: str, api: APIClient, submitter: tuple[User, str]
) -> None:
    runtime = create_runtime(kube, namespace, mpi_interactive(namespace))
    body = open_body(namespace, runtime, name="mpi-interactive", num_nodes=3, timeout_seconds=120)

    # 1. Open reaches a Running trainer pod: the launcher, never a node pod.
    response = api.post("/api/v1/sessions?wait=120", body, format="json")
    assert response.status_code == 200, response.json()["detail"]
    session = response.json()
    assert session["state"] == "running", session["message"]
    assert (session["state"], session["trainjob_name"], session["container"]) == (
        "running",
        "mpi-interactive",
        "node",
    )
    pods = {p.metadata.name: p for p in pods_of(kube, namespace, "mpi-interactive")}
    launcher = pods[session["pod"]]
    assert launcher.metadata.labels[RJOB] == "launcher"
    assert launcher.status.phase == "Running"
    node_pods = [p for p in pods.values() if p.metadata.labels[RJOB] == "node"]
    assert len(node_pods) == 2  # runLauncherAsNode: the launcher is the third node
    assert all(PROBE not in [c.name for c in p.spec.containers] for p in node_pods)

    # 2. The commands run on the launcher pod: its answer names it, and a container only the launcher pod
    # has answers (the API server refuses an exec naming a container the pod does not have).
    probe = run(api, session["id"], ["echo", "probe"], container=PROBE)
    assert (probe["pod"], probe["container"], probe["stdout"], probe["returncode"]) == (
        launcher.metadata.name,
        PROBE,
        "probe\n",
        0,
    )

    # 3. A string runs with sh -c: the $(...) substitution happens.
    assert run(api, session["id"], 'echo "sum=$(expr 40 + 2)"')["stdout"] == "sum=42\n"
    # A list runs directly: no shell, so nothing is substituted.
    listed = run(api, session["id"], ["echo", "a  b", "$(expr 1 + 1)"])
    assert (listed["stdout"], listed["returncode"], listed["pod"]) == (
        "a  b $(expr 1 + 1)\n",
        0,
        launcher.metadata.name,
    )
    # 4. An exit code comes back.
    assert run(api, session["id"], "exit 3")["returncode"] == 3
    # 5. stderr and exit 1.
    failed = run(api, session["id"], "echo oops >&2; exit 1")
    assert (failed["stdout"], failed["stderr"], failed["returncode"]) == ("", "oops\n", 1)
    # 6. Several commands in one session: all on the same pod, all in the history and the audit log.
    audits = AuditEvent.objects.filter(action="session.exec", object_id=session["id"]).order_by("at", "id")
    assert [a.details["returncode"] for a in audits] == [0, 0, 0, 3, 1]
    assert {a.details["pod"] for a in audits} == {launcher.metadata.name}
    assert audits[4].actor_name == submitter[0].username
    assert audits[4].details["command"] == "echo oops >&2; exit 1"
    assert audits[4].details["pod"] == launcher.metadata.name
    assert audits[4].details["bytes_out"] == len("oops\n")

    # 7. Close removes the TrainJob and its pods.
    closed = api.delete(f"/api/v1/sessions/{session['id']}?wait=120")
    assert closed.status_code == 200, closed.content
    assert closed.json()["state"] == "closed"
    assert not trainjob_exists(kube, namespace, "mpi-interactive")
    assert pods_of(kube, namespace, "mpi-interactive") == []
    assert api.delete(f"/api/v1/sessions/{session['id']}").json()["state"] == "closed"  # idempotent

    # 8. Execute after close is refused.
    after = api.post(f"/api/v1/sessions/{session['id']}/exec", {"command": "true"}, format="json")
    assert after.status_code == 409, after.content
    assert after.json()["state"] == "closed"

    # 9. A second session with the same name opens right after.
    again = api.post("/api/v1/sessions?wait=120", body, format="json")
    assert again.status_code == 200, again.content
    second = again.json()
    assert (second["state"], second["trainjob_name"]) == ("running", "mpi-interactive")
    assert second["id"] != session["id"]
    assert run(api, second["id"], "echo second session")["stdout"] == "second session\n"
    assert api.delete(f"/api/v1/sessions/{second['id']}?wait=120").json()["state"] == "closed"


# ---------------------------------------------------------------- the other paths


def test_open_times_out_without_ever_taking_a_node_pod_and_says_the_trainjob_exists(
    kube: Any, namespace: str, api: APIClient
) -> None:
    # The node pods never get ready (their image cannot be pulled), so the launcher is never created.
    runtime = create_runtime(
        kube, namespace, mpi_interactive(namespace, "stuck-runtime", {"KWOK_IMAGE_PULL_ERROR": "1"})
    )
    response = api.post(
        "/api/v1/sessions?wait=30",
        open_body(namespace, runtime, name="stuck", timeout_seconds=4),
        format="json",
    )
    assert response.status_code == 200, response.content
    session = response.json()
    assert session["state"] == "failed"
    assert session["pod"] == ""
    assert f"TrainJob {namespace}/stuck was created and still exists" in session["message"]
    assert f"DELETE /api/v1/sessions/{session['id']}" in session["message"]
    assert "no pod of replicated job 'launcher' exists yet" in session["message"]
    nodes = [p for p in pods_of(kube, namespace, "stuck") if p.metadata.labels[RJOB] == "node"]
    assert nodes and all(p.status.phase == "Pending" for p in nodes)
    assert trainjob_exists(kube, namespace, "stuck")
    # The failed session still holds the name until it is closed; close deletes the TrainJob.
    assert (
        api.post("/api/v1/sessions", open_body(namespace, runtime, name="stuck"), format="json").status_code
        == 409
    )
    assert api.delete(f"/api/v1/sessions/{session['id']}?wait=60").json()["state"] == "closed"
    assert not trainjob_exists(kube, namespace, "stuck")


def test_pods_the_namespace_forbids_fail_the_session_without_waiting_out_its_timeout(
    kube: Any, namespace: str, api: APIClient
) -> None:
    """A LimitRange caps a container at 50m CPU; the runtime's trainer asks for 100m. The API server's
    LimitRanger admission refuses every pod, so the Job controller reports FailedCreate and retries for ever
    (measured here: "pods ... is forbidden: maximum cpu usage per Container is 50m, but limit is 100m").
    The session fails with that message once it has been reported for a while, long before its 300 s."""
    kube.core.create_namespaced_limit_range(
        namespace,
        {
            "metadata": {"name": "small"},
            "spec": {"limits": [{"type": "Container", "max": {"cpu": "50m"}}]},
        },
    )
    runtime = plain_runtime(kube, namespace)
    response = api.post(
        "/api/v1/sessions?wait=90",
        open_body(namespace, runtime, name="capped", timeout_seconds=300),
        format="json",
    )
    assert response.status_code == 200, response.content
    session = response.json()
    assert session["state"] == "failed", session
    assert "Job capped-node-0 cannot create its pods" in session["message"], session["message"]
    assert "maximum cpu usage per Container is 50m" in session["message"]
    assert f"TrainJob {namespace}/capped was created and still exists" in session["message"]
    assert "within 300s" not in session["message"]  # not the timeout's answer
    assert api.delete(f"/api/v1/sessions/{session['id']}?wait=60").json()["state"] == "closed"


def test_a_trainer_pod_that_already_finished_fails_the_session_with_a_clear_message(
    kube: Any, namespace: str, api: APIClient
) -> None:
    runtime = plain_runtime(kube, namespace)
    response = api.post(
        "/api/v1/sessions", open_body(namespace, runtime, num_nodes=1, command=["true"]), format="json"
    )
    assert response.status_code == 202, response.content
    session = response.json()
    assert session["state"] == "starting"
    assert session["trainjob_name"] == session["id"]  # no name given: the session id names the TrainJob
    # The caller's command replaced the keep-alive one: the pod runs `true` and succeeds.
    pod = wait_for(
        lambda: next(
            (p for p in pods_of(kube, namespace, session["id"]) if p.status.phase == "Succeeded"), None
        ),
        what="the trainer pod Succeeded",
    )
    assert pod.spec.containers[0].command == ["true"]
    session_watch.delay(session["id"])  # the watcher task a worker runs after the open commits
    row = Session.objects.get(pk=session["id"])
    assert row.state == SessionState.FAILED
    assert f"trainer pod {pod.metadata.name} has already succeeded" in row.message
    assert "delete it by closing the session" in row.message
    assert api.delete(f"/api/v1/sessions/{session['id']}?wait=60").json()["state"] == "closed"


def test_a_trainer_pod_that_is_gone_makes_execute_409_and_fails_the_session(
    kube: Any, namespace: str, api: APIClient
) -> None:
    runtime = plain_runtime(kube, namespace)
    session = api.post(
        "/api/v1/sessions?wait=60", open_body(namespace, runtime, num_nodes=1), format="json"
    ).json()
    assert session["state"] == "running"
    kube.core.delete_namespaced_pod(session["pod"], namespace, grace_period_seconds=0)
    wait_for(lambda: session["pod"] not in [p.metadata.name for p in pods_of(kube, namespace, session["id"])])
    response = api.post(f"/api/v1/sessions/{session['id']}/exec", {"command": "true"}, format="json")
    assert response.status_code == 409, response.content
    assert "is gone" in response.json()["detail"]
    assert Session.objects.get(pk=session["id"]).state == SessionState.FAILED
    assert api.delete(f"/api/v1/sessions/{session['id']}?wait=60").json()["state"] == "closed"


def test_a_failed_session_is_closed_after_its_grace_or_at_the_lifetime_cap_releasing_its_trainjob(
    kube: Any, namespace: str, api: APIClient, settings: Any
) -> None:
    """A failed session's TrainJob may still run its other pods (sleep infinity holds their GPUs and quota):
    the beat's sweep closes it SESSION_FAILED_GRACE_SECONDS after the failure, or once it reaches the
    maximum lifetime, whichever comes first, and the TrainJob goes. Each session fails the way users meet
    it: its trainer pod deleted under it (the sweep's pod check fails it)."""
    from jobs.sessions.services import sessions_sweep

    runtime = plain_runtime(kube, namespace)
    first, second = (
        api.post("/api/v1/sessions?wait=60", open_body(namespace, runtime, num_nodes=2), format="json").json()
        for _ in range(2)
    )
    assert first["state"] == second["state"] == "running", (first, second)
    settings.SESSION_FAILED_GRACE_SECONDS = 8

    def fail(session: dict[str, Any]) -> None:
        kube.core.delete_namespaced_pod(session["pod"], namespace, grace_period_seconds=0)

        def failed() -> bool:
            sessions_sweep()
            return Session.objects.get(pk=session["id"]).state == SessionState.FAILED

        wait_for(failed, what=f"session {session['id']} failed (its trainer pod gone)")

    def closed(session: dict[str, Any]) -> dict[str, Any]:
        return wait_for(
            lambda: (
                sessions_sweep()
                and (data := api.get(f"/api/v1/sessions/{session['id']}").json())["state"] == "closed"
                and data
            ),
            what=f"session {session['id']} closed",
        )

    fail(first)
    failed_at = Session.objects.get(pk=first["id"]).updated_at
    # Within the grace the failure stays, to be read, with its TrainJob.
    assert sessions_sweep()["failed"] == 0
    assert api.get(f"/api/v1/sessions/{first['id']}").json()["state"] == "failed"
    assert trainjob_exists(kube, namespace, first["trainjob_name"])
    wait_for(lambda: (timezone.now() - failed_at).total_seconds() > 8, what="the grace over")
    done = closed(first)
    assert "closed by dispatch: it failed 8s ago" in done["message"], done
    assert not trainjob_exists(kube, namespace, first["trainjob_name"])
    assert trainjob_exists(kube, namespace, second["trainjob_name"])  # still running: left alone

    # The lifetime cap applies to a failed session too, before its grace is over.
    settings.SESSION_FAILED_GRACE_SECONDS = 3600
    fail(second)
    settings.SESSION_MAX_LIFETIME_SECONDS = 1  # it was opened longer ago than that
    done = closed(second)
    assert "maximum session lifetime (1s)" in done["message"], done
    assert not trainjob_exists(kube, namespace, second["trainjob_name"])


def test_output_beyond_the_limit_is_truncated_and_the_audit_row_counts_every_byte(
    kube: Any, namespace: str, api: APIClient, settings: Any
) -> None:
    settings.SESSION_EXEC_MAX_OUTPUT_BYTES = 10
    runtime = plain_runtime(kube, namespace)
    session = api.post(
        "/api/v1/sessions?wait=60", open_body(namespace, runtime, num_nodes=2), format="json"
    ).json()
    assert session["state"] == "running"
    assert session["pod"].startswith(f"{session['id']}-node-0-0-")  # the first trainer pod of two
    result = run(api, session["id"], "printf 0123456789abcdef")
    assert (result["stdout"], result["truncated"], result["returncode"]) == ("0123456789", True, 0)
    audit = AuditEvent.objects.get(action="session.exec", object_id=session["id"])
    assert audit.details["bytes_out"] == 16
    assert api.delete(f"/api/v1/sessions/{session['id']}?wait=60").json()["state"] == "closed"


def test_a_runtime_without_a_trainer_job_or_launcher_is_422(
    kube: Any, namespace: str, api: APIClient
) -> None:
    body = runtime_body("TrainingRuntime", "unlabelled", namespace)
    del trainer_job(body)["template"]["metadata"]
    name = create_runtime(kube, namespace, body)
    response = api.post("/api/v1/sessions", open_body(namespace, name), format="json")
    assert response.status_code == 422, response.content
    assert [r["code"] for r in response.json()["reasons"]] == ["no-trainer-job"]
    assert not Session.objects.exists()


def test_an_mpi_runtime_without_the_trainer_label_falls_back_to_the_launcher(
    kube: Any, namespace: str, api: APIClient
) -> None:
    body = mpi_interactive(namespace, "unlabelled-mpi")
    launcher = body["spec"]["template"]["spec"]["replicatedJobs"][1]
    del launcher["template"]["metadata"]
    # No job carries the trainer label: dispatch takes the launcher's pod (its probe container keeps it
    # running, since the Trainer now sets the session's command on no container).
    name = create_runtime(kube, namespace, body)
    response = api.post("/api/v1/sessions?wait=90", open_body(namespace, name, num_nodes=3), format="json")
    assert response.status_code == 200, response.content
    session = response.json()
    assert session["state"] == "running", session
    pod = kube.core.read_namespaced_pod(session["pod"], namespace)
    assert pod.metadata.labels[RJOB] == "launcher"
    assert api.delete(f"/api/v1/sessions/{session['id']}?wait=60").json()["state"] == "closed"


def test_a_name_held_by_an_open_session_is_409(kube: Any, namespace: str, api: APIClient) -> None:
    runtime = plain_runtime(kube, namespace)
    first = api.post(
        "/api/v1/sessions", open_body(namespace, runtime, name="dup", num_nodes=1), format="json"
    )
    assert first.status_code == 202, first.content
    second = api.post(
        "/api/v1/sessions", open_body(namespace, runtime, name="dup", num_nodes=1), format="json"
    )
    assert second.status_code == 409, second.content
    assert first.json()["id"] in second.json()["detail"]
    # The runtime copy is named after the TrainJob: a session named like its TrainingRuntime cannot be.
    clash = api.post("/api/v1/sessions", open_body(namespace, runtime, name=runtime), format="json")
    assert clash.status_code == 409, clash.content
    assert "choose another session name" in clash.json()["detail"]
    assert api.delete(f"/api/v1/sessions/{first.json()['id']}?wait=60").json()["state"] == "closed"


def test_someone_elses_running_session_is_403_to_execute(
    kube: Any, namespace: str, api: APIClient, make_user: Any
) -> None:
    runtime = plain_runtime(kube, namespace)
    session = api.post(
        "/api/v1/sessions?wait=60", open_body(namespace, runtime, num_nodes=1), format="json"
    ).json()
    _, token = make_user("pia", "platform", ("*",))
    platform = APIClient()
    platform.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert platform.get(f"/api/v1/sessions/{session['id']}").json()["state"] == "running"
    response = platform.post(f"/api/v1/sessions/{session['id']}/exec", {"command": "id"}, format="json")
    assert response.status_code == 403, response.content
    assert not AuditEvent.objects.filter(action="session.exec").exists()
    assert api.delete(f"/api/v1/sessions/{session['id']}?wait=60").json()["state"] == "closed"


def test_pods_outliving_the_close_timeout_leave_a_warning_on_the_closed_session(
    kube: Any, namespace: str, api: APIClient, settings: Any
) -> None:
    runtime = plain_runtime(kube, namespace)
    session = api.post(
        "/api/v1/sessions?wait=60", open_body(namespace, runtime, num_nodes=2), format="json"
    ).json()
    assert session["state"] == "running"
    # The trainer pod outlives the close for sure: a finalizer holds it (without one, a fast garbage
    # collector on a slow test run could remove it before close looks). No time at all for the collector.
    hold = {"metadata": {"finalizers": ["dispatch.test/hold"]}}
    kube.core.patch_namespaced_pod(session["pod"], namespace, hold)
    settings.SESSION_CLOSE_TIMEOUT_SECONDS = 0
    closed = api.delete(f"/api/v1/sessions/{session['id']}").json()
    assert closed["state"] == "closed"
    assert f"of TrainJob {namespace}/{session['id']} still existed 0s after close" in closed["warning"]
    assert session["pod"] in closed["warning"]
    assert not trainjob_exists(kube, namespace, session["id"])
    kube.core.patch_namespaced_pod(session["pod"], namespace, {"metadata": {"finalizers": None}})
    wait_for(
        lambda: pods_of(kube, namespace, session["id"]) == [], what="the garbage collector to remove the pods"
    )


def _strangers_pod(kube: Any, namespace: str, name: str, labels: dict[str, str]) -> Any:
    """A Running pod somebody made in the namespace with the labels given: no owner, not dispatch's."""
    kube.core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {"batch.kubernetes.io/job-completion-index": "0"},
            },
            "spec": {
                "containers": [
                    {
                        "name": c,
                        "image": "localhost/stranger:v1",
                        "env": [{"name": "KWOK_STAY_RUNNING", "value": "1"}],
                    }
                    for c in ("node", PROBE)
                ]
            },
        },
    )
    return wait_for(
        lambda: (pod := kube.core.read_namespaced_pod(name, namespace)).status.phase == "Running" and pod,
        what=f"the stranger's pod {name} running",
    )


def test_a_strangers_pod_with_the_sessions_labels_is_never_its_trainer_pod(
    kube: Any, namespace: str, api: APIClient
) -> None:
    """Anyone who can create a pod in the namespace can copy a session's labels. Here the session's node pods
    never get ready, so its launcher (the trainer pod) is never made; a stranger's Running pod labelled as
    that launcher is there instead, and first by index and name. The session never takes it (its commands
    would run in the stranger's image): the pod is not in the owner chain of the session's TrainJob, so the
    open times out having found no trainer pod."""
    runtime = create_runtime(
        kube, namespace, mpi_interactive(namespace, "stuck-runtime", {"KWOK_IMAGE_PULL_ERROR": "1"})
    )
    opened = api.post(
        "/api/v1/sessions", open_body(namespace, runtime, name="decoy", timeout_seconds=8), format="json"
    )
    assert opened.status_code == 202, opened.content
    session = opened.json()
    domain = Session.objects.get(pk=session["id"]).label_domain
    stranger = _strangers_pod(
        kube,
        namespace,
        "decoy-launcher-0-0-aaaaa",
        {
            JOBSET_NAME: "decoy",
            RJOB: "launcher",
            "jobset.sigs.k8s.io/job-index": "0",
            ANCESTOR: "trainer",
            f"{domain}/job": session["id"],
        },
    )
    session_watch.delay(session["id"])  # the watcher task a worker runs after the open commits
    row = Session.objects.get(pk=session["id"])
    assert row.state == SessionState.FAILED, row.message
    assert row.pod == "" and row.pod_uid == ""
    assert "no pod of replicated job 'launcher' exists yet" in row.message
    assert (
        kube.core.read_namespaced_pod(stranger.metadata.name, namespace).metadata.deletion_timestamp is None
    )
    assert api.delete(f"/api/v1/sessions/{session['id']}?wait=60").json()["state"] == "closed"


def test_a_strangers_pod_with_the_sessions_labels_does_not_hold_its_close_open(
    kube: Any, namespace: str, api: APIClient
) -> None:
    """Close waits for the session's pods to go, but only for its own: a stranger's Running pod carrying the
    trainer pod's labels (not the Job's own selector, or the Job controller would adopt it) is left alone,
    and the close ends as soon as the session's TrainJob, copy and pods are gone, without a warning (it used
    to wait out the 180 s close timeout for the stranger)."""
    runtime = plain_runtime(kube, namespace)
    session = api.post(
        "/api/v1/sessions?wait=60", open_body(namespace, runtime, num_nodes=1), format="json"
    ).json()
    assert session["state"] == "running"
    real = kube.core.read_namespaced_pod(session["pod"], namespace)
    copied = {
        k: v for k, v in real.metadata.labels.items() if "controller-uid" not in k and "job-name" not in k
    }
    stranger = _strangers_pod(kube, namespace, f"{session['id']}-stranger", copied)
    closed = api.delete(f"/api/v1/sessions/{session['id']}?wait=60").json()
    assert closed["state"] == "closed", closed
    assert closed["warning"] == ""
    assert not trainjob_exists(kube, namespace, session["id"])
    assert (
        kube.core.read_namespaced_pod(stranger.metadata.name, namespace).metadata.deletion_timestamp is None
    )


def test_closing_a_session_whose_trainjob_was_made_again_leaves_the_strangers_alone(
    kube: Any, namespace: str, api: APIClient
) -> None:
    """The session's TrainJob is deleted outside dispatch and somebody makes another under its name, with its
    labels and dispatch's own annotations (so it passes the label and body-hash check). The open recorded its
    TrainJob's UID: close deletes only that one, and the stranger's stays."""
    runtime = plain_runtime(kube, namespace)
    session = api.post(
        "/api/v1/sessions?wait=60", open_body(namespace, runtime, num_nodes=1), format="json"
    ).json()
    assert session["state"] == "running"
    name = session["id"]
    ours = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
    assert Session.objects.get(pk=name).trainjob_uid == ours["metadata"]["uid"]
    stranger = trainjob_made_again(kube, namespace, ours, runtime)
    # The stranger's pods carry the session's labels too, but they are its TrainJob's: the close does not
    # wait for them.
    closed = api.delete(f"/api/v1/sessions/{name}?wait=60").json()
    assert closed["state"] == "closed"
    assert closed["warning"] == ""
    still = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
    assert still["metadata"]["uid"] == stranger["metadata"]["uid"]
    assert "deletionTimestamp" not in still["metadata"]
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)


@pytest.mark.django_db(transaction=True)
def test_a_user_holds_at_most_the_sites_open_sessions_even_opening_three_at_once(
    kube: Any, namespace: str, submitter: tuple[User, str]
) -> None:
    """max_open_sessions_per_user (2 here): three opens at once by one user make exactly two sessions and
    two TrainJobs; the third is 409 naming the open ones, and is audited. Closing one frees its place."""
    runtime = plain_runtime(kube, namespace)
    site = SiteSettings.load()
    site.max_open_sessions_per_user = 2
    site.save()
    answers: list[Any] = []
    start = threading.Barrier(3)

    def open_one() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {submitter[1]}")
        try:
            start.wait()
            answers.append(
                client.post("/api/v1/sessions", open_body(namespace, runtime, num_nodes=1), format="json")
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=open_one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(a.status_code for a in answers) == [202, 202, 409], [a.content for a in answers]
    opened = [a.json()["id"] for a in answers if a.status_code == 202]
    [refused] = [a.json()["detail"] for a in answers if a.status_code == 409]
    assert "max_open_sessions_per_user" in refused and all(s in refused for s in opened)
    made = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"]
    assert sorted(t["metadata"]["name"] for t in made) == sorted(
        Session.objects.get(pk=s).name for s in opened
    )
    [audit] = AuditEvent.objects.filter(action="session.refuse")
    assert audit.details["codes"] == ["session-limit"] and sorted(audit.details["open"]) == sorted(opened)

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {submitter[1]}")
    assert api.delete(f"/api/v1/sessions/{opened[0]}?wait=60").json()["state"] == "closed"
    again = api.post("/api/v1/sessions", open_body(namespace, runtime, num_nodes=1), format="json")
    assert again.status_code == 202, again.content
    for session in (opened[1], again.json()["id"]):
        assert api.delete(f"/api/v1/sessions/{session}?wait=60").json()["state"] == "closed"
