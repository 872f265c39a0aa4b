"""The `dispatch` command line as a user runs it: a subprocess of the installed console script, talking to a
real dispatch server process over HTTP, with the real worker and control plane behind it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from runtimes.models import AllowListEntry
from tests.client.conftest import IMAGE
from tests.support.dispatch import GROUP, VERSION, runtime_body, trainer_job

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


def test_plan_start_status_jobs_cancel_from_files_and_flags(run: Any, tmp_path: Path, namespace: str) -> None:
    job_yaml = tmp_path / "job.yaml"
    job_yaml.write_text(
        f"runtime: {{kind: ClusterTrainingRuntime, name: dispatch-kind}}\n"
        f"namespace: {namespace}\nimage: {IMAGE}\nnum_nodes: 2\nenv: {{STEPS: '10'}}\n"
    )
    plan = run("plan", "-f", str(job_yaml))
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.splitlines()[0] == "accepted"
    assert re.search(r"would create TrainJob \S+ on TrainingRuntime \S+", plan.stdout)

    # A flag overrides the file's field; --json prints the API's answer.
    planned = run("--json", "plan", "-f", str(job_yaml), "--num-nodes", "3")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["objects"]["train_job"]["spec"]["trainer"]["numNodes"] == 3

    job_json = tmp_path / "job.json"
    job_json.write_text(
        json.dumps(
            {
                "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
                "image": IMAGE,
                "num_nodes": 1,
            }
        )
    )
    started = run(
        "start", "-f", str(job_json), "--wait", "--state", "queued", "--timeout", "90", "--interval", "0.5"
    )
    assert started.returncode == 0, started.stderr
    job_id = re.match(r"job (j[a-z2-7]{10}): queued$", started.stdout.splitlines()[0])
    assert job_id, started.stdout
    job = job_id.group(1)
    assert f"trainjob: {job}-1" in started.stdout

    listed = run("jobs", "--state", "queued")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [job]

    timed_out = run("status", job, "--wait", "--state", "succeeded", "--timeout", "1", "--interval", "0.5")
    assert timed_out.returncode == 4
    assert "still queued" in timed_out.stderr

    cancelled = run("cancel", job)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"job {job}: cancelled")
    status = run("--json", "status", job, "--wait", "--timeout", "10")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "cancelled"


def test_refusals_and_errors_have_their_own_exit_codes(run: Any, kube: Any, namespace: str) -> None:
    body = runtime_body("TrainingRuntime", "bad-rt", namespace)
    trainer_job(body)["template"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", body)
    AllowListEntry.objects.create(kind="TrainingRuntime", namespace=namespace, name="bad-rt", for_jobs=True)

    plan = run("plan", "--runtime", "TrainingRuntime/bad-rt", "--image", IMAGE)
    assert plan.returncode == 3
    assert plan.stdout.splitlines()[0] == "refused"
    assert "  - restart-policy: " in plan.stdout

    start = run("start", "--runtime", "TrainingRuntime/bad-rt", "--image", IMAGE)
    assert start.returncode == 3
    assert "422" in start.stderr
    assert "  - restart-policy: " in start.stderr

    forbidden = run(
        "start", "--runtime", "dispatch-kind", "--image", IMAGE, "--namespace", "not-granted-here"
    )
    assert forbidden.returncode == 1
    assert "403" in forbidden.stderr

    bad = run("plan", "--runtime", "dispatch-kind", "--image", IMAGE, "--num-nodes", "0")
    assert bad.returncode == 1
    assert "num_nodes:" in bad.stderr

    missing = run("status", "jaaaaaaaaaa")
    assert missing.returncode == 1
    assert "404" in missing.stderr

    unreadable = run("plan", "-f", "/nonexistent/job.yaml")
    assert unreadable.returncode == 2
    assert "cannot read /nonexistent/job.yaml" in unreadable.stderr


def test_runtimes_lists_verdicts(run: Any) -> None:
    out = run("runtimes")
    assert out.returncode == 0, out.stderr
    line = next(
        line for line in out.stdout.splitlines() if line.startswith("ClusterTrainingRuntime/dispatch-kind ")
    )
    assert "allow-listed=yes (jobs)" in line
    assert line.endswith(" ok")
