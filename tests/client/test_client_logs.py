"""A rank's log from the client's side: Client.logs / Client.follow_logs and `dispatch logs`, against the
dispatch server process, real jobs on the local control plane (KWOK serves every container the same simulated
log: scripts/cluster's ClusterLogs) moved by the supervisor loop in a thread (test_client_watch.py)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable

import pytest
from dispatch_client import Client
from dispatch_client.errors import NotFound

from tests.client.conftest import DISPATCH, IMAGE
from tests.client.test_client_watch import client, supervisor  # noqa: F401 (fixtures)
from tests.support.dispatch import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

KWOK_LOG = "kwok: simulated container log (dispatch local cluster)"
Run = Callable[..., subprocess.CompletedProcess[str]]


def test_logs_of_a_failed_job_are_the_failing_ranks_and_a_rank_without_a_pod_is_named(
    run: Run,
    supervisor: None,  # noqa: F811
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
    found = re.match(r"job (j[a-z2-7]{10}): failed$", started.stdout.splitlines()[0])
    assert found, started.stdout
    job_id = found.group(1)

    logs = run("logs", job_id)
    assert logs.returncode == 0, logs.stderr
    assert KWOK_LOG in logs.stdout
    # Where the lines came from goes to stderr (stdout pipes clean): the failing rank, not rank 0.
    assert f"# job {job_id} attempt 1 rank 1, pod " in logs.stderr
    assert "# job" not in logs.stdout

    missing = run("logs", job_id, "--rank", "9")
    assert missing.returncode == 1
    assert "rank 9" in missing.stderr and "404" in missing.stderr

    bad = run("logs", job_id, "--tail", "0")
    assert bad.returncode == 1
    assert "tail:" in bad.stderr  # the field error is named


def test_a_running_ranks_log_is_read_and_followed(client: Client, supervisor: None) -> None:  # noqa: F811
    job = client.start(runtime="dispatch-kind", image=IMAGE, num_nodes=2, env={"KWOK_STAY_RUNNING": "1"})
    try:
        client.wait(job.id, "running", timeout=120, polling_interval=0.5)

        def readable() -> bool:
            try:
                return bool(client.logs(job.id, rank=1).text)
            except NotFound:  # supervision has not yet found the pods in the job's chain
                return False

        wait_for(readable, timeout=60, what="rank 1's log")
        log = client.logs(job.id, rank=1, tail=5)
        assert KWOK_LOG in log.text
        assert (log.attempt, log.rank, log.kept_at) == (1, 1, "")
        assert log.pod.startswith(job.id)

        followed = "".join(client.follow_logs(job.id, rank=0))
        assert KWOK_LOG in followed

        # The job's owner on the command line (a user sees their own jobs).
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")} | {
            "DISPATCH_URL": client.url,
            "DISPATCH_TOKEN": client._http.headers["Authorization"].split()[1],
        }
        cli = subprocess.run(
            [str(DISPATCH), "logs", job.id, "--rank", "1", "--tail", "5"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        assert KWOK_LOG in cli.stdout
        assert f"# job {job.id} attempt 1 rank 1, pod {log.pod}" in cli.stderr

        with pytest.raises(NotFound, match="no container 'sidecar'"):
            client.logs(job.id, container="sidecar")
    finally:
        client.cancel(job.id)
