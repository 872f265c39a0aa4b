"""Cancel a job and remove an execution's objects: the state changes at once, a task deletes the TrainJob (and
its runtime copy), and the sweep enqueues that task again until the objects are gone."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from cluster import gateway
from cluster.errors import ClusterError
from dispatch_site.audit import audit_record
from dispatch_site.causes import Cause
from jobs import enqueue
from jobs.models import ACTIVE_STATES, Execution, Job, JobState
from jobs.objects import TRAINING_RUNTIME, TRAINJOB, is_ours
from jobs.submission.claim import job_event, job_transition
from jobs.submission.errors import JobNotCancellable, TransientSubmitError
from runtimes.models import SiteSettings

logger = logging.getLogger(__name__)


def execution_objects_delete(job: Job, execution: Execution, *, retry_transient: bool = False) -> None:
    """Delete the TrainJob; the garbage collector then deletes its JobSet and the runtime copy it owns.
    A copy without that owner (the TrainJob was never created, or we stopped before the ownerReference)
    is deleted here. Only objects carrying this job's label (in the domain stored with the job) are touched:
    a name that collided with somebody else's object is never deleted. Done: objects_removed_at is set.
    Best effort unless retry_transient (the delete task)."""
    name = execution.trainjob_name
    label_domain = job.label_domain or SiteSettings.load().label_domain
    try:
        trainjob = gateway.get_namespaced(TRAINJOB, job.namespace, name)
        if trainjob is not None and is_ours(trainjob, label_domain, job.id):
            gateway.delete_namespaced(TRAINJOB, job.namespace, name)
        copy = gateway.get_namespaced(TRAINING_RUNTIME, job.namespace, name)
        owned = copy is not None and any(
            ref.get("kind") == TRAINJOB for ref in (copy.get("metadata") or {}).get("ownerReferences") or []
        )
        if copy is not None and not owned and is_ours(copy, label_domain, job.id):
            gateway.delete_namespaced(TRAINING_RUNTIME, job.namespace, name)
    except ClusterError as exc:
        logger.warning("could not delete the objects of %s/%s: %s", job.namespace, name, exc)
        if exc.transient and retry_transient:
            raise TransientSubmitError(str(exc)) from exc
        return
    Execution.objects.filter(pk=execution.pk).update(objects_removed_at=timezone.now())


def job_cancel(*, actor: Any, job: Job) -> Job:
    """Cancel a job: the state changes at once; a task deletes the TrainJob (and its runtime copy), and the
    sweep enqueues that task again until the objects are gone."""
    now = timezone.now()
    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=job.pk).first()  # job first, then execution
        if not job_transition(
            job,
            ACTIVE_STATES,
            JobState.CANCELLED,
            cause=Cause.CANCELLED,
            message=f"cancelled by {actor.get_username()}",
        ):
            job.refresh_from_db()
            raise JobNotCancellable(
                f"job {job.id} is {job.state}; only a job that has not finished can be cancelled"
            )
        execution = Execution.objects.select_for_update().filter(job=job).order_by("-attempt").first()
        if execution is not None:
            Execution.objects.filter(pk=execution.pk, state__in=ACTIVE_STATES).update(
                state=JobState.CANCELLED, cause=Cause.CANCELLED, finished_at=now
            )
            Execution.objects.filter(pk=execution.pk).update(
                delete_requested_at=now, objects_removed_at=None, claim_holder="", claim_until=None
            )
            execution_id = execution.pk
            transaction.on_commit(enqueue.on_commit_send(enqueue.EXECUTION_DELETE, execution_id), robust=True)
        job_event(job, "cancelled", f"cancelled by {actor.get_username()}")
        audit_record(actor=actor, action="job.cancel", object_type="job", object_id=job.id)
    job.refresh_from_db()
    return job


def execution_delete(*, execution_id: int) -> None:
    execution = Execution.objects.select_related("job").filter(pk=execution_id).first()
    if execution is None:
        return
    execution_objects_delete(execution.job, execution, retry_transient=True)


def execution_delete_gave_up(*, execution_id: int, error: str) -> None:
    """The delete task's retries are exhausted: say so on the job's timeline; the sweep tries again."""
    execution = Execution.objects.select_related("job").filter(pk=execution_id).first()
    if execution is None:
        return
    Execution.objects.filter(pk=execution.pk, delete_requested_at__isnull=True).update(
        delete_requested_at=timezone.now()
    )
    job_event(
        execution.job,
        "delete-pending",
        f"could not delete TrainJob {execution.job.namespace}/{execution.trainjob_name} yet ({error}); "
        "the sweep tries again",
        execution.attempt,
    )
