"""`dispatch usage` against the dispatch server process: a real job on the local control plane, moved by the
supervisor loop in a thread (test_client_watch.py), ended (shown at once), then counted by the beat's rollup
task (the same answer)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from collections.abc import Callable

import pytest

from jobs.usage.tasks import usage_rollup
from tests.client.conftest import IMAGE
from tests.client.test_client_watch import client, supervisor  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

Run = Callable[..., subprocess.CompletedProcess[str]]


def test_dispatch_usage_shows_the_ended_job_as_a_table_json_and_csv(
    run: Run,
    namespace: str,
    supervisor: None,  # noqa: F811
) -> None:
    started = run(
        "start", "--runtime", "dispatch-kind", "--image", IMAGE, "--num-nodes", "2",
        "--wait", "--timeout", "120", "--interval", "0.5",
    )  # fmt: skip
    assert started.returncode == 0, (started.stdout, started.stderr)
    # Ended, not yet counted by the beat's rollup: the answer measures it already, and the same after.
    [early] = json.loads(run("--json", "usage", "--namespace", namespace).stdout)
    assert (early["jobs"], early["attempts"]) == (1, 1)
    assert usage_rollup.apply().result == 1
    assert json.loads(run("--json", "usage", "--namespace", namespace).stdout) == [early]

    table = run("usage", "--namespace", namespace)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split()[:6] == ["namespace", "gpu_hours", "gpu_hours_lost", "cpu_hours", "jobs", "attempts"]
    assert row.split()[0] == namespace and row.split()[4:6] == ["1", "1"]

    [answer] = json.loads(run("--json", "usage", "--group-by", "cause").stdout)
    assert answer["cause"] == "succeeded" and answer["gpu_hours"] == 0.0  # the job asked for no GPU
    assert answer["queue_wait_p50_seconds"] is not None

    sheet = run("usage", "--csv", "--step", "day")
    [line] = list(csv.DictReader(io.StringIO(sheet.stdout)))
    assert line["namespace"] == namespace and line["period"] and line["attempts"] == "1"

    refused = run("usage", "--since", "2026-12-31", "--until", "2026-12-01")
    assert refused.returncode != 0 and "since" in refused.stderr
