"""A session's TrainJob is stopped before it is deleted (issue 32): the Trainer rebuilds the JobSet of a
TrainJob it still holds when the JobSet goes, so a TrainJob deleted unsuspended can start the session's pods
again behind the close. Observed from outside dispatch: the test's own watch on the namespace's TrainJobs
records the TrainJob as it was when its deletion began."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kubernetes import watch
from rest_framework.test import APIClient

from tests.jobs.sessions.test_sessions import open_body, plain_runtime
from tests.support.dispatch import GROUP, VERSION

pytestmark = pytest.mark.cluster


def test_closing_a_session_suspends_its_trainjob_before_deleting_it(
    kube: Any, namespace: str, api: APIClient
) -> None:
    runtime = plain_runtime(kube, namespace)
    opened = api.post("/api/v1/sessions?wait=60", open_body(namespace, runtime, name="stopme"), format="json")
    assert opened.status_code == 200 and opened.json()["state"] == "running", opened.content

    at_deletion: list[dict[str, Any]] = []
    stream = watch.Watch()
    listing = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")

    def record() -> None:
        for event in stream.stream(
            kube.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "trainjobs",
            resource_version=listing["metadata"]["resourceVersion"],
            timeout_seconds=120,
        ):
            obj = event["object"]
            if obj["metadata"]["name"] != "stopme":
                continue
            if obj["metadata"].get("deletionTimestamp") or event["type"] == "DELETED":
                at_deletion.append(obj)
                stream.stop()

    watcher = threading.Thread(target=record, daemon=True)
    watcher.start()
    closed = api.delete(f"/api/v1/sessions/{opened.json()['id']}?wait=90")
    assert closed.status_code == 200 and closed.json()["state"] == "closed", closed.content
    watcher.join(30)
    assert at_deletion, "the watch saw no deletion of the session's TrainJob"
    first = at_deletion[0]
    assert first["spec"].get("suspend") is True, first["spec"]
    suspended = [c for c in first.get("status", {}).get("conditions") or [] if c["type"] == "Suspended"]
    assert suspended and suspended[0]["status"] == "True", first.get("status")


def test_a_session_close_waits_while_the_trainers_lease_is_renewed_and_the_close_timeout_still_ends_it(
    kube: Any, kubeconfig: str, namespace: str, api: APIClient, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """The session's TrainJob is suspended but the Trainer, running, cannot show it Suspended (a
    ValidatingAdmissionPolicy denies its status writes to that TrainJob, as in test_stop_lease.py).
    Past the stop's wait (shortened to 2 s) the close keeps waiting while the Trainer's leader Lease is
    renewed, and the session's message says so; the close timeout (shortened to 20 s) still deletes the
    TrainJob as it is and closes the session."""
    from jobs import stopping
    from jobs.models import Session
    from jobs.sessions.services import session_close_observe
    from tests.jobs.submission.test_stop_lease import _trainer_cannot_write_status

    monkeypatch.setattr(stopping, "STOP_WAIT_SECONDS", 2.0)
    settings.SESSION_CLOSE_TIMEOUT_SECONDS = 20
    runtime = plain_runtime(kube, namespace)
    opened = api.post(
        "/api/v1/sessions?wait=60", open_body(namespace, runtime, name="leasewait"), format="json"
    )
    assert opened.status_code == 200 and opened.json()["state"] == "running", opened.content
    session_id = opened.json()["id"]
    with _trainer_cannot_write_status(kubeconfig, namespace, "leasewait"):
        closed = api.delete(f"/api/v1/sessions/{session_id}")
        assert closed.status_code in (200, 202), closed.content
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            session_close_observe(session_id=session_id)
            time.sleep(0.5)
        session = Session.objects.get(pk=session_id)
        assert session.state == "closing", session.state
        assert "the Trainer is running" in session.message, session.message
        trainjob = kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainjobs", "leasewait"
        )
        assert trainjob["spec"]["suspend"] is True and not trainjob["metadata"].get("deletionTimestamp")
        deadline = time.monotonic() + 40
        while Session.objects.get(pk=session_id).state != "closed" and time.monotonic() < deadline:
            session_close_observe(session_id=session_id)
            time.sleep(0.5)
    assert Session.objects.get(pk=session_id).state == "closed"
