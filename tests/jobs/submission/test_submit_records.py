"""An accepted submission's rows are written by one statement on PostgreSQL (jobs.submission.records), in one
transaction with the outbox's Change row: the job, its audit row and its first execution, every field as
the ORM would have written it; an Idempotency-Key that raced in first is a replay, not a 500. Outside any
transaction (a transactional test), as a request runs."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dispatch_site.models import AuditEvent
from jobs import enqueue
from jobs.models import Execution, Job, JobState
from jobs.observability.models import Change
from jobs.spec import JobSpec
from jobs.submission import submit
from runtimes.models import AllowListEntry, SiteSettings

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    messages: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(enqueue, "send", lambda name, *args, countdown=None: messages.append((name, args)))
    return messages


def _spec(namespace: str) -> JobSpec:
    return JobSpec.from_dict(
        {
            "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
            "namespace": namespace,
            "image": "localhost/trainer:v1",
            "num_nodes": 2,
            "display_name": "nightly",
        }
    )


def test_one_statement_writes_the_job_its_audit_row_its_execution_and_its_change(
    namespace: str, submitter: tuple[User, str], sent: list[tuple[str, tuple[Any, ...]]]
) -> None:
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    SiteSettings.load()  # the settings row exists on a running site
    with CaptureQueriesContext(connection) as queries:
        made = submit.job_submit(owner=submitter[0], spec=_spec(namespace))
    writes = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith("SELECT")]
    # The three rows and the outbox's Change row (jobs.observability, through rows_inserting) in one
    # statement, sent without BEGIN and COMMIT: a job is never accepted without its "submitted" change, nor
    # the other way round.
    assert len(writes) == 1, writes
    assert writes[0].startswith("WITH ") and 'INSERT INTO "observability_change"' in writes[0], writes
    job = Job.objects.get(pk=made.job.id)
    assert (job.state, job.display_name, job.label_domain) == (JobState.PENDING, "nightly", "dispatch.dev")
    assert job.plan is not None and job.plan["objects"]["train_job"]["metadata"]["name"] == f"{job.id}-1"
    assert job.created_at is not None and job.updated_at is not None
    [execution] = made.executions or []
    assert Execution.objects.get(pk=execution.pk).job_id == job.id
    assert execution.trainjob_name == f"{job.id}-1" and execution.created_at is not None
    audit = AuditEvent.objects.get(action="job.submit", object_id=job.id)
    assert audit.actor_name == submitter[0].username and audit.details["namespace"] == namespace
    assert sent == [(enqueue.EXECUTION_SUBMIT, (execution.pk,))]  # enqueued once the statement committed
    [change] = Change.objects.filter(job_id=job.id)
    assert (change.kind, change.from_state, change.to_state) == ("submitted", "", JobState.PENDING)
    assert (change.owner_id, change.namespace, change.at) == (submitter[0].pk, namespace, job.created_at)


def test_an_idempotency_key_that_raced_in_first_is_a_replay(
    namespace: str,
    submitter: tuple[User, str],
    sent: list[tuple[str, tuple[Any, ...]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    first = submit.job_submit(owner=submitter[0], spec=_spec(namespace), idempotency_key="k1").job
    # The concurrent request passed its replay check before the first one's row existed: its INSERT then
    # meets the unique key (modelled by skipping the check, which is what losing that race amounts to).
    real_replay = submit._replay
    checks: list[str] = []

    def replay_after_losing_the_race(owner: User, key: str, fingerprint: str) -> Job | None:
        checks.append(key)
        return None if len(checks) == 1 else real_replay(owner, key, fingerprint)

    monkeypatch.setattr(submit, "_replay", replay_after_losing_the_race)
    again = submit.job_submit(owner=submitter[0], spec=_spec(namespace), idempotency_key="k1")
    assert checks == [
        "k1",
        "k1",
    ]  # the check before the INSERT, then the replay after the unique key refused it
    assert again.replayed and again.job.id == first.id
    assert Job.objects.filter(owner=submitter[0]).count() == 1
    assert Execution.objects.filter(job__owner=submitter[0]).count() == 1
    assert Change.objects.filter(owner=submitter[0]).count() == 1  # the refused statement wrote none
    assert len(sent) == 1
