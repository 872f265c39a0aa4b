"""The submission task against a cluster that cannot be reached (a real fault: nothing listens on the
configured API server port): it retries, and gives up into `unknown`, never losing the job."""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import Retry
from django.contrib.auth.models import User

from jobs.models import Execution, Job, JobState
from jobs.submission import errors, start
from jobs.submission.tasks import MAX_SUBMIT_RETRIES, execution_submit

pytestmark = pytest.mark.django_db

SPEC = {
    "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
    "namespace": "team-a",
    "image": "localhost/trainer:1",
}


def _pending(owner: User) -> Execution:
    job = Job.objects.create(
        owner=owner,
        namespace="team-a",
        runtime_kind="ClusterTrainingRuntime",
        runtime_name="dispatch-kind",
        spec=SPEC,
    )
    return Execution.objects.create(job=job, attempt=1, trainjob_name=f"{job.id}-1")


def test_an_unreachable_cluster_is_transient_and_the_job_stays_pending(plain_user: Any) -> None:
    execution = _pending(plain_user[0])
    with pytest.raises(errors.TransientSubmitError, match=r"cannot connect to 127\.0\.0\.1:1"):
        start.execution_submit(execution_id=execution.pk)
    execution.refresh_from_db()
    assert execution.job.state == JobState.PENDING
    assert execution.submit_tries == 1


def test_the_task_retries_then_gives_up_into_unknown(plain_user: Any) -> None:
    execution = _pending(plain_user[0])
    # In-process tasks re-raise the retry that a worker would schedule (countdown: the backoff).
    with pytest.raises(Retry, match=r"Retry in 1s"):
        execution_submit.apply(args=(execution.pk,), task_id="chain")
    assert Job.objects.get(pk=execution.job_id).state == JobState.PENDING
    # The chain's last delivery: the same task id as its first (a retry keeps it).
    last = execution_submit.apply(args=(execution.pk,), retries=MAX_SUBMIT_RETRIES, task_id="chain")
    assert last.state == "SUCCESS"
    job = Job.objects.get(pk=execution.job_id)
    assert job.state == JobState.UNKNOWN
    assert job.message.startswith("could not reach the cluster:")
    assert job.events.filter(kind="unknown").exists()


def test_a_task_for_a_deleted_execution_does_nothing(plain_user: Any) -> None:
    execution = _pending(plain_user[0])
    execution.job.delete()
    assert execution_submit.apply(args=(execution.pk,)).state == "SUCCESS"
