"""A start's statements are written out (dispatch_site.sql): its claim loads the execution with its job and
owner as the ORM would have, its record writes the job and the execution as the ORM would have, and a grant
through a group still counts. Through the start a worker runs, against the real API server (the TrainJob is
created)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dispatch_site import roles
from dispatch_site.models import NamespaceGrant
from jobs import enqueue
from jobs.models import Execution, Job, JobState
from jobs.observability.models import Change
from jobs.spec import JobSpec
from jobs.submission import claim, start, submit
from runtimes.models import AllowListEntry

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(enqueue, "send", lambda name, *args, countdown=None: None)


def _spec(namespace: str) -> JobSpec:
    return JobSpec.from_dict(
        {
            "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
            "namespace": namespace,
            "image": "localhost/trainer:v1",
            "num_nodes": 2,
            "env": {"KWOK_STAY_RUNNING": "1"},
        }
    )


def _loaded(instance: Any) -> dict[str, Any]:
    deferred = instance.get_deferred_fields()
    fields = instance._meta.concrete_fields
    return {f.attname: getattr(instance, f.attname) for f in fields if f.attname not in deferred}


def test_the_claim_loads_what_the_orm_would_and_defers_the_large_fields(
    namespace: str, submitter: tuple[User, str]
) -> None:
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    made = submit.job_submit(owner=submitter[0], spec=_spec(namespace))
    [pending] = made.executions or []
    claimed = claim.execution_claim(pending.pk, "holder-1")
    assert claimed is not None
    job, execution, token = claimed
    expected = Execution.objects.select_related("job", "job__owner").get(pk=pending.pk)
    assert token == expected.claim_generation == 1
    assert execution.claim_holder == "holder-1" and execution.claim_until is not None
    # Every field the start reads has the ORM's value and type (the spec is JSON read back as a dict, the
    # datetimes are aware); the large ones are deferred, and read on access.
    assert _loaded(execution) == {k: v for k, v in _loaded(expected).items() if k in _loaded(execution)}
    assert _loaded(job) == {k: v for k, v in _loaded(expected.job).items() if k in _loaded(job)}
    assert _loaded(job.owner) == _loaded(expected.job.owner)
    assert set(execution.get_deferred_fields()) == set(claim._EXECUTION_UNREAD)
    assert set(job.get_deferred_fields()) == set(claim._JOB_UNREAD)
    assert isinstance(job.spec, dict) and job.spec["namespace"] == namespace
    assert execution.created_at.tzinfo is not None
    assert job.plan == expected.job.plan  # a deferred field, read on access
    with CaptureQueriesContext(connection) as queries:
        assert execution.job is job and job.owner.username == submitter[0].username
    assert not queries.captured_queries  # the job and its owner came with the claim


def test_the_start_records_the_job_and_its_execution_as_queued(
    kube: Any, namespace: str, submitter: tuple[User, str]
) -> None:
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    made = submit.job_submit(owner=submitter[0], spec=_spec(namespace))
    [pending] = made.executions or []
    with CaptureQueriesContext(connection) as queries:
        start.execution_submit(execution_id=pending.pk, holder="holder-1")
    job = Job.objects.get(pk=made.job.id)
    execution = Execution.objects.get(pk=pending.pk)
    assert (job.state, job.current_attempt, job.last_known_state, job.unknown_since) == (
        JobState.QUEUED,
        1,
        "",
        None,
    )
    assert job.message == f"TrainJob {namespace}/{execution.trainjob_name} created"
    assert job.state_changed_at > made.job.state_changed_at and job.updated_at == job.state_changed_at
    # The JSON columns hold what the ORM would have stored: the plan judged at start with the objects it
    # created, the runtime as the cluster served it (the copy was built from it), the warnings as a list.
    trainjob = kube.custom.get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", execution.trainjob_name
    )
    assert job.plan is not None and not job.plan["refused"]
    planned = job.plan["objects"]["train_job"]
    assert planned["metadata"]["name"] == trainjob["metadata"]["name"] == execution.trainjob_name
    assert planned["spec"]["runtimeRef"] == trainjob["spec"]["runtimeRef"]
    assert job.runtime_snapshot is not None and job.runtime_snapshot["metadata"]["name"] == "dispatch-kind"
    assert job.runtime_snapshot["kind"] == "ClusterTrainingRuntime"
    assert isinstance(job.identity_warnings, list)
    assert (execution.state, execution.claim_holder, execution.claim_until) == (JobState.QUEUED, "", None)
    assert execution.submitted_at is not None and trainjob["metadata"]["name"] == execution.trainjob_name
    # With the move, the UID of the TrainJob the create answered: the one the API server reports.
    assert execution.trainjob_uid and execution.trainjob_uid == trainjob["metadata"]["uid"]
    # The "created" change carries the execution's facts the start handed the outbox (no read of its own).
    created = Change.objects.get(job_id=job.id, kind="created")
    assert (created.attempt, created.from_state, created.to_state) == (1, JobState.PENDING, JobState.QUEUED)
    assert (created.data["rank"], created.data["exit_code"]) == (None, None)
    assert not [q["sql"] for q in queries.captured_queries if '"jobs_execution"."rank"' in q["sql"]]


def test_a_grant_through_a_group_counts_and_another_namespace_does_not(submitter: tuple[User, str]) -> None:
    member = User.objects.create_user("member-of-team")
    team = Group.objects.create(name="team-x")
    member.groups.add(team)
    assert not roles.may_submit_to(member, "team-x-ns")
    NamespaceGrant.objects.create(group=team, namespace="team-x-ns")
    assert roles.may_submit_to(member, "team-x-ns")
    assert not roles.may_submit_to(member, "team-y-ns")
    assert not roles.may_submit_to(submitter[0], "team-x-ns")  # not a member
    NamespaceGrant.objects.create(user=member, namespace=roles.ALL_NAMESPACES)
    assert roles.may_submit_to(member, "team-y-ns")


def _prepared_statements() -> list[str]:
    """The statements this session's PostgreSQL backend holds prepared (those psycopg prepared over the
    protocol, not a PREPARE of SQL)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        return [row[0] for row in cursor.fetchall()]


@pytest.fixture
def reconnect() -> Any:
    """A fresh connection (nothing prepared on it yet), made from settings with `options` merged into the
    database's OPTIONS; the settings are put back afterwards."""
    saved = dict(connection.settings_dict["OPTIONS"])

    def make(**options: Any) -> None:
        connection.close()
        connection.settings_dict["OPTIONS"] = {**saved, **options}
        connection.ensure_connection()

    yield make
    connection.close()
    connection.settings_dict["OPTIONS"] = saved


def _start_jobs(kube: Any, owner: User, namespace: str, count: int) -> None:
    """`count` jobs submitted and started one after another on this thread's connection; each is queued with
    the UID of the TrainJob the API server holds."""
    for index in range(count):
        made = submit.job_submit(owner=owner, spec=_spec(namespace))
        [pending] = made.executions or []
        start.execution_submit(execution_id=pending.pk, holder=f"holder-{index}")
        execution = Execution.objects.select_related("job").get(pk=pending.pk)
        trainjob = kube.custom.get_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", execution.trainjob_name
        )
        assert (execution.job.state, execution.state) == (JobState.QUEUED, JobState.QUEUED)
        assert execution.trainjob_uid == trainjob["metadata"]["uid"]


def test_repeated_starts_run_their_statements_prepared_unless_the_database_url_says_none(
    kube: Any, namespace: str, submitter: tuple[User, str], reconnect: Any
) -> None:
    """A worker's connection runs every start's claim, fences and record: after psycopg's threshold (5 calls,
    dispatch_site.config) PostgreSQL holds them prepared, so it no longer parses and plans them per start, and
    the starts still record what they did. Behind a pooler that cannot keep prepared statements,
    `?prepare_threshold=none` leaves none on the connection."""
    AllowListEntry.objects.create(kind="ClusterTrainingRuntime", name="dispatch-kind", for_jobs=True)
    reconnect()  # the configured threshold (the test database's URL sets none)
    assert connection.connection.prepare_threshold == 5
    _start_jobs(kube, submitter[0], namespace, 6)
    prepared = _prepared_statements()
    # The claim, the claim's load of the execution with its job and owner, a fence, the record's two updates,
    # the grant and the allow-list reads.
    assert [s for s in prepared if "claim_generation = claim_generation + 1" in s]
    assert [s for s in prepared if s.startswith("SELECT") and "INNER JOIN" in s and '"jobs_job"' in s]
    assert [s for s in prepared if s.startswith('UPDATE "jobs_execution" SET claim_until = $1')]
    assert [s for s in prepared if s.startswith('UPDATE "jobs_job" SET state = $1')]
    assert [s for s in prepared if s.startswith('UPDATE "jobs_execution" SET state = $1')]
    assert [s for s in prepared if '"dispatch_site_namespacegrant"' in s]
    assert [s for s in prepared if '"runtimes_allowlistentry"' in s]

    reconnect(prepare_threshold=None)  # what ?prepare_threshold=none on DATABASE_URL configures
    _start_jobs(kube, submitter[0], namespace, 6)
    assert _prepared_statements() == []
