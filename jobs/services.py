"""Job services: plan, submit (record, then start execution 1 in a task), and cancel.

The job row is the source of truth. Every state change is compare-and-set
(`filter(pk=..., state=old).update(state=new)`), so a duplicate task delivery or a double click is harmless.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import F, Q
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
                label_domain=site.label_domain,
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


def is_ours(obj: dict[str, Any], label_domain: str, job_id: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(f"{label_domain}/job") == job_id)


def create_or_adopt(kind: str, body: dict[str, Any], label_domain: str, job_id: str) -> dict[str, Any]:
    """Create the object; an existing one carrying our job label is ours from an earlier delivery."""
    meta = body["metadata"]
    try:
        return gateway.create_namespaced(kind, body)
    except AlreadyExists:
        existing = gateway.get_namespaced(kind, meta["namespace"], meta["name"])
        if existing is None or not is_ours(existing, label_domain, job_id):
            raise Rejected(
                gateway.target(kind, meta["namespace"], meta["name"]),
                "already exists and was not created by dispatch for this job",
            ) from None
        return existing


# How long one delivery may work on a pending execution before another may take over (its worker died):
# longer than one delivery's cluster calls (a few requests of KUBE_TIMEOUT_SECONDS each).
SUBMIT_LEASE_SECONDS = 120

# A job that could not be started because the cluster was unreachable is `unknown` with this last known state;
# the sweep starts it again once its chain has run out.
_STARTABLE = frozenset({JobState.PENDING, JobState.UNKNOWN})


def _locked(execution_id: int) -> tuple[Job, Execution] | None:
    """The execution and its job, row-locked in the one order every writer uses: job, then execution."""
    job_id = Execution.objects.filter(pk=execution_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return None
    job = Job.objects.select_for_update().select_related("owner").filter(pk=job_id).first()
    execution = Execution.objects.select_for_update().filter(pk=execution_id).first()
    if job is None or execution is None:
        return None
    return job, execution


def _startable(job: Job, execution: Execution) -> bool:
    """Is this pending execution the one its job waits for? (`unknown`: it never reached the cluster)"""
    if execution.state != JobState.PENDING or execution.attempt < job.current_attempt:
        return False
    if job.state == JobState.UNKNOWN:
        return job.last_known_state == JobState.PENDING
    return job.state == JobState.PENDING


def _claim(execution_id: int, holder: str) -> tuple[Job, Execution] | None:
    """Take the execution for this delivery chain before any cluster work, or None: it is no longer pending
    (a duplicate delivery, a cancel) or another chain holds it. A chain's next delivery (same holder)
    takes it again; a dead holder's lease runs out."""
    now = timezone.now()
    with transaction.atomic():
        locked = _locked(execution_id)
        if locked is None:
            return None
        job, execution = locked
        if not _startable(job, execution):
            return None
        lease_free = (
            execution.claim_until is None or execution.claim_until < now or execution.claim_holder == holder
        )
        if not lease_free:
            return None
        Execution.objects.filter(pk=execution.pk).update(
            claim_holder=holder,
            claim_until=now + timedelta(seconds=SUBMIT_LEASE_SECONDS),
            submit_tries=F("submit_tries") + 1,
        )
    return job, execution


def _hold(execution_id: int, holder: str, seconds: float) -> None:
    """The chain backs off for `seconds`: it keeps its claim meanwhile, so the sweep adds no second chain."""
    Execution.objects.filter(pk=execution_id, claim_holder=holder, state=JobState.PENDING).update(
        claim_until=timezone.now() + timedelta(seconds=seconds + SUBMIT_LEASE_SECONDS)
    )


def execution_submit(*, execution_id: int, holder: str | None = None, retry_in: float = 0.0) -> None:
    """Start one execution: claim it, re-check the runtime, create the TrainingRuntime copy, then the TrainJob
    on it, then make the TrainJob the copy's owner. Idempotent; raises TransientSubmitError to be retried
    (after `retry_in` seconds, through which this chain, `holder`, keeps its claim)."""
    holder = holder or f"call-{uuid.uuid4().hex}"
    claimed = _claim(execution_id, holder)
    if claimed is None:
        return  # a duplicate delivery, cancelled meanwhile, or another delivery is starting it
    job, execution = claimed
    spec = JobSpec.from_dict(job.spec)
    site = SiteSettings.load()
    label_domain = job.label_domain or site.label_domain
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
            _refuse_at_start(job, execution, plan, holder)
            return
        assert plan.training_runtime is not None and plan.train_job is not None
        copy = create_or_adopt(TRAINING_RUNTIME, plan.training_runtime, label_domain, job.id)
        try:
            trainjob = create_trainjob_on_copy(plan.train_job, label_domain, job.id)
        except Rejected as exc:
            if _copy_not_seen_yet(exc):  # still unseen after the waits: the task retries later
                raise TransientSubmitError(str(exc)) from exc
            raise
        own_copy(copy, trainjob)
    except TransientSubmitError:
        _hold(execution.pk, holder, retry_in)
        raise
    except Rejected as exc:
        _fail_config(job, execution, exc, holder)
        return
    except NotFound as exc:
        # The namespace does not exist (or vanished): nothing to retry.
        _fail_config(job, execution, exc, holder)
        return
    except ClusterError as exc:
        if exc.transient:
            _hold(execution.pk, holder, retry_in)
            raise TransientSubmitError(str(exc)) from exc
        _fail_config(job, execution, exc, holder)
        return

    now = timezone.now()
    # The job shows the identity warnings of the runtime that actually ran: the one judged just now.
    warnings = list(plan.identity_warnings)
    moved = False
    with transaction.atomic():
        locked = _locked(execution.pk)
        current = locked[0] if locked else None
        if locked is not None and _startable(*locked) and locked[1].claim_holder == holder:
            job = locked[0]
            Execution.objects.filter(pk=execution.pk).update(
                state=JobState.QUEUED, submitted_at=now, claim_holder="", claim_until=None
            )
            moved = _transition(
                job,
                _STARTABLE,
                JobState.QUEUED,
                current_attempt=execution.attempt,
                plan=plan.to_dict(),
                runtime_snapshot=runtime.body if runtime else None,
                identity_warnings=warnings,
                last_known_state="",
                unknown_since=None,
                message=f"TrainJob {job.namespace}/{execution.trainjob_name} created",
            )
            if not moved:  # impossible under the locks; never leave the execution ahead of its job
                raise RuntimeError(f"job {job.id} changed under its row lock")
            if warnings != list(job.identity_warnings or []):
                _event(
                    job,
                    "identity-warnings",
                    _warnings_changed(warnings),
                    execution.attempt,
                    before=list(job.identity_warnings or []),
                    after=warnings,
                )
            _event(
                job,
                "created",
                f"created TrainJob {job.namespace}/{execution.trainjob_name}",
                execution.attempt,
            )
    if not moved and current is not None and current.state == JobState.CANCELLED:
        # Cancelled while we were creating (its delete may have run before our create): take down what we
        # just made. Any other reason (another delivery took over after our lease ran out) leaves it alone.
        _delete_execution_objects(current, execution)


# The Trainer's TrainJob webhook reads runtimes through its informer cache, which can lag right after the
# copy was created; it then denies the TrainJob with "<err>: specified trainingRuntime must be created
# before the TrainJob is created", <err> being 'TrainingRuntime.trainer.kubeflow.org "<name>" not found'.
_COPY_NOT_SEEN = ("must be created before the trainjob", "trainingruntime")


# How long the TrainJob create waits, in this delivery, for the Trainer's cache to see the copy before the
# task is retried (the lag is usually milliseconds; a task retry waits seconds).
COPY_SEEN_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)


def create_trainjob_on_copy(body: dict[str, Any], label_domain: str, owner_id: str) -> dict[str, Any]:
    """Create (or adopt) the TrainJob right after its runtime copy (of a job or a session). The copy exists
    (created or adopted just before): a denial for a runtime the Trainer has not seen yet is tried again a few
    times; after the last wait the denial is raised (`_copy_not_seen_yet` tells it from a real rejection)."""
    for wait in COPY_SEEN_WAITS:
        try:
            return create_or_adopt(TRAINJOB, body, label_domain, owner_id)
        except Rejected as exc:
            if not _copy_not_seen_yet(exc):
                raise
            time.sleep(wait)
    return create_or_adopt(TRAINJOB, body, label_domain, owner_id)


def _copy_not_seen_yet(exc: Rejected) -> bool:
    """Is this the Trainer webhook's denial for a runtime copy it has not seen yet (worth a retry)?"""
    message = exc.message.lower()
    return _COPY_NOT_SEEN[0] in message or (_COPY_NOT_SEEN[1] in message and "not found" in message)


def _warnings_changed(warnings: list[str]) -> str:
    if not warnings:
        return "judged at start, the runtime no longer gives the identity warning shown at submission"
    return "judged at start, the runtime gives identity warnings: " + "; ".join(warnings)


def own_copy(copy: dict[str, Any], trainjob: dict[str, Any]) -> None:
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


def _refuse_at_start(job: Job, execution: Execution, plan: Plan, holder: str) -> None:
    reasons = [r.to_dict() for r in plan.reasons if not r.waived]
    now = timezone.now()
    with transaction.atomic():
        locked = _locked(execution.pk)
        if locked is None or not _startable(*locked) or locked[1].claim_holder != holder:
            return
        job = locked[0]
        _transition(
            job,
            _STARTABLE,
            JobState.REFUSED,
            reasons=reasons,
            plan=plan.to_dict(),
            message="refused at start: " + ", ".join(r["code"] for r in reasons),
        )
        Execution.objects.filter(pk=execution.pk).update(
            state=JobState.REFUSED,
            finished_at=now,
            claim_holder="",
            claim_until=None,
            delete_requested_at=now,
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
    # An earlier delivery of this execution may have created the copy and the TrainJob: take them down
    # (the sweep finishes it when the cluster cannot be reached now).
    _delete_execution_objects(job, execution)


def _fail_config(job: Job, execution: Execution, exc: ClusterError, holder: str) -> None:
    message = f"{exc.target}: {exc.message}"
    now = timezone.now()
    with transaction.atomic():
        locked = _locked(execution.pk)
        if locked is None or not _startable(*locked) or locked[1].claim_holder != holder:
            return
        job = locked[0]
        _transition(
            job,
            _STARTABLE,
            JobState.FAILED,
            cause=Cause.CONFIG_ERROR,
            message=message,
            evidence=[{"object": exc.target, "field": f"HTTP {exc.status}", "value": exc.message}],
        )
        Execution.objects.filter(pk=execution.pk).update(
            state=JobState.FAILED,
            cause=Cause.CONFIG_ERROR,
            message=message,
            finished_at=now,
            claim_holder="",
            claim_until=None,
            delete_requested_at=now,
        )
        _event(job, "failed", message, execution.attempt, cause=Cause.CONFIG_ERROR)
    # A TrainJob rejected after its runtime copy was created leaves the copy without an owner.
    _delete_execution_objects(job, execution)


def execution_give_up(*, execution_id: int, error: str, holder: str) -> None:
    """This chain's transient retries are exhausted: the job is `unknown` (last known state pending, since
    now) and the claim is released, so the sweep starts the execution again once the cluster answers."""
    now = timezone.now()
    with transaction.atomic():
        locked = _locked(execution_id)
        if locked is None:
            return
        job, execution = locked
        if not _startable(job, execution) or execution.claim_holder != holder:
            return  # another chain holds it, or it moved on
        Execution.objects.filter(pk=execution.pk).update(claim_holder="", claim_until=None)
        if job.state == JobState.PENDING:
            _transition(
                job,
                {JobState.PENDING},
                JobState.UNKNOWN,
                last_known_state=JobState.PENDING,
                unknown_since=now,
                message=f"could not reach the cluster: {error}",
            )
            _event(job, "unknown", f"submission retries exhausted: {error}", execution.attempt)


def _delete_execution_objects(job: Job, execution: Execution, *, retry_transient: bool = False) -> None:
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
        execution = Execution.objects.select_for_update().filter(job=job).order_by("-attempt").first()
        if execution is not None:
            Execution.objects.filter(pk=execution.pk, state__in=ACTIVE_STATES).update(
                state=JobState.CANCELLED, cause=Cause.CANCELLED, finished_at=now
            )
            Execution.objects.filter(pk=execution.pk).update(
                delete_requested_at=now, objects_removed_at=None, claim_holder="", claim_until=None
            )
            execution_id = execution.pk
            transaction.on_commit(lambda: _enqueue_cancel(execution_id), robust=True)
        _event(job, "cancelled", f"cancelled by {actor.get_username()}")
        audit_record(actor=actor, action="job.cancel", object_type="job", object_id=job.id)
    job.refresh_from_db()
    return job


def _enqueue_cancel(execution_id: int) -> None:
    from jobs.tasks import execution_delete

    execution_delete.delay(execution_id)


STALE_PENDING_SECONDS = 60
# A delete not done two sweep periods after it was asked for is enqueued again (deletes are idempotent;
# a second chain beside a live one only costs a few requests).
STALE_DELETE_FACTOR = 2


def executions_resubmit_stale(*, older_than_seconds: int = STALE_PENDING_SECONDS) -> list[int]:
    """Enqueue again what was accepted but whose task was lost (the broker was down, a message expired, a
    worker died) or ran out of retries during an outage: a pending execution no chain holds, and a delete
    (cancel, refusal) whose objects are not yet removed. Both tasks are idempotent."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=older_than_seconds)
    unclaimed = Q(claim_until__isnull=True) | Q(claim_until__lt=now)
    startable = Q(job__state=JobState.PENDING) | Q(
        job__state=JobState.UNKNOWN, job__last_known_state=JobState.PENDING
    )
    stale = list(
        Execution.objects.filter(startable, unclaimed, state=JobState.PENDING, created_at__lt=cutoff)
        .filter(attempt__gte=F("job__current_attempt"))
        .values_list("pk", flat=True)
    )
    for execution_id in stale:
        _enqueue_submit(execution_id)
    delete_cutoff = now - timedelta(seconds=older_than_seconds * STALE_DELETE_FACTOR)
    deletes = list(
        Execution.objects.filter(
            delete_requested_at__lte=delete_cutoff, objects_removed_at__isnull=True
        ).values_list("pk", flat=True)
    )
    for execution_id in deletes:
        _enqueue_cancel(execution_id)
    return stale + deletes


def execution_delete(*, execution_id: int) -> None:
    execution = Execution.objects.select_related("job").filter(pk=execution_id).first()
    if execution is None:
        return
    _delete_execution_objects(execution.job, execution, retry_transient=True)


def execution_delete_gave_up(*, execution_id: int, error: str) -> None:
    """The delete task's retries are exhausted: say so on the job's timeline; the sweep tries again."""
    execution = Execution.objects.select_related("job").filter(pk=execution_id).first()
    if execution is None:
        return
    Execution.objects.filter(pk=execution.pk, delete_requested_at__isnull=True).update(
        delete_requested_at=timezone.now()
    )
    _event(
        execution.job,
        "delete-pending",
        f"could not delete TrainJob {execution.job.namespace}/{execution.trainjob_name} yet ({error}); "
        "the sweep tries again",
        execution.attempt,
    )
