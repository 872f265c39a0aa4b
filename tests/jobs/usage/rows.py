"""Ended attempts as rows (standing in for volume where the behaviour under test is the rollup or the page,
not supervision): each has two pods that ran 60 s with `gpus` GPUs and 4 cpus each, a 10 s queue wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from jobs.models import Execution, Job, JobState
from jobs.naming import new_job_id

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
RAN_SECONDS = 60
PODS = 2


def ended_attempt(
    owner: Any, *, namespace: str = "team-a", failed: bool = False, at: datetime = T0, gpus: int = 2
) -> Execution:
    state = JobState.FAILED if failed else JobState.SUCCEEDED
    job = Job.objects.create(
        id=new_job_id(),
        owner=owner,
        namespace=namespace,
        runtime_kind="ClusterTrainingRuntime",
        runtime_name="torch",
        spec={},
        plan={"queue": {"local_queue": "gpus"}},
        state=state,
    )
    started, finished = at + timedelta(seconds=10), at + timedelta(seconds=10 + RAN_SECONDS)
    node = {"name": "node", "started_at": started.isoformat(), "finished_at": finished.isoformat()}
    pod = {"containers": [node], "gpus": gpus, "cpus": 4}
    return Execution.objects.create(
        job=job,
        attempt=1,
        trainjob_name=f"{job.pk}-1",
        state=state,
        cause="app-error" if failed else "",
        submitted_at=at,
        started_at=started,
        finished_at=finished + timedelta(seconds=1),
        pods_seen={f"p{i}": dict(pod) for i in range(PODS)},
    )
