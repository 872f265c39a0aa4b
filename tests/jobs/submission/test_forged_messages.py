"""A Celery message is a request, not an order (issue 33): anyone who can write to the broker can send any
task by name, with any argument, and execution ids are sequential. The attack as it was measured: a delete
message for a running job's execution, sent straight to Redis, turned the job `cancelled` and deleted its
TrainJob within 45 s. Here it is sent the way an intruder would, with a Celery app of their own that knows
only the broker's address and the task's public name, to a real worker started as `make up` starts it (the
threads pool), with the real API server, Trainer, JobSet and Job controllers; the job is started by that
worker and watched by the real supervision cycle.

Each task acts only on what the database says was intended: the delete only when the execution's delete was
requested, the start only on an accepted execution it claims."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from django.conf import settings
from django.db import connection

from dispatch_site import roles
from dispatch_site.celery import app
from dispatch_site.services import user_create
from dispatch_site.worker_command import worker_command
from jobs import enqueue
from jobs.models import Execution, Job, JobState
from jobs.submission.tasks import MAX_SUBMIT_RETRIES
from runtimes.models import AllowListEntry
from tests.jobs.supervision.support import running_pods, supervise_until
from tests.support.dispatch import GROUP, VERSION, api_as, trainjob_exists, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def worker(kubeconfig: str, dispatch_on_cluster: str, tmp_path: Path) -> Iterator[Path]:
    """A real worker as `make up` runs it (scripts/up: threads), on the test database and the test Redis;
    yields its log; stopped by its pid afterwards."""
    db = connection.settings_dict
    env = os.environ | {
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "KUBECONFIG": dispatch_on_cluster,
        "DEBUG": "true",
    }
    log_path = tmp_path / "worker.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        worker_command(pool="threads", concurrency=4, name=f"forged-{uuid.uuid4().hex[:6]}@%h"),
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    app.conf.task_always_eager = False
    try:
        yield log_path
    finally:
        app.conf.task_always_eager = True
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def _intruder() -> Celery:
    """Somebody else's Celery app: the broker's address and nothing of dispatch's (plain kombu Redis
    transport, no task registered)."""
    return Celery("intruder", broker=settings.REDIS_URL, set_as_current=False)


def _processed(log: Path, task_id: str) -> bool:
    text = log.read_text()
    return f"[{task_id}] succeeded" in text or f"[{task_id}] raised" in text


def _trainjob(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs", name
    )
    return found


def test_a_forged_delete_message_for_a_running_job_leaves_it_running(
    kube: Any, namespace: str, worker: Path, django_capture_on_commit_callbacks: Any
) -> None:
    _, token = user_create(username=f"vic-{namespace[-6:]}", role=roles.USER, namespaces=[namespace])
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    response = api_as(token).post(
        "/api/v1/jobs",
        {
            "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
            "namespace": namespace,
            "image": "localhost/trainer:v1",
            "num_nodes": 2,
            "env": {"KWOK_STAY_RUNNING": "1"},
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    wait_for(
        lambda: Job.objects.get(pk=job_id).state == JobState.QUEUED,
        timeout=60,
        what="the worker to start the job",
    )
    running_pods(kube, namespace, job_id, count=2)
    supervise_until(token, job_id, lambda d: d["state"] == "running", what="the job running")
    execution = Execution.objects.get(job_id=job_id, attempt=1)
    pod_uids = {p.metadata.uid for p in running_pods(kube, namespace, job_id, count=2)}

    intruder = _intruder()
    sent = [
        intruder.send_task(enqueue.EXECUTION_DELETE, args=[execution.pk]).id,
        # A retry count past the task's last retry: its give-up path must not record the delete as asked for
        # (the stale sweep would then carry it out).
        intruder.send_task(enqueue.EXECUTION_DELETE, args=[execution.pk], retries=MAX_SUBMIT_RETRIES).id,
        # Ids are sequential: the neighbours of ours, and a start for the running execution.
        *(intruder.send_task(enqueue.EXECUTION_DELETE, args=[execution.pk + n]).id for n in (1, 2)),
        intruder.send_task(enqueue.EXECUTION_SUBMIT, args=[execution.pk]).id,
    ]
    wait_for(
        lambda: all(_processed(worker, task_id) for task_id in sent),
        timeout=60,
        what="the worker to run every forged message",
    )
    assert trainjob_exists(kube, namespace, execution.trainjob_name), "a forged message deleted the TrainJob"
    trainjob = _trainjob(kube, namespace, execution.trainjob_name)
    assert not trainjob["metadata"].get("deletionTimestamp")
    assert trainjob["spec"].get("suspend") is not True  # not even stopped
    assert trainjob["metadata"]["uid"] == execution.trainjob_uid  # the same TrainJob, never made again
    execution.refresh_from_db()
    assert execution.delete_requested_at is None
    supervise_until(token, job_id, lambda d: d["state"] == "running", what="the job still running")
    assert {p.metadata.uid for p in running_pods(kube, namespace, job_id, count=2)} == pod_uids
    assert Execution.objects.filter(job_id=job_id).count() == 1
    log = worker.read_text()
    assert "a delete message arrived that nothing in the database asked for" in log, log[-3000:]

    # The same worker does carry out a delete the database asked for: the user's cancel.
    assert api_as(token).post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    wait_for(
        lambda: Execution.objects.get(pk=execution.pk).objects_removed_at is not None,
        timeout=90,
        what="the cancel's delete done by the worker",
    )
