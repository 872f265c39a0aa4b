"""Job services: plan, submit (record, then start execution 1 in a task), and cancel.

The job row is the source of truth. Every state change is compare-and-set
(`filter(pk=..., state=old).update(state=new)`), so a duplicate task delivery or a double click is harmless.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from cluster import gateway
from cluster.errors import AlreadyExists, ClusterError, NotFound, Rejected
from dispatch_site import roles
from dispatch_site.audit import audit_record
from jobs import recovery
from jobs.models import ACTIVE_STATES, Cause, Execution, Job, JobEvent, JobState
from jobs.naming import new_job_id, trainjob_name
from jobs.plan import Plan, build_plan
from jobs.spec import JobSpec
from runtimes.models import AllowListEntry, SiteSettings
from runtimes.rules import AllowListMiss
from runtimes.selectors import allow_list_entry, get_runtime, site_rules, site_settings

logger = logging.getLogger(__name__)

TRAINJOB = "TrainJob"
TRAINING_RUNTIME = "TrainingRuntime"


class NamespaceNotGranted(Exception):
    pass


class IdempotencyConflict(Exception):
    pass


class JobNotCancellable(Exception):
    pass


class TransientSubmitError(Exception):
    """The cluster could not be reached or answered 5xx/429: the submission task retries with backoff."""


def request_fingerprint(spec: JobSpec) -> str:
    return hashlib.sha256(json.dumps(spec.to_dict(), sort_keys=True).encode()).hexdigest()


def _runtime_key(spec: JobSpec) -> tuple[str, str, str]:
    return spec.runtime.kind, spec.runtime.namespace or "", spec.runtime.name


# How stale a runtime read may be for answering plan and accepting a submission; the task that starts the
# execution reads it afresh and judges it again before creating anything.
PLAN_RUNTIME_MAX_AGE = 2.0


def job_plan(
    *,
    user: Any,
    spec: JobSpec,
    job_id: str | None = None,
    attempt: int = 1,
    runtime_max_age: float = 0.0,
    site: SiteSettings | None = None,
    namespace_granted: bool | None = None,
    stored_runtime: dict[str, Any] | None = None,
) -> tuple[Plan, Any]:
    """What starting this job would do. Reads the runtime from the cluster (ClusterError when it cannot);
    creates nothing. Returns the plan and the runtime object it judged (None when it does not exist).
    A caller that already read the site settings or the namespace grant passes them in."""
    site = site or SiteSettings.load()
    if namespace_granted is None:
        namespace_granted = roles.may_submit_to(user, spec.namespace)
    kind, namespace, name = _runtime_key(spec)
    entry = allow_list_entry(kind, namespace, name, max_age=runtime_max_age)
    runtime: gateway.RuntimeObject | None
    if stored_runtime is not None:
        # A retry (attempt A+1) runs on the runtime as attempt 1 ran it, stored with the job: an edit of the
        # original since then changes nothing.
        runtime = gateway.RuntimeObject.from_body(kind, copy.deepcopy(stored_runtime))
    else:
        runtime = get_runtime(kind, namespace, name, max_age=runtime_max_age)  # never a dispatch copy
    allowed: bool | AllowListMiss = True
    if entry is None or not entry.for_jobs:
        # Refused: say why (an empty list, or listed for sessions only) so nobody has to guess.
        allowed = AllowListMiss(
            purpose="jobs",
            list_empty=entry is None and not AllowListEntry.objects.exists(),
            listed_for=tuple(entry.purposes) if entry else (),
        )
    plan = build_plan(
        spec=spec,
        runtime=runtime.body if runtime else None,
        rules=site_rules(site),
        allow_listed=allowed,
        namespace_granted=namespace_granted,
        job_id=job_id or new_job_id(),
        attempt=attempt,
        label_domain=site.label_domain,
        trainer_version=site.trainer_version,
    )
    return plan, runtime


@dataclass(frozen=True)
class Submission:
    job: Job
    replayed: bool  # the Idempotency-Key matched an earlier request: this is that job


def _replay(owner: User, key: str, fingerprint: str) -> Job | None:
    window = timezone.now() - timedelta(seconds=settings.IDEMPOTENCY_WINDOW_SECONDS)
    job = Job.objects.filter(owner=owner, idempotency_key=key).first()
    if job is None:
        return None
    if job.created_at < window:
        # An expired key may be reused: release it from the old job.
        Job.objects.filter(pk=job.pk).update(idempotency_key=None)
        return None
    if job.request_hash != fingerprint:
        raise IdempotencyConflict(
            f"Idempotency-Key {key!r} was used for a different request (job {job.id}) within 24 hours"
        )
    return job


def job_submit(
    *, owner: User, spec: JobSpec, idempotency_key: str | None = None, site: SiteSettings | None = None
) -> Submission:
    """Check and record a job. Refused: recorded with every reason. Accepted: recorded as pending with its
    plan and runtime snapshot, and execution 1 is started by a task enqueued after the commit."""
    fingerprint = request_fingerprint(spec)
    if idempotency_key:
        earlier = _replay(owner, idempotency_key, fingerprint)
        if earlier is not None:
            return Submission(job=earlier, replayed=True)
    if not roles.may_submit_to(owner, spec.namespace):
        raise NamespaceNotGranted(f"namespace {spec.namespace!r} is not granted to {owner.get_username()}")

    job_id = new_job_id()
    site = site or site_settings(max_age=PLAN_RUNTIME_MAX_AGE)
    plan, runtime = job_plan(
        user=owner,
        spec=spec,
        job_id=job_id,
        runtime_max_age=PLAN_RUNTIME_MAX_AGE,
        site=site,
        namespace_granted=True,  # checked just above
    )
    plan_data = plan.to_dict()
    refused = plan.refused
    try:
        with transaction.atomic():
            job = Job.objects.create(
                id=job_id,
                owner=owner,
                namespace=spec.namespace,
                display_name=spec.display_name or "",
                runtime_kind=spec.runtime.kind,
                runtime_namespace=spec.runtime.namespace or "",
                runtime_name=spec.runtime.name,
                spec=spec.to_dict(),
                plan=plan_data,
                runtime_snapshot=runtime.body if runtime else None,
                reasons=[r for r in plan_data["reasons"] if not r["waived"]] if refused else [],
                identity_warnings=plan_data["identity_warnings"],
                recovery_policy=recovery.resolve(site.recovery_policy, spec.recovery_policy),
                state=JobState.REFUSED if refused else JobState.PENDING,
                message="refused: " + ", ".join(plan.codes) if refused else "",
                idempotency_key=idempotency_key or None,
                request_hash=fingerprint,
            )
            if refused:
                JobEvent.objects.create(
                    job=job, kind="refused", message=job.message, details={"reasons": job.reasons}
                )
            else:
                # The job row's created_at is the timeline's "submitted" entry: no event row needed.
                execution = Execution.objects.create(
                    job=job, attempt=1, trainjob_name=trainjob_name(job_id, 1)
                )
                # robust: a broker outage must not turn an accepted (committed) job into a 500; the
                # stale-execution sweep enqueues it again.
                transaction.on_commit(lambda: _enqueue_submit(execution.pk), robust=True)
            audit_record(
                actor=owner,
                action="job.refuse" if refused else "job.submit",
                object_type="job",
                object_id=job.id,
                details={
                    "runtime": spec.runtime.source,
                    "namespace": spec.namespace,
                    "codes": list(plan.codes),
                },
            )
    except IntegrityError:
        # The same Idempotency-Key raced in from a concurrent request: answer with that request's job.
        if idempotency_key:
            earlier = _replay(owner, idempotency_key, fingerprint)
            if earlier is not None:
                return Submission(job=earlier, replayed=True)
        raise
    return Submission(job=job, replayed=False)


def _enqueue_submit(execution_id: int) -> None:
    from jobs.tasks import execution_submit

    execution_submit.delay(execution_id)


def _event(job: Job, kind: str, message: str, attempt: int | None = None, **details: Any) -> None:
    JobEvent.objects.create(job=job, kind=kind, message=message, attempt=attempt, details=details)


def _transition(job: Job, old: set[str] | frozenset[str], new: str, **fields: Any) -> bool:
    """Compare-and-set the job's state; False when another worker or request changed it first."""
    now = timezone.now()
    updated = Job.objects.filter(pk=job.pk, state__in=old).update(
        state=new, state_changed_at=now, updated_at=now, **fields
    )
    return updated == 1


def _ours(obj: dict[str, Any], label_domain: str, job_id: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(f"{label_domain}/job") == job_id)


def _create_or_adopt(kind: str, body: dict[str, Any], label_domain: str, job_id: str) -> dict[str, Any]:
    """Create the object; an existing one carrying our job label is ours from an earlier delivery."""
    meta = body["metadata"]
    try:
        return gateway.create_namespaced(kind, body)
    except AlreadyExists:
        existing = gateway.get_namespaced(kind, meta["namespace"], meta["name"])
        if existing is None or not _ours(existing, label_domain, job_id):
            raise Rejected(
                gateway.target(kind, meta["namespace"], meta["name"]),
                "already exists and was not created by dispatch for this job",
            ) from None
        return existing


def execution_submit(*, execution_id: int) -> None:
    """Start one execution: re-check the runtime, create the TrainingRuntime copy, then the TrainJob on it,
    then make the TrainJob the copy's owner. Idempotent; raises TransientSubmitError to be retried."""
    execution = Execution.objects.select_related("job", "job__owner").filter(pk=execution_id).first()
    if execution is None:
        return
    job = execution.job
    if job.state != JobState.PENDING or execution.state != JobState.PENDING:
        return  # a duplicate delivery, or the job was cancelled meanwhile
    Execution.objects.filter(pk=execution.pk).update(submit_tries=execution.submit_tries + 1)
    spec = JobSpec.from_dict(job.spec)
    site = SiteSettings.load()
    try:
        # The runtime may have changed since the plan: judge it again and build from what is judged now.
        plan, runtime = job_plan(
            user=job.owner,
            spec=spec,
            job_id=job.id,
            attempt=execution.attempt,
            site=site,
            stored_runtime=job.runtime_snapshot if execution.attempt > 1 else None,
        )
        if plan.refused:
            _refuse_at_start(job, execution, plan)
            return
        assert plan.training_runtime is not None and plan.train_job is not None
        copy = _create_or_adopt(TRAINING_RUNTIME, plan.training_runtime, site.label_domain, job.id)
        try:
            trainjob = _create_or_adopt(TRAINJOB, plan.train_job, site.label_domain, job.id)
        except Rejected as exc:
            if _copy_not_seen_yet(exc):
                # The copy exists (created or adopted just above): the Trainer has not seen it yet.
                raise TransientSubmitError(str(exc)) from exc
            raise
        _own_copy(copy, trainjob)
    except Rejected as exc:
        _fail_config(job, execution, exc)
        return
    except NotFound as exc:
        # The namespace does not exist (or vanished): nothing to retry.
        _fail_config(job, execution, exc)
        return
    except ClusterError as exc:
        if exc.transient:
            raise TransientSubmitError(str(exc)) from exc
        _fail_config(job, execution, exc)
        return

    now = timezone.now()
    # The job shows the identity warnings of the runtime that actually ran: the one judged just now.
    warnings = list(plan.identity_warnings)
    with transaction.atomic():
        Execution.objects.filter(pk=execution.pk, state=JobState.PENDING).update(
            state=JobState.QUEUED, submitted_at=now
        )
        moved = _transition(
            job,
            {JobState.PENDING},
            JobState.QUEUED,
            current_attempt=execution.attempt,
            plan=plan.to_dict(),
            runtime_snapshot=runtime.body if runtime else None,
            identity_warnings=warnings,
            message=f"TrainJob {job.namespace}/{execution.trainjob_name} created",
        )
        if moved and warnings != list(job.identity_warnings or []):
            _event(
                job,
                "identity-warnings",
                _warnings_changed(warnings),
                execution.attempt,
                before=list(job.identity_warnings or []),
                after=warnings,
            )
        if moved:
            _event(
                job,
                "created",
                f"created TrainJob {job.namespace}/{execution.trainjob_name}",
                execution.attempt,
            )
    if not moved:
        # Cancelled while we were creating: take down what we just made.
        _delete_execution_objects(job, execution)


# The Trainer's TrainJob webhook reads runtimes through its informer cache, which can lag right after the
# copy was created; it then denies the TrainJob with "<err>: specified trainingRuntime must be created
# before the TrainJob is created", <err> being 'TrainingRuntime.trainer.kubeflow.org "<name>" not found'.
_COPY_NOT_SEEN = ("must be created before the trainjob", "trainingruntime")


def _copy_not_seen_yet(exc: Rejected) -> bool:
    """Is this the Trainer webhook's denial for a runtime copy it has not seen yet (worth a retry)?"""
    message = exc.message.lower()
    return _COPY_NOT_SEEN[0] in message or (_COPY_NOT_SEEN[1] in message and "not found" in message)


def _warnings_changed(warnings: list[str]) -> str:
    if not warnings:
        return "judged at start, the runtime no longer gives the identity warning shown at submission"
    return "judged at start, the runtime gives identity warnings: " + "; ".join(warnings)


def _own_copy(copy: dict[str, Any], trainjob: dict[str, Any]) -> None:
    meta = trainjob["metadata"]
    owner = {
        "apiVersion": trainjob.get("apiVersion", "trainer.kubeflow.org/v1alpha1"),
        "kind": TRAINJOB,
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": False,
    }
    existing = (copy.get("metadata") or {}).get("ownerReferences") or []
    if any(ref.get("uid") == meta["uid"] for ref in existing):
        return
    gateway.patch_namespaced(
        TRAINING_RUNTIME,
        copy["metadata"]["namespace"],
        copy["metadata"]["name"],
        {"metadata": {"ownerReferences": [*existing, owner]}},
    )


def _refuse_at_start(job: Job, execution: Execution, plan: Plan) -> None:
    reasons = [r.to_dict() for r in plan.reasons if not r.waived]
    with transaction.atomic():
        if _transition(
            job,
            {JobState.PENDING},
            JobState.REFUSED,
            reasons=reasons,
            plan=plan.to_dict(),
            message="refused at start: " + ", ".join(r["code"] for r in reasons),
        ):
            Execution.objects.filter(pk=execution.pk).update(
                state=JobState.REFUSED, finished_at=timezone.now()
            )
            _event(
                job,
                "refused",
                "the runtime broke a rule between plan and start",
                execution.attempt,
                reasons=reasons,
            )
            audit_record(
                actor=None,
                action="job.refuse",
                object_type="job",
                object_id=job.id,
                details={"codes": [r["code"] for r in reasons], "at": "start"},
            )


def _fail_config(job: Job, execution: Execution, exc: ClusterError) -> None:
    message = f"{exc.target}: {exc.message}"
    with transaction.atomic():
        if _transition(
            job,
            {JobState.PENDING},
            JobState.FAILED,
            cause=Cause.CONFIG_ERROR,
            message=message,
            evidence=[{"object": exc.target, "field": f"HTTP {exc.status}", "value": exc.message}],
        ):
            Execution.objects.filter(pk=execution.pk).update(
                state=JobState.FAILED, cause=Cause.CONFIG_ERROR, message=message, finished_at=timezone.now()
            )
            _event(job, "failed", message, execution.attempt, cause=Cause.CONFIG_ERROR)
    # A TrainJob rejected after its runtime copy was created leaves the copy without an owner.
    _delete_execution_objects(job, execution)


def execution_give_up(*, execution_id: int, error: str) -> None:
    """The submission's transient retries are exhausted: the job's cluster state is unknown."""
    execution = Execution.objects.select_related("job").filter(pk=execution_id).first()
    if execution is None:
        return
    job = execution.job
    if _transition(
        job, {JobState.PENDING}, JobState.UNKNOWN, message=f"could not reach the cluster: {error}"
    ):
        _event(job, "unknown", f"submission retries exhausted: {error}", execution.attempt)


def _delete_execution_objects(job: Job, execution: Execution, *, retry_transient: bool = False) -> None:
    """Delete the TrainJob; the garbage collector then deletes its JobSet and the runtime copy it owns.
    A copy without that owner (the TrainJob was never created, or we stopped before the ownerReference)
    is deleted here. Only objects carrying this job's label are touched: a name that collided with
    somebody else's object is never deleted. Best effort unless retry_transient (the delete task)."""
    name = execution.trainjob_name
    label_domain = SiteSettings.load().label_domain
    try:
        trainjob = gateway.get_namespaced(TRAINJOB, job.namespace, name)
        if trainjob is not None and _ours(trainjob, label_domain, job.id):
            gateway.delete_namespaced(TRAINJOB, job.namespace, name)
        copy = gateway.get_namespaced(TRAINING_RUNTIME, job.namespace, name)
        owned = copy is not None and any(
            ref.get("kind") == TRAINJOB for ref in (copy.get("metadata") or {}).get("ownerReferences") or []
        )
        if copy is not None and not owned and _ours(copy, label_domain, job.id):
            gateway.delete_namespaced(TRAINING_RUNTIME, job.namespace, name)
    except ClusterError as exc:
        logger.warning("could not delete the objects of %s/%s: %s", job.namespace, name, exc)
        if exc.transient and retry_transient:
            raise TransientSubmitError(str(exc)) from exc


def job_cancel(*, actor: Any, job: Job) -> Job:
    """Cancel a job: the state changes at once; a task deletes the TrainJob (and its runtime copy)."""
    with transaction.atomic():
        if not _transition(
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
        execution = job.executions.order_by("-attempt").first()
        if execution is not None:
            Execution.objects.filter(pk=execution.pk, state__in=ACTIVE_STATES).update(
                state=JobState.CANCELLED, cause=Cause.CANCELLED, finished_at=timezone.now()
            )
            transaction.on_commit(lambda: _enqueue_cancel(execution.pk), robust=True)
        _event(job, "cancelled", f"cancelled by {actor.get_username()}")
        audit_record(actor=actor, action="job.cancel", object_type="job", object_id=job.id)
    job.refresh_from_db()
    return job


def _enqueue_cancel(execution_id: int) -> None:
    from jobs.tasks import execution_delete

    execution_delete.delay(execution_id)


STALE_PENDING_SECONDS = 60


def executions_resubmit_stale(*, older_than_seconds: int = STALE_PENDING_SECONDS) -> list[int]:
    """Enqueue again every execution still pending well after it was accepted: its task was lost (the
    broker was down at submission, or a message expired). Starting an execution is idempotent."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    stale = list(
        Execution.objects.filter(
            state=JobState.PENDING, job__state=JobState.PENDING, created_at__lt=cutoff
        ).values_list("pk", flat=True)
    )
    for execution_id in stale:
        _enqueue_submit(execution_id)
    return stale


def execution_delete(*, execution_id: int) -> None:
    execution = Execution.objects.select_related("job").filter(pk=execution_id).first()
    if execution is None:
        return
    _delete_execution_objects(execution.job, execution, retry_transient=True)
