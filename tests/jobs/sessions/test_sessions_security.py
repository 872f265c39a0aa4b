"""Sessions under attack and under races (issues 18 and 22), on the real control plane and PostgreSQL.

Each test performs the attack or drives the race through the real code path; a race proves its interleaving
by waiting for the state that shows it (a lock wait in pg_stat_activity behind a paused call), never by
sleeping. Where a fault is injected (one API call failing) the test says so: the real API server cannot fail
one chosen call on demand. Every test here failed on the code before the fix (see the commit messages).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone
from kubernetes.client.exceptions import ApiException
from rest_framework.test import APIClient

from cluster import exec as cluster_exec
from cluster.errors import ClusterUnavailable
from dispatch_site.models import NamespaceGrant
from jobs.models import Session, SessionState
from jobs.objects import TRAINING_RUNTIME
from jobs.sessions import execute, services
from jobs.sessions.rules import SessionRequest
from jobs.spec import RuntimeRef
from runtimes.models import AllowListEntry
from tests.jobs.sessions.test_sessions import (
    EXEC_CONTAINERS,
    IMAGE,
    PROBE,
    create_runtime,
    mpi_interactive,
    open_body,
    plain_runtime,
    pods_of,
    trainjob_exists,
)
from tests.support.dispatch import runtime_body, trainer_job, wait_for

pytestmark = pytest.mark.cluster

# The Job's own selector labels (controller-uid) and its name labels: a forger leaves them out, or the Job
# controller would adopt the pod and delete it as an extra one. (Exact keys: `jobset.sigs.k8s.io/
# replicatedjob-name`, which the copy keeps, contains "job-name".)
JOB_SELECTOR_LABELS = frozenset(
    {"batch.kubernetes.io/controller-uid", "controller-uid", "batch.kubernetes.io/job-name", "job-name"}
)


def _open_running(api: APIClient, namespace: str, runtime: str, **extra: Any) -> dict[str, Any]:
    response = api.post(
        "/api/v1/sessions?wait=90", open_body(namespace, runtime, num_nodes=1) | extra, format="json"
    )
    assert response.status_code == 200, response.content
    session: dict[str, Any] = response.json()
    assert session["state"] == "running", session
    return session


def _exec(api: APIClient, session_id: str, command: Any, **extra: Any) -> Any:
    return api.post(f"/api/v1/sessions/{session_id}/exec", {"command": command} | extra, format="json")


def _close(api: APIClient, session_id: str) -> dict[str, Any]:
    closed: dict[str, Any] = api.delete(f"/api/v1/sessions/{session_id}?wait=90").json()
    assert closed["state"] == "closed", closed
    return closed


def _lock_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def _thread(target: Callable[[], Any], results: dict[str, Any], name: str) -> threading.Thread:
    def run() -> None:
        try:
            results[name] = target()
        except BaseException as exc:
            results[name] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------- names (issue 18, item 3)


@pytest.mark.parametrize("name", ["jabcdefghij-2", "jabcdefghij-12-debug"])
def test_a_session_cannot_take_the_name_of_a_jobs_trainjob(user_api: APIClient, name: str) -> None:
    """The attack: a session named `<other job id>-2` holds that TrainJob name, and the job's retry then
    finds it taken. Such names are a 400 now (before: accepted, then the cluster was asked)."""
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": "team-a",
        "image": IMAGE,
        "name": name,
    }
    response = user_api.post("/api/v1/sessions", body, format="json")
    assert response.status_code == 400, response.content
    assert "TrainJob name" in response.json()["name"][0]
    assert not Session.objects.exists()


# ---------------------------------------------------------------- label domain (issue 18, item 4)


def test_a_label_domain_change_does_not_orphan_an_open_session(
    kube: Any, namespace: str, api: APIClient, platform_api: APIClient
) -> None:
    runtime = plain_runtime(kube, namespace)
    session = _open_running(api, namespace, runtime)
    assert (
        platform_api.patch("/api/v1/settings", {"label_domain": "other.example"}, format="json").status_code
        == 200
    )
    # Exec, close and clean-up still find the session's objects under the domain it opened with.
    assert _exec(api, session["id"], "echo still").json()["stdout"] == "still\n"
    _close(api, session["id"])
    assert not trainjob_exists(kube, namespace, session["id"])  # before: left running, unfollowed
    wait_for(lambda: pods_of(kube, namespace, session["id"]) == [], what="the session's pods gone")


# ---------------------------------------------------------------- races (issue 18, item 14)


@pytest.mark.django_db(transaction=True)
def test_close_racing_open_never_leaks_a_trainjob(
    kube: Any, namespace: str, submitter: tuple[User, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Open is paused just before it creates the session's objects (the row is committed); close arrives
    then. Before: close found nothing, closed the session, and open's TrainJob ran `sleep infinity` for
    ever. Now close waits on the row lock open holds while it creates (seen in pg_stat_activity), then
    deletes what open made."""
    runtime = plain_runtime(kube, namespace)
    owner = submitter[0]
    entered, release = threading.Event(), threading.Event()
    real = services.create_or_adopt

    def paused(kind: str, body: dict[str, Any], *args: Any) -> Any:
        if kind == TRAINING_RUNTIME:
            entered.set()
            assert release.wait(60)
        return real(kind, body, *args)

    monkeypatch.setattr(services, "create_or_adopt", paused)
    request = SessionRequest(
        runtime=RuntimeRef(kind="TrainingRuntime", name=runtime, namespace=namespace),
        namespace=namespace,
        image=IMAGE,
        num_nodes=1,
        name="raced",
    )
    results: dict[str, Any] = {}
    opener = _thread(lambda: services.session_open(owner=owner, request=request), results, "open")
    assert entered.wait(60), results
    row = Session.objects.get(namespace=namespace, name="raced")
    closer = _thread(lambda: services.session_close(actor=owner, session=row), results, "close")
    seen_lock = (
        wait_for(lambda: _lock_waiters() > 0 or not closer.is_alive(), timeout=30) and _lock_waiters() > 0
    )
    closed_first = not closer.is_alive()
    release.set()
    opener.join(60)
    closer.join(60)
    assert not isinstance(results.get("open"), BaseException), results
    assert not isinstance(results.get("close"), BaseException), results
    services.session_wait(session=row, seconds=60, closing=True)
    row.refresh_from_db()
    assert row.state == SessionState.CLOSED
    assert not trainjob_exists(kube, namespace, "raced"), "a TrainJob outlived its closed session"
    assert seen_lock and not closed_first, "close did not wait for open's objects"


@pytest.mark.django_db(transaction=True)
def test_no_command_starts_after_close_was_acknowledged(
    kube: Any, namespace: str, submitter: tuple[User, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exec is paused after it read the session as running, before the API server opens the stream; close
    arrives then. Before: close was acknowledged at once and the command ran afterwards. Now close waits on
    the row lock exec holds until its command has started (seen in pg_stat_activity)."""
    owner, token = submitter
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    session = _open_running(api, namespace, plain_runtime(kube, namespace))
    row = Session.objects.get(pk=session["id"])
    entered, release = threading.Event(), threading.Event()
    real = cluster_exec._exec_core

    def paused() -> Any:
        entered.set()
        assert release.wait(60)
        return real()

    monkeypatch.setattr(cluster_exec, "_exec_core", paused)
    results: dict[str, Any] = {}
    runner = _thread(
        lambda: execute.session_exec(actor=owner, session=row, command="echo ran"), results, "exec"
    )
    assert entered.wait(60), results
    closer = _thread(lambda: services.session_close(actor=owner, session=row), results, "close")
    wait_for(lambda: _lock_waiters() > 0 or not closer.is_alive(), timeout=30)
    acknowledged_before_the_command = not closer.is_alive()
    waited = _lock_waiters() > 0
    release.set()
    runner.join(60)
    closer.join(60)
    assert not acknowledged_before_the_command, (
        f"close was acknowledged while exec was about to run: {results}"
    )
    assert waited
    assert results["exec"].stdout == "ran\n"  # it started before close went through
    assert results["close"].state in (SessionState.CLOSING, SessionState.CLOSED)
    services.session_wait(session=row, seconds=60, closing=True)
    assert not trainjob_exists(kube, namespace, session["id"])


# ---------------------------------------------------------------- the sweep (issue 18, item 14)


def test_the_sweep_moves_a_session_whose_watch_message_was_lost_and_one_left_closing(
    kube: Any, namespace: str, api: APIClient
) -> None:
    """In these tests on_commit never fires, so the watcher messages are never sent: exactly a lost
    message. Before: the session stayed `starting` for ever, and a close without ?wait stayed `closing`."""
    runtime = plain_runtime(kube, namespace)
    response = api.post("/api/v1/sessions", open_body(namespace, runtime, num_nodes=1), format="json")
    assert response.status_code == 202, response.content
    session_id = response.json()["id"]
    wait_for(
        lambda: any(p.status.phase == "Running" for p in pods_of(kube, namespace, session_id)),
        what="the trainer pod Running",
    )
    assert Session.objects.get(pk=session_id).state == SessionState.STARTING
    services.sessions_sweep()
    assert Session.objects.get(pk=session_id).state == SessionState.RUNNING

    assert api.delete(f"/api/v1/sessions/{session_id}").json()["state"] == "closing"
    wait_for(lambda: pods_of(kube, namespace, session_id) == [], what="the session's pods gone")
    assert Session.objects.get(pk=session_id).state == SessionState.CLOSING
    services.sessions_sweep()
    assert Session.objects.get(pk=session_id).state == SessionState.CLOSED


def test_a_session_past_the_maximum_lifetime_is_refused_and_closed_by_the_sweep(
    kube: Any, namespace: str, api: APIClient, settings: Any
) -> None:
    settings.SESSION_MAX_LIFETIME_SECONDS = 3600
    session = _open_running(api, namespace, plain_runtime(kube, namespace))
    Session.objects.filter(pk=session["id"]).update(created_at=timezone.now() - timedelta(hours=2))
    refused = _exec(api, session["id"], "echo late")
    assert refused.status_code == 409, refused.content
    assert "maximum session lifetime" in refused.json()["detail"]
    assert services.sessions_sweep()["expired"] == 1
    row = Session.objects.get(pk=session["id"])
    assert row.state in (SessionState.CLOSING, SessionState.CLOSED)
    assert "maximum session lifetime" in row.message
    services.session_wait(session=row, seconds=60, closing=True)
    assert not trainjob_exists(kube, namespace, session["id"])


# ---------------------------------------------------------------- transient errors and the trainer pod


def test_one_transient_error_does_not_fail_the_session(
    kube: Any, namespace: str, api: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Injected faults (the real API server cannot fail one chosen call): one exec refused by the API server
    and one pod read that cannot reach it. Before: the refused exec read the pod, the read failed, and the
    session was failed for good. Now a failed read decides nothing (503), and the session keeps running."""
    session = _open_running(api, namespace, plain_runtime(kube, namespace))
    faults = {"get_pod": 1, "exec": 1}
    real_get_pod, real_tls = cluster_exec.get_pod, cluster_exec._tls

    def flaky_get_pod(namespace: str, name: str) -> Any:
        if faults["get_pod"]:
            faults["get_pod"] -= 1
            raise ClusterUnavailable(f"Pod {namespace}/{name}", "connection refused (injected)")
        return real_get_pod(namespace, name)

    def refused_exec(configuration: Any) -> Any:
        if faults["exec"]:
            faults["exec"] -= 1
            raise ApiException(status=403, reason="exec refused (injected)")
        return real_tls(configuration)

    monkeypatch.setattr(cluster_exec, "get_pod", flaky_get_pod)
    monkeypatch.setattr(cluster_exec, "_tls", refused_exec)
    answers = [_exec(api, session["id"], "echo ok").status_code for _ in range(3)]
    assert Session.objects.get(pk=session["id"]).state == SessionState.RUNNING, answers
    assert answers[-1] == 200 and set(answers[:-1]) <= {503, 400}, answers
    _close(api, session["id"])


def test_a_replaced_trainer_pod_fails_the_session_naming_the_replacement(
    kube: Any, namespace: str, api: APIClient
) -> None:
    """The Job replaces a deleted trainer pod (backoffLimit 1). dispatch does not move the session to the
    new pod, whose processes and files are not the old one's: exec is a 409 naming both pods (before: "is
    gone", with no word of the replacement)."""
    body = runtime_body("TrainingRuntime", "retrying", namespace)
    trainer_job(body)["template"]["spec"]["backoffLimit"] = 1
    session = _open_running(api, namespace, create_runtime(kube, namespace, body))
    kube.core.delete_namespaced_pod(session["pod"], namespace, grace_period_seconds=0)
    replacement = wait_for(
        lambda: next(
            (
                p
                for p in pods_of(kube, namespace, session["id"])
                if p.metadata.name != session["pod"] and p.status.phase == "Running"
            ),
            None,
        ),
        what="the Job's replacement pod Running",
    )
    response = _exec(api, session["id"], "echo where")
    assert response.status_code == 409, response.content
    detail = response.json()["detail"]
    assert f"{session['pod']} was replaced by {replacement.metadata.name}" in detail
    assert "close the session and open a new one" in detail
    assert Session.objects.get(pk=session["id"]).state == SessionState.FAILED
    _close(api, session["id"])


def test_a_pod_recreated_under_the_trainer_pods_name_is_refused(
    kube: Any, namespace: str, api: APIClient
) -> None:
    """The attack: after the trainer pod is gone, someone creates a pod under its name; exec addressed by
    name alone ran the user's command in the stranger's pod (before: 200). Now the UID differs: 409."""
    session = _open_running(api, namespace, plain_runtime(kube, namespace))
    kube.core.delete_namespaced_pod(session["pod"], namespace, grace_period_seconds=0)
    wait_for(
        lambda: (
            session["pod"] not in [p.metadata.name for p in kube.core.list_namespaced_pod(namespace).items]
        ),
        what="the trainer pod gone",
    )
    stranger = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": session["pod"]},
        "spec": {
            "containers": [
                {"name": "node", "image": IMAGE, "env": [{"name": "KWOK_STAY_RUNNING", "value": "1"}]}
            ],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
        },
    }
    kube.core.create_namespaced_pod(namespace, stranger)
    wait_for(
        lambda: kube.core.read_namespaced_pod(session["pod"], namespace).status.phase == "Running",
        what="the stranger's pod Running",
    )
    response = _exec(api, session["id"], "echo hijacked")
    assert response.status_code == 409, response.content
    assert "re-created under the same name" in response.json()["detail"]
    _close(api, session["id"])


# ---------------------------------------------------------------- what exec re-checks (issue 22)


def test_exec_runs_only_in_the_trainer_container_or_one_the_runtime_marks_exec_able(
    kube: Any, namespace: str, api: APIClient
) -> None:
    body = mpi_interactive(namespace, "unmarked")
    del body["metadata"]["annotations"][EXEC_CONTAINERS]
    session = _open_running(api, namespace, create_runtime(kube, namespace, body), num_nodes=3)
    response = _exec(api, session["id"], ["echo", "probe"], container=PROBE)
    assert response.status_code == 400, response.content  # before: 200, in a container nobody reviewed
    assert "exec-able" in response.json()["detail"]
    assert _exec(api, session["id"], ["echo", "node"]).json()["stdout"] == "node\n"
    _close(api, session["id"])


def test_a_withdrawn_grant_or_allow_list_entry_ends_the_shell(
    kube: Any, namespace: str, api: APIClient, submitter: tuple[User, str]
) -> None:
    runtime = plain_runtime(kube, namespace)
    session = _open_running(api, namespace, runtime)
    assert _exec(api, session["id"], "true").status_code == 200

    entry = AllowListEntry.objects.get(name=runtime)
    entry.for_sessions = False
    entry.save()
    response = _exec(api, session["id"], "echo after-review")
    assert response.status_code == 403, response.content  # before: 200
    assert "no longer on the allow-list for sessions" in response.json()["detail"]
    entry.for_sessions = True
    entry.save()

    NamespaceGrant.objects.filter(user=submitter[0], namespace=namespace).delete()
    response = _exec(api, session["id"], "echo after-revoke")
    assert response.status_code == 403, response.content  # before: 200
    assert "no longer granted" in response.json()["detail"]
    _close(api, session["id"])


# ---------------------------------------------------------------- a forged pod in the owner chain (issue 31)


def test_a_pod_forged_into_the_owner_chain_is_never_the_trainer_pod(
    kube: Any, namespace: str, api: APIClient
) -> None:
    """Somebody who may create pods in the namespace copies the trainer pod's labels, its completion index
    and an ownerReference to the session's real Job (name and UID), under a name that sorts first: the pod is
    in the owner chain, and the trainer pod used to be the smallest name there, so the owner's commands would
    have run in the forger's image. The admission guard refuses such a pod from a namespace member
    (tests/deploy/test_guard_doors.py); here it is made by the plane's admin, whom the guard exempts, so what
    is shown is dispatch's own defence without the guard: two pods claim the trainer pod's place, dispatch
    takes neither and fails the session at once, naming both."""
    runtime = plain_runtime(kube, namespace)
    opened = api.post(
        "/api/v1/sessions", open_body(namespace, runtime, name="forged", num_nodes=1), format="json"
    )
    assert opened.status_code == 202, opened.content
    session = opened.json()
    real = wait_for(
        lambda: next(iter(pods_of(kube, namespace, "forged")), None), what="the Job's trainer pod"
    )
    job = kube.batch.read_namespaced_job(real.metadata.owner_references[0].name, namespace)
    copied = {k: v for k, v in real.metadata.labels.items() if k not in JOB_SELECTOR_LABELS}
    kube.core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "forged-a",  # sorts before forged-node-0-0-<suffix>
                "labels": copied,
                "annotations": {"batch.kubernetes.io/job-completion-index": "0"},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job.metadata.name,
                        "uid": job.metadata.uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "containers": [
                    {
                        "name": "node",
                        "image": "localhost/forger:v1",
                        "env": [{"name": "KWOK_STAY_RUNNING", "value": "1"}],
                    }
                ]
            },
        },
    )
    wait_for(
        lambda: all(
            kube.core.read_namespaced_pod(n, namespace).status.phase == "Running"
            for n in ("forged-a", real.metadata.name)
        ),
        what="the forged pod and the real trainer pod running",
    )
    services.session_observe(session_id=session["id"])  # the watcher's look
    row = Session.objects.get(pk=session["id"])
    assert row.state == SessionState.FAILED, (row.state, row.pod, row.message)
    assert row.pod == "" and row.pod_uid == ""
    assert "2 pods claim the trainer pod's place" in row.message
    assert "forged-a" in row.message and real.metadata.name in row.message
    assert "does not guess" in row.message
    assert api.delete(f"/api/v1/sessions/{session['id']}?wait=60").json()["state"] == "closed"
