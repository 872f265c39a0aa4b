"""Stop before delete when the Trainer does not answer (issue 32), against the real control plane: the local
plane runs the Trainer with leader election as the release does (scripts/cluster: Lease
kubeflow-system/trainer.kubeflow.org, 15 s), and dispatch deletes a TrainJob the Trainer has not shown
stopped only once that Lease shows the Trainer not running. And a TrainJob whose runtime copy went first is
still stopped before its delete: the Trainer rebuilds from its runtime snapshot, so dispatch restores the copy
from it and the stop goes through.

What the cluster did is read from the test's own TrainJob watch (tests.support.kueue.Recorder: the DELETED
event keeps the object's last state), and what the user sees from the job's timeline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from jobs import stopping
from jobs.models import Execution, JobEvent
from jobs.submission import cancel
from jobs.submission.errors import TransientSubmitError
from tests.jobs.supervision.support import paused, supervise_until
from tests.support.cluster import Kube
from tests.support.deploy import kubectl
from tests.support.dispatch import api_as, get_job, job_body, submit_job, wait_for
from tests.support.kueue import Recorder

pytestmark = [pytest.mark.cluster, pytest.mark.django_db, pytest.mark.usefixtures("dispatch_kind_allowed")]

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
TRAINER = "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"


def _deletes(recorder: Recorder, name: str) -> list[dict[str, Any]]:
    """The TrainJob `name` as the watch saw it deleted (its last state), or as first seen with a
    deletionTimestamp."""
    return [
        seen.obj
        for seen in recorder.of("TrainJob")
        if (seen.obj.get("metadata") or {}).get("name") == name
        and (seen.type == "DELETED" or (seen.obj.get("metadata") or {}).get("deletionTimestamp"))
    ]


def _suspended_shown(trainjob: dict[str, Any]) -> bool:
    conditions = (trainjob.get("status") or {}).get("conditions") or []
    return (trainjob.get("spec") or {}).get("suspend") is True and any(
        c.get("type") == "Suspended" and c.get("status") == "True" for c in conditions
    )


def _running_job(token: str, namespace: str, capture: Any) -> Execution:
    """A job whose rank keeps running, cancelled with its delete message lost: the test drives the delete
    task itself (_deliver)."""
    job_id = submit_job(token, job_body(namespace, env={"KWOK_STAY_RUNNING": "1"}), capture)
    supervise_until(token, job_id, lambda d: d["state"] == "running", what="running")
    return Execution.objects.get(job_id=job_id, attempt=1)


def _cancel(token: str, execution: Execution, capture: Any) -> None:
    with capture(execute=False) as lost:
        cancelled = api_as(token).post(f"/api/v1/jobs/{execution.job_id}/cancel")
    assert cancelled.status_code in (200, 202), cancelled.content
    assert lost, "the cancel sent no delete"


def _deliver(execution: Execution, *, until: Any, seconds: float, retries: list[str] | None = None) -> bool:
    """The delete task's deliveries (its retries, without their backoff) until `until()` or `seconds` ran
    out; whether `until()` held. Each delivery's retry reason goes to `retries`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            cancel.execution_delete(execution_id=execution.pk)
        except TransientSubmitError as exc:
            if retries is not None:
                retries.append(str(exc))
        if until():
            return True
        time.sleep(0.5)
    return bool(until())


@contextmanager
def _trainer_cannot_write_status(kubeconfig: str, namespace: str, name: str) -> Iterator[None]:
    """The Trainer keeps running (its Lease renewed) but cannot show anything on this one TrainJob: a
    ValidatingAdmissionPolicy denies its status writes to it. The fault a real Trainer shows when it is stuck
    or slow on one TrainJob; the real Trainer cannot be made to do that on demand, so the API server's own
    admission injects it. In force once a server-side dry run of such a write, as the Trainer, is denied."""
    policy = f"test-no-status-{namespace}"
    objects = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [GROUP],
                            "apiVersions": ["*"],
                            "operations": ["UPDATE"],
                            "resources": ["trainjobs/status"],
                        }
                    ]
                },
                "matchConditions": [
                    {"name": "the-trainer", "expression": f"request.userInfo.username == '{TRAINER}'"}
                ],
                "validations": [
                    {
                        "expression": (
                            f"object.metadata.namespace != '{namespace}' || object.metadata.name != '{name}'"
                        ),
                        "message": "test: the Trainer may not write this TrainJob's status",
                    }
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {"policyName": policy, "validationActions": ["Deny"]},
        },
    ]
    kubectl(
        "apply",
        "-f",
        "-",
        kubeconfig=kubeconfig,
        stdin=json.dumps({"kind": "List", "apiVersion": "v1", "items": objects}),
    )
    probe = {
        "status": {
            "conditions": [
                {
                    "type": "Probe",
                    "status": "True",
                    "reason": "Probe",
                    "message": "probe",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    }

    def denied() -> bool:
        result = kubectl(
            "patch",
            "trainjobs.trainer.kubeflow.org",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(probe),
            "--dry-run=server",
            f"--as={TRAINER}",
            kubeconfig=kubeconfig,
            check=False,
        )
        return result.returncode != 0 and "may not write this TrainJob's status" in result.stderr

    try:
        wait_for(denied, timeout=30, what="the policy to deny the Trainer's status writes")
        yield
    finally:
        kubectl(
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            policy,
            "--ignore-not-found",
            kubeconfig=kubeconfig,
            check=False,
        )


def test_a_delete_waits_while_the_trainers_lease_is_renewed_and_goes_ahead_once_it_is_not(
    kube: Kube,
    kubeconfig: str,
    namespace: str,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    """A cancelled job's TrainJob is suspended (the stop is accepted) but the Trainer, running, does not
    show it Suspended (it cannot write that TrainJob's status). Before, once STOP_WAIT_SECONDS (shortened
    here to 2 s) passed the delete went ahead anyway, though a running Trainer would rebuild the JobSet of
    the TrainJob it still held. Now, while the Trainer's leader Lease is renewed, the delete keeps waiting
    (many deliveries, no delete seen by the test's watch), each retry says it waits for the Trainer (not
    "still being deleted"), and the job's timeline says so once. Past STOP_STUCK_SECONDS (shortened to 6 s)
    the wait escalates: `stop-stuck` once on the timeline, and /metrics shows the pending delete and its age
    for on-call's alert. Then the Trainer process stops (SIGSTOP: its Lease goes stale after 15 s plus the
    margin) and the delete goes ahead: the test's watch sees the TrainJob deleted, suspended, and /metrics no
    longer counts it."""
    monkeypatch.setattr(stopping, "STOP_WAIT_SECONDS", 2.0)
    monkeypatch.setattr(cancel, "STOP_STUCK_SECONDS", 6.0)
    settings.METRICS_TOKEN = ""
    token = submitter[1]
    recorder = Recorder(kube, namespace).start(kinds=("TrainJob",))
    try:
        execution = _running_job(token, namespace, django_capture_on_commit_callbacks)
        name = execution.trainjob_name
        with _trainer_cannot_write_status(kubeconfig, namespace, name):
            _cancel(token, execution, django_capture_on_commit_callbacks)
            retries: list[str] = []
            gone = _deliver(
                execution, until=lambda: bool(_deletes(recorder, name)), seconds=12, retries=retries
            )
            assert not gone, "the TrainJob was deleted while the Trainer was running and had not stopped it"
            trainjob = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
            assert trainjob["spec"]["suspend"] is True and not _suspended_shown(trainjob)
            assert retries and "TrainJob (waiting for the Trainer to stop it)" in retries[-1], retries[-1:]
            assert not any("TrainJob still being deleted" in r for r in retries), retries
            timeline = get_job(token, execution.job_id)["timeline"]
            waiting = [e for e in timeline if e["kind"] == "stop-waiting"]
            assert len(waiting) == 1, waiting  # once, not once per delivery
            assert "the Trainer is running" in waiting[0]["message"], waiting[0]
            assert "kubeflow-system/trainer.kubeflow.org" in waiting[0]["message"], waiting[0]
            stuck = [e for e in timeline if e["kind"] == "stop-stuck"]
            assert len(stuck) == 1, stuck
            assert "does not act on the stop" in stuck[0]["message"], stuck[0]
            pending = _pending_deletes()
            assert pending["dispatch_deletes_pending"] >= 1, pending
            assert pending["dispatch_delete_oldest_pending_seconds"] >= 12, pending
            with paused("trainer"):  # the Trainer is down: its Lease is no longer renewed
                gone = _deliver(execution, until=lambda: bool(_deletes(recorder, name)), seconds=60)
                assert gone, "the TrainJob was never deleted after the Trainer's Lease went stale"
                removed = _deliver(
                    execution,
                    until=lambda: Execution.objects.get(pk=execution.pk).objects_removed_at is not None,
                    seconds=30,
                )
                assert removed, "the delete never finished"
    finally:
        recorder.stop()
    [last] = _deletes(recorder, name)[:1]
    assert last["spec"]["suspend"] is True
    assert JobEvent.objects.filter(job_id=execution.job_id, kind="stop-waiting").count() == 1
    assert JobEvent.objects.filter(job_id=execution.job_id, kind="stop-stuck").count() == 1
    assert _pending_deletes()["dispatch_deletes_pending"] == 0


def _pending_deletes() -> dict[str, float]:
    """The pending-delete figures as a scraper reads them from GET /metrics."""
    response = Client().get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200, response.content
    wanted = {"dispatch_deletes_pending", "dispatch_delete_oldest_pending_seconds"}
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
        if sample.name in wanted
    }


def test_a_trainjob_whose_runtime_copy_went_first_is_stopped_before_its_delete(
    kube: Kube,
    namespace: str,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The running attempt's runtime copy is deleted (by a namespace member, say). The Trainer's webhook then
    refuses every update of the TrainJob, the stop included. Before, the delete went ahead unsuspended,
    assuming nothing could rebuild without the copy; but the Trainer rebuilds from its
    `<trainjob>-runtime-snapshot` ConfigMap. Now dispatch restores the copy from that snapshot (owned by the
    TrainJob), the stop is accepted, and the test's watch sees the TrainJob deleted suspended and Suspended;
    the restored copy goes with it."""
    token = submitter[1]
    recorder = Recorder(kube, namespace).start(kinds=("TrainJob",))
    try:
        execution = _running_job(token, namespace, django_capture_on_commit_callbacks)
        name = execution.trainjob_name
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", name)

        def refused() -> bool:
            from kubernetes.client.rest import ApiException

            try:
                kube.custom.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    "trainjobs",
                    name,
                    {"metadata": {"labels": {"probe": "1"}}},
                    dry_run="All",
                )
            except ApiException as exc:
                return "must be created before the TrainJob is created" in str(exc.body)
            return False

        wait_for(refused, timeout=30, what="the Trainer's webhook to refuse updates of the TrainJob")
        _cancel(token, execution, django_capture_on_commit_callbacks)
        gone = _deliver(execution, until=lambda: bool(_deletes(recorder, name)), seconds=60)
        assert gone, "the TrainJob was never deleted"
    finally:
        recorder.stop()
    [last] = _deletes(recorder, name)[:1]
    assert _suspended_shown(last), f"deleted without the stop shown: {last.get('spec')} {last.get('status')}"

    def copy_gone() -> bool:
        items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes")[
            "items"
        ]
        return name not in {i["metadata"]["name"] for i in items}

    wait_for(copy_gone, timeout=60, what="the restored copy to go with its TrainJob")


def test_a_trainjob_a_stale_start_delivery_made_is_stopped_before_its_delete(
    kube: Kube,
    namespace: str,
    submitter: tuple[User, str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A start delivery that lost its claim deletes what it created itself once the execution moved on
    without it (jobs.submission.start._claim_lost). It used to delete its TrainJob bare, while running; now
    through the same stop-before-delete as every attempt's. Reaching that branch through a real delivery needs
    the execution to end between the delivery's fence and its create, so the test sets that state directly
    (the execution ended, no delete of its own asked) and hands _claim_lost what the create returned (the
    TrainJob as read): the test's watch sees it deleted suspended and Suspended."""
    from jobs.submission import start

    token = submitter[1]
    recorder = Recorder(kube, namespace).start(kinds=("TrainJob",))
    try:
        execution = _running_job(token, namespace, django_capture_on_commit_callbacks)
        name = execution.trainjob_name
        made = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
        Execution.objects.filter(pk=execution.pk).update(state="succeeded", delete_requested_at=None)
        start._claim_lost(execution.pk, "stale-delivery", 0, [made])
        wait_for(lambda: bool(_deletes(recorder, name)), timeout=30, what="the made TrainJob deleted")
    finally:
        recorder.stop()
    [last] = _deletes(recorder, name)[:1]
    assert _suspended_shown(last), f"deleted without the stop shown: {last.get('spec')} {last.get('status')}"
