"""A session on a MultiKueue worker that is lost (issue 35), on the real planes (`scripts/cluster up
--multikueue`, the fixtures of tests/scripts/test_multikueue_planes.py): the session ends naming the worker
instead of staying `running` until its lifetime cap, its Workload is deactivated (MultiKueue never starts its
TrainJob on the other worker), its manager TrainJob goes, and once the worker is back what it still held of
the session goes too. What happened on the planes is read with the tests' own clients."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from jobs.models import Session
from jobs.sessions.lost import session_leftovers_sweep
from jobs.sessions.tasks import sessions_sweep
from runtimes.models import AllowListEntry
from tests.jobs.test_multikueue_jobs import SESSION_IMAGE, _copy_on, _running_pods, token  # noqa: F401
from tests.scripts.test_multikueue_planes import (  # noqa: F401 (fixtures)
    NAMESPACE,
    QUEUE,
    WORKERS,
    delete_everywhere,
    dispatched_to,
    manager,
    multikueue_planes,
    trainjob_or_none,
)
from tests.support.cluster import UP_TIMEOUT, Kube, _run_cluster
from tests.support.dispatch import api_as
from tests.support.kueue import KUEUE, RUNTIME, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("dispatch_kind_allowed")]


def _workload_of(kube: Kube, trainjob_uid: str) -> dict[str, Any] | None:
    try:
        found = kube.custom.list_namespaced_custom_object(
            *KUEUE, NAMESPACE, "workloads", label_selector=f"kueue.x-k8s.io/job-uid={trainjob_uid}"
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    items: list[dict[str, Any]] = found.get("items") or []
    return items[0] if items else None


@pytest.mark.django_db(transaction=True)
def test_a_session_whose_worker_is_lost_fails_naming_it_and_leaves_nothing_on_any_worker(
    manager: Kube,  # noqa: F811
    multikueue_planes: dict[str, Kube],  # noqa: F811
    token: str,  # noqa: F811
) -> None:
    """The worker running a session's trainer pod is stopped (`scripts/cluster down --worker`). Once Kueue
    evicts the session's Workload ("Admitting remote lost", workerLostTimeout 30 s here), the sessions
    sweep (the beat's) ends the session naming the worker, deactivates its Workload with dispatch's mark,
    and releases its TrainJob on the manager; MultiKueue never starts it on the other worker. Back, the
    worker loses the session's TrainJob copy, pods and runtime copy (dispatch's leftovers sweep, or Kueue's
    MultiKueue garbage collector for the TrainJob, whichever comes first)."""
    AllowListEntry.objects.update_or_create(
        kind="ClusterTrainingRuntime",
        namespace="",
        name=RUNTIME,
        defaults={"for_jobs": True, "for_sessions": True},
    )
    api = api_as(token)
    name = f"mkl-{uuid.uuid4().hex[:6]}"
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": RUNTIME},
        "namespace": NAMESPACE,
        "image": SESSION_IMAGE,
        "name": name,
        "queue_name": QUEUE,
        "timeout_seconds": 300,
    }
    lost = ""
    try:
        try:
            opened = api.post("/api/v1/sessions?wait=280", body, format="json")
            assert opened.status_code == 200, opened.content
            session = opened.json()
            assert session["state"] == "running", session
            trainjob = trainjob_or_none(manager, name)
            assert trainjob is not None
            lost = dispatched_to(manager, trainjob)
            assert session["cluster"] == lost, session
            other = next(w for w in WORKERS if w != lost)
            trainjob_uid = trainjob["metadata"]["uid"]

            down = _run_cluster("down", "--worker", lost, timeout=300)
            assert down.returncode == 0, down.stderr
            history: list[tuple[str, str]] = []

            def ended() -> Session | None:
                sessions_sweep()  # the beat's task, as a worker runs it
                row = Session.objects.get(pk=session["id"])
                seen = (row.state, row.message[:300])
                if not history or history[-1] != seen:
                    history.append(seen)
                return row if row.state in ("failed", "closing", "closed") else None

            wait_for(f"the session ended once {lost} is lost", ended, timeout=240, state=lambda: history)
            row = wait_for(
                "the session closed",
                lambda: (r := ended()) is not None and r.state == "closed" and r,
                timeout=240,
                state=lambda: history,
            )
            assert lost in row.message and "lost" in row.message, row.message
            assert "Admitting remote lost" in row.message, row.message
            assert row.worker_lost_at is not None
            shown = api.get(f"/api/v1/sessions/{session['id']}").json()
            assert shown["state"] == "closed" and lost in shown["message"], shown
            # Released on the manager; never started on the other worker.
            assert trainjob_or_none(manager, name) is None
            workload = _workload_of(manager, trainjob_uid)
            assert workload is None or workload["spec"].get("active") is False, workload
            assert trainjob_or_none(multikueue_planes[other], name) is None
            assert _running_pods(multikueue_planes[other], name) == []
            # The reachable worker's runtime copy went at close.
            assert _copy_on(multikueue_planes[other], name) is None
        finally:
            if lost:
                up = _run_cluster("up", "--multikueue", timeout=UP_TIMEOUT)
                assert up.returncode == 0, up.stderr[-4000:]
        back = multikueue_planes[lost]
        swept = 0

        def gone_from_the_returned_worker() -> bool:
            nonlocal swept
            swept += session_leftovers_sweep()["deleted"]
            return (
                trainjob_or_none(back, name) is None
                and not _running_pods(back, name)
                and _copy_on(back, name) is None
            )

        wait_for(
            f"{name}'s TrainJob, pods and runtime copy gone from {lost}",
            gone_from_the_returned_worker,
            timeout=180,
        )
        print(f"{name}'s leftovers on {lost}: {swept} object(s) deleted by dispatch's sweep")
        assert session_leftovers_sweep()["deleted"] == 0  # nothing left: the next pass deletes nothing
    finally:
        delete_everywhere(manager, multikueue_planes, name)
