"""The one statement that writes an accepted submission's rows (jobs.submission.records) on PostgreSQL: NULL
and empty values are written in the statement itself, everything else is a parameter; either way the rows
read back exactly as the ORM would have written them (SQLite saves them through the ORM). No cluster."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.forms.models import model_to_dict

from dispatch_site.audit import audit_event
from dispatch_site.models import AuditEvent
from jobs.models import Execution, Job, JobState
from jobs.observability.models import Change
from jobs.submission import records

pytestmark = pytest.mark.django_db(transaction=True)


def _rows(owner: User, job_id: str, message: str, display_name: str) -> tuple[Job, AuditEvent, Execution]:
    job = Job(
        id=job_id,
        owner=owner,
        namespace="team-a",
        display_name=display_name,
        runtime_kind="ClusterTrainingRuntime",
        runtime_name="dispatch-kind",
        spec={"namespace": "team-a", "env": [["X", "%s 'quoted' ''"]], "empty": ""},
        plan={"refused": False, "reasons": []},
        runtime_snapshot=None,
        identity_warnings=[],
        recovery_policy={},
        state=JobState.PENDING,
        message=message,
        idempotency_key=None,
        request_hash="",
    )
    audit = audit_event(
        actor=owner, action="job.submit", object_type="job", object_id=job_id, details={"codes": []}
    )
    execution = Execution(job=job, attempt=1, trainjob_name=f"{job_id}-1", message=message)
    return job, audit, execution


@pytest.mark.parametrize(
    ("message", "display_name"),
    [("", ""), ("it's 100% %s done", "nightly"), ("NULL", "''"), ("%(x)s", "%%")],
)
def test_the_rows_read_back_as_written(message: str, display_name: str) -> None:
    owner = User.objects.create_user("records")
    job, audit, execution = _rows(owner, "j0records0", message, display_name)
    records.insert_together(job, audit, execution)
    stored = Job.objects.get(pk=job.pk)
    assert model_to_dict(stored) == model_to_dict(job)
    assert (stored.message, stored.display_name) == (message, display_name)
    assert stored.idempotency_key is None and stored.runtime_snapshot is None and stored.unknown_since is None
    assert stored.spec == {"namespace": "team-a", "env": [["X", "%s 'quoted' ''"]], "empty": ""}
    assert stored.created_at == job.created_at and stored.updated_at == job.updated_at
    saved = Execution.objects.get(pk=execution.pk)
    assert model_to_dict(saved) == model_to_dict(execution)
    assert (saved.message, saved.rank, saved.submitted_at, saved.claim_holder) == (message, None, None, "")
    assert saved.job_id == job.pk and saved.created_at == execution.created_at
    assert AuditEvent.objects.get(object_id=job.pk).actor_name == "records"
    assert Change.objects.filter(job_id=job.pk, kind="submitted").count() == 1
