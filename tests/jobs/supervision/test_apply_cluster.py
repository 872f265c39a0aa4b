"""The worker an attempt ran on is kept (issue 35): supervision's write records the MultiKueue worker the
Workload names, and keeps it when a later observation has none (Kueue's eviction clears
status.clusterName, and a lost worker's name is what on-call needs). The execution row stands in for a
submitted attempt; the behaviour under test is supervision's write (apply_status)."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.models import Execution, Job, JobState
from jobs.naming import new_job_id
from jobs.supervision import status as st
from jobs.supervision.apply import apply_status

pytestmark = pytest.mark.django_db


def _attempt(owner: Any) -> Execution:
    job = Job.objects.create(
        id=new_job_id(),
        owner=owner,
        namespace="team-a",
        runtime_kind="ClusterTrainingRuntime",
        runtime_name="torch",
        spec={},
        plan={"queue": {"local_queue": "multi"}},
        state=JobState.QUEUED,
        current_attempt=1,
    )
    return Execution.objects.create(job=job, attempt=1, trainjob_name=f"{job.pk}-1", state=JobState.QUEUED)


def test_the_worker_is_recorded_and_kept_when_the_eviction_clears_it(make_user: Any) -> None:
    owner, _ = make_user("mku", namespaces=("team-a",))
    execution = _attempt(owner)
    apply_status(execution_id=execution.pk, status=st.DerivedStatus(state=st.RUNNING, cluster="worker-2"))
    execution.refresh_from_db()
    assert (execution.state, execution.cluster) == (st.RUNNING, "worker-2")
    lost = st.DerivedStatus(state=st.FAILED, cause=st.CLUSTER_LOST, message="lost", cluster="")
    apply_status(execution_id=execution.pk, status=lost)
    execution.refresh_from_db()
    assert (execution.state, execution.cause, execution.cluster) == (st.FAILED, "cluster-lost", "worker-2")
