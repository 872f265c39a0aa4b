"""The whole path with real processes: REST -> PostgreSQL -> Redis -> a real Celery worker -> the cluster."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from dispatch_site import roles
from dispatch_site.celery import app
from dispatch_site.services import user_create
from dispatch_site.worker_command import worker_command
from jobs.models import Job, JobState
from runtimes.models import AllowListEntry
from tests.support.dispatch import GROUP, VERSION, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]
REPO = Path(__file__).resolve().parents[3]
WORKER_APPLICATION = "dispatch-e2e-worker"


@pytest.fixture
def worker(kubeconfig: str, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A real worker process on the test database and the test Redis; stopped by its pid afterwards."""
    db = connection.settings_dict
    env = os.environ | {
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        f"?application_name={WORKER_APPLICATION}",  # tells its sessions from the suite's other processes'
        "REDIS_URL": settings.REDIS_URL,
        "KUBECONFIG": kubeconfig,
    }
    log = (tmp_path / "worker.log").open("w")
    process = subprocess.Popen(
        worker_command(pool="solo"),
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    app.conf.task_always_eager = False
    try:
        yield process
    finally:
        app.conf.task_always_eager = True
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def test_an_accepted_job_is_started_by_a_real_worker(
    kube: Any, namespace: str, dispatch_on_cluster: str, worker: subprocess.Popen[str]
) -> None:
    _, token = user_create(username="wendy", role=roles.USER, namespaces=[namespace])
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 2,
    }
    response = api.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    assert response.json()["state"] == "pending"  # recorded before any cluster work

    def queued() -> Job | None:
        job = Job.objects.get(pk=job_id)
        return job if job.state != JobState.PENDING else None

    job = wait_for(queued, timeout=60, what="the worker to start the execution")
    assert job.state == JobState.QUEUED, job.message
    trainjob = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", f"{job_id}-1")
    assert trainjob["spec"]["trainer"]["numNodes"] == 2
    assert worker.poll() is None  # the worker is still alive


def _worker_backends() -> set[int]:
    """The worker's PostgreSQL sessions (by the application name its DATABASE_URL gives them)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [WORKER_APPLICATION],
        )
        return {row[0] for row in cursor.fetchall()}


def test_the_worker_keeps_its_database_session_and_replaces_one_that_died(
    kube: Any, namespace: str, dispatch_on_cluster: str, worker: subprocess.Popen[str], tmp_path: Path
) -> None:
    """Each start used to open a new PostgreSQL session (Celery's Django fixup closed it after every task);
    the worker keeps one per thread, and a session that dies while the worker idles (a PostgreSQL restart,
    here its backend terminated) is replaced before the next task's first query: no task fails on it."""
    _, token = user_create(username="kept", role=roles.USER, namespaces=[namespace])
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    body = {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
    }

    def started(job_ids: list[str]) -> bool:
        return Job.objects.filter(pk__in=job_ids, state=JobState.QUEUED).count() == len(job_ids)

    def submit(count: int) -> list[str]:
        ids = [api.post("/api/v1/jobs", body, format="json").json()["id"] for _ in range(count)]
        wait_for(lambda: started(ids), timeout=60, what=f"the worker to start {count} jobs")
        return ids

    submit(1)
    first = _worker_backends()
    assert len(first) == 1, first  # the solo worker's one session, open after its task
    submit(5)
    assert _worker_backends() == first  # the same session served the next five starts
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [next(iter(first))])
    wait_for(lambda: not (_worker_backends() & first), timeout=10, what="the worker's session to end")
    submit(2)
    replaced = _worker_backends()
    assert len(replaced) == 1 and not replaced & first, replaced
    log = (tmp_path / "worker.log").read_text()
    assert "OperationalError" not in log and "Retry in" not in log, log[-3000:]
    assert worker.poll() is None
