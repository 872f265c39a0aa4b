"""The job page's rank grid, reasons with their fix, recovery policy and kubectl commands (template checks
on rows as supervision stores them; the live path is in tests/browser/test_dashboard.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from jobs.models import Execution, Job, JobState
from jobs.plan import build_plan
from jobs.queueing import KueueInputs, choose_queue
from jobs.spec import JobSpec
from runtimes.fixes import FIXES
from runtimes.reasons import SiteRules
from tests.jobs.dashboard.test_job_pages import client_for, make_job, page, runtime_body
from tests.jobs.test_queueing import GPU_PER_NODE, recorded

pytestmark = pytest.mark.django_db


def _rank(
    rank: int, attempt: int, phase: str, exit_code: int | None = None, first: bool = False
) -> dict[str, Any]:
    return {
        "rank": rank,
        "attempt": attempt,
        "restart_attempt": 0,
        "pod": f"p-{attempt}-{rank}",
        "phase": phase,
        "exit_code": exit_code,
        "restarts": 0,
        "node": "kwok-node-0",
        "reason": "Error" if exit_code else "",
        "first_failure": first,
    }


def test_grid_is_rank_by_attempt_with_the_first_failing_rank_marked(plain_user: Any) -> None:
    job = make_job(plain_user[0], state=JobState.FAILED, cause="app-error")
    Execution.objects.filter(job=job).update(
        state=JobState.FAILED, ranks=[_rank(0, 1, "Succeeded", 0), _rank(1, 1, "Failed", 3, first=True)]
    )
    Execution.objects.create(
        job=job,
        attempt=2,
        trainjob_name=f"{job.id}-2",
        state=JobState.FAILED,
        ranks=[_rank(0, 2, "Failed", 137, first=True), _rank(1, 2, "Running")],
    )
    Job.objects.filter(pk=job.pk).update(current_attempt=2, failing_rank=0)
    html = page(client_for(plain_user[0]), f"/jobs/{job.id}/")
    grid = html[html.index('id="rank-grid"') : html.index("</table>", html.index('id="rank-grid"'))]
    assert re.findall(r'data-attempt="(\d+)">A\d+</th>', grid) == ["1", "2"]
    rows = re.findall(r'<tr data-rank="(\d+)">(.*?)</tr>', grid, re.S)
    assert [r for r, _ in rows] == ["0", "1"]
    cells = {r: re.findall(r"<td class=\"([^\"]+)\"[^>]*>(?:<a [^>]*>)?([^<]*)", body) for r, body in rows}
    assert cells["0"] == [("ok", "done"), ("failed first", "★ fail 137")]
    assert cells["1"] == [("failed first", "★ fail 3"), ("running", "run")]
    assert grid.count('data-first-failure="true"') == 2
    assert f'href="/api/v1/jobs/{job.id}/logs?attempt=2&amp;rank=1"' in grid
    # The failing rank's log tail is loaded after the page (it needs the cluster).
    assert f'hx-get="/jobs/{job.id}/log/?attempt=2&amp;rank=0"' in html


def test_refused_reasons_carry_their_fix_and_nothing_was_created(plain_user: Any) -> None:
    job = make_job(plain_user[0], runtime=runtime_body(restart_policy="OnFailure"))
    html = page(client_for(plain_user[0]), f"/jobs/{job.id}/")
    assert "<strong>Fix:</strong> " + FIXES["restart-policy"].fix in html
    assert 'id="created-objects"' not in html and 'id="cluster-events"' not in html


def test_created_objects_are_named_with_kubectl_commands(plain_user: Any) -> None:
    job: Job = make_job(plain_user[0])
    html = page(client_for(plain_user[0]), f"/jobs/{job.id}/")
    section = html[html.index('id="created-objects"') :]
    name = f"{job.id}-1"
    assert f"kubectl -n team-a get trainjob {name} -o yaml" in section
    assert (
        f"kubectl -n team-a get jobs,pods -l dispatch.dev/job={job.id},dispatch.dev/attempt=1 -o wide"
        in section
    )


def test_events_and_log_partials_say_the_cluster_is_unreachable(plain_user: Any) -> None:
    job = make_job(plain_user[0], state=JobState.FAILED, cause="app-error")
    client = client_for(plain_user[0])
    events = page(client, f"/jobs/{job.id}/events/", **{"HX-Request": "true"})
    assert "Events could not be read" in events and "127.0.0.1:1" in events
    log = page(client, f"/jobs/{job.id}/log/?attempt=1&rank=0", **{"HX-Request": "true"})
    assert "the cluster could not be read" in log


def test_the_plan_shows_the_kueue_queue_its_quota_and_whether_the_job_fit(plain_user: Any) -> None:
    """A job planned into a LocalQueue whose ClusterQueue (as Kueue recorded it) had its GPUs reserved."""
    job = make_job(plain_user[0], state=JobState.QUEUED)
    spec = JobSpec.from_dict(job.spec | {"queue_name": "dispatch", "resources_per_node": GPU_PER_NODE})
    local_queue = recorded("pending-insufficient-quota", "LocalQueue")
    cluster_queue = recorded("pending-insufficient-quota", "ClusterQueue")
    plan = build_plan(
        spec=spec,
        runtime=runtime_body(),
        rules=SiteRules(),
        allow_listed=True,
        namespace_granted=True,
        job_id=job.id,
        attempt=1,
        label_domain="dispatch.example.com",
        trainer_version="v2.3.0",
        kueue=KueueInputs(
            choice=choose_queue(spec, {}), local_queue=local_queue, cluster_queue=cluster_queue
        ),
    )
    Job.objects.filter(pk=job.pk).update(plan=plan.to_dict())
    html = page(client_for(plain_user[0]), f"/jobs/{job.id}/")
    queue = html[html.index('id="queue"') : html.index("</table>", html.index('id="queue-quota"'))]
    cq = cluster_queue["metadata"]["name"]
    assert f"LocalQueue <code>dispatch</code> on ClusterQueue <code>{cq}</code>" in queue
    assert "does not fit now" in queue and "2 pending in the ClusterQueue" in queue
    assert "nvidia.com/gpu: 2 requested, 0 of 2 free in flavor dispatch-kwok" in queue
    rows = re.findall(
        r"<tr><td>dispatch-kwok</td><td><code>([^<]+)</code></td>((?:<td>[^<]*</td>)+)</tr>", queue
    )
    cells = {resource: re.findall(r"<td>([^<]*)</td>", rest) for resource, rest in rows}
    assert cells["nvidia.com/gpu"] == ["2", "2", "2", "0", "2"]
    assert cells["cpu"] == ["4", "0", "0", "4", "-"]
