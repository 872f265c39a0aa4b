"""The change feed from the client's side, and how a wait ends: Client.watch(), `dispatch jobs --watch`, and
`dispatch start --wait` / `dispatch status --wait` exiting 1 when the job ends failed and 3 when it is refused
(as `plan` does). Real jobs on the local control plane, moved by the supervisor loop (`manage.py supervise`'s
run_forever) in a thread; the client and the CLI talk HTTP to the dispatch server process."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dispatch_client import Client, JobChange
from django.db import connection

from dispatch_site import roles
from dispatch_site.services import user_create
from jobs.models import Job
from jobs.observability import cursors
from runtimes.models import AllowListEntry
from tests.client.conftest import DISPATCH, IMAGE, Dispatch

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def supervisor(kubeconfig: str, settings: Any) -> Iterator[None]:
    """The supervisor loop in a thread of this process, pointed at the local control plane."""
    from jobs.supervision.watch import run_forever

    settings.KUBECONFIG = kubeconfig
    settings.KUBE_TIMEOUT_SECONDS = 20

    stop = threading.Event()

    def loop() -> None:
        try:
            run_forever(stop.is_set, interval=1)
        finally:
            connection.close()

    thread = threading.Thread(target=loop, daemon=True, name="supervisor")
    thread.start()
    yield
    stop.set()
    thread.join(timeout=20)


@pytest.fixture
def client(dispatch_server: Dispatch, namespace: str) -> Client:
    AllowListEntry.objects.get_or_create(
        kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind", defaults={"for_jobs": True}
    )
    _, token = user_create(username=f"cw-{uuid.uuid4().hex[:8]}", role=roles.USER, namespaces=[namespace])
    return Client(dispatch_server.url, token, namespace=namespace)


def test_start_wait_exits_1_when_the_job_fails_and_status_wait_says_the_same(
    run: Callable[..., subprocess.CompletedProcess[str]], supervisor: None
) -> None:
    started = run(
        "start",
        "--runtime",
        "dispatch-kind",
        "--image",
        IMAGE,
        "--num-nodes",
        "2",
        "--env",
        "KWOK_EXIT_CODE=3",
        "--env",
        "KWOK_FAIL_RANK=1",
        "--wait",
        "--timeout",
        "120",
        "--interval",
        "0.5",
    )
    assert started.returncode == 1, (started.stdout, started.stderr)
    job = re.match(r"job (j[a-z2-7]{10}): failed$", started.stdout.splitlines()[0])
    assert job, started.stdout
    assert "cause: app-error" in started.stdout
    assert "ended failed (app-error" in started.stderr
    status = run("status", job.group(1), "--wait", "--timeout", "10")
    assert status.returncode == 1
    # Asked for exactly that state, reaching it is success.
    asked = run("status", job.group(1), "--wait", "--state", "failed", "--timeout", "10")
    assert asked.returncode == 0


def test_status_wait_exits_3_for_a_refused_job(run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    refused = run("--json", "start", "--runtime", "nobody-allowed-this", "--image", IMAGE)
    assert refused.returncode == 3
    job = re.search(r"the refusal is recorded as job (j[a-z2-7]{10})$", refused.stderr, re.MULTILINE)
    assert job, refused.stderr
    status = run("status", job.group(1), "--wait", "--timeout", "10")
    assert status.returncode == 3
    assert status.stdout.startswith(f"job {job.group(1)}: refused")


def test_watch_yields_every_change_of_a_real_job_in_order(client: Client, supervisor: None) -> None:
    cursor = client.feed_cursor()
    job = client.start(runtime="dispatch-kind", image=IMAGE, num_nodes=2, env={"KWOK_RUN_DURATION": "3s"})
    seen: list[JobChange] = []
    for change in client.watch(after=cursor, polling_interval=0.5, timeout=120):
        seen.append(change)
        if change.job == job.id and change.terminal:
            break
    mine = [c for c in seen if c.job == job.id]
    moves = [(c.from_state, c.to_state) for c in mine if c.to_state]
    assert moves[0] == ("", "pending") and moves[-1][1] == "succeeded", moves
    assert [to for _, to in moves].index("queued") < [to for _, to in moves].index("running")
    # Cursors are sealed for their reader (the stack shares this checkout's SECRET_KEY): opened, in order.
    me = Job.objects.values_list("owner_id", flat=True).get(pk=job.id)
    places = [cursors.unseal(c.cursor, me) for c in seen]
    assert places == sorted(places)
    # Resuming from a change's cursor yields what came after it and nothing before.
    again = list(client.watch(after=mine[1].cursor, job=job.id, polling_interval=0.2, timeout=0.5))
    assert [c.cursor for c in again] == [c.cursor for c in mine[2:]]


def test_jobs_watch_prints_the_list_then_each_change(
    dispatch_server: Dispatch, client: Client, supervisor: None, namespace: str
) -> None:
    token = client._http.headers["Authorization"].split()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")} | {
        "DISPATCH_URL": dispatch_server.url,
        "DISPATCH_TOKEN": token,
        "DISPATCH_NAMESPACE": namespace,
    }
    earlier = client.start(runtime="dispatch-kind", image=IMAGE, num_nodes=1, env={"KWOK_STAY_RUNNING": "1"})
    watch = subprocess.Popen(
        [str(DISPATCH), "jobs", "--watch", "--interval", "0.5", "--watch-timeout", "25"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3)  # the list is printed and the watch follows
    job = client.start(runtime="dispatch-kind", image=IMAGE, num_nodes=1, env={"KWOK_RUN_DURATION": "3s"})
    out, err = watch.communicate(timeout=60)
    client.cancel(earlier.id)
    lines = out.splitlines()
    assert lines[0].startswith(earlier.id), out
    changes = [line for line in lines[1:] if f"  {job.id}  " in line]
    assert any("new -> pending" in line for line in changes), out
    assert any("running -> succeeded" in line for line in changes), (out, err)
    assert watch.returncode == 0, err
