"""Submit a job: record it (refused with every reason, or pending with its plan) in one
transaction, then enqueue the start of execution 1 after the commit. An Idempotency-Key replays an earlier
submission of the same request."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from dispatch_site import roles
from dispatch_site.audit import audit_event
from dispatch_site.roles import NamespaceNotGranted
from jobs import enqueue, recovery
from jobs.models import Execution, Job, JobEvent, JobState
from jobs.naming import new_job_id, trainjob_name
from jobs.spec import JobSpec
from jobs.submission import records
from jobs.submission.errors import IdempotencyConflict
from jobs.submission.planning import PLAN_RUNTIME_MAX_AGE, job_plan
from runtimes.models import SiteSettings
from runtimes.selectors import site_settings


def request_fingerprint(spec: JobSpec) -> str:
    return hashlib.sha256(json.dumps(spec.to_dict(), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Submission:
    job: Job
    replayed: bool  # the Idempotency-Key matched an earlier request: this is that job
    executions: list[Execution] | None = None  # those recorded now (None: read them from the job)


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
    plan, and execution 1 is started by a task enqueued after the commit."""
    fingerprint = request_fingerprint(spec)
    if idempotency_key:
        earlier = _replay(owner, idempotency_key, fingerprint)
        if earlier is not None:
            return Submission(job=earlier, replayed=True)
    if not roles.may_submit_to(owner, spec.namespace):
        raise NamespaceNotGranted(f"namespace {spec.namespace!r} is not granted to {owner.get_username()}")

    job_id = new_job_id()
    site = site or site_settings(max_age=PLAN_RUNTIME_MAX_AGE)
    plan, _runtime = job_plan(
        user=owner,
        spec=spec,
        job_id=job_id,
        runtime_max_age=PLAN_RUNTIME_MAX_AGE,
        site=site,
        namespace_granted=True,  # checked just above
    )
    plan_data = plan.to_dict(copy_objects=False)  # stored at once, never edited
    refused = plan.refused
    job = Job(
        id=job_id,
        owner=owner,
        namespace=spec.namespace,
        display_name=spec.display_name or "",
        runtime_kind=spec.runtime.kind,
        runtime_namespace=spec.runtime.namespace or "",
        runtime_name=spec.runtime.name,
        spec=spec.to_dict(),
        plan=plan_data,
        # Not the runtime read now: start reads it afresh and stores the one it ran (a retry runs on that), so
        # a copy here was only ever overwritten (and cost every submission its bytes).
        runtime_snapshot=None,
        reasons=[r for r in plan_data["reasons"] if not r["waived"]] if refused else [],
        identity_warnings=plan_data["identity_warnings"],
        recovery_policy=recovery.resolve(site.recovery_policy, spec.recovery_policy),
        state=JobState.REFUSED if refused else JobState.PENDING,
        message="refused: " + ", ".join(plan.codes) if refused else "",
        idempotency_key=idempotency_key or None,
        request_hash=fingerprint,
        label_domain=site.label_domain,
    )
    audit = audit_event(
        actor=owner,
        action="job.refuse" if refused else "job.submit",
        object_type="job",
        object_id=job.id,
        details={"runtime": spec.runtime.source, "namespace": spec.namespace, "codes": list(plan.codes)},
    )
    executions: list[Execution] = []
    try:
        if refused:
            with transaction.atomic():
                job.save(force_insert=True)
                JobEvent.objects.create(
                    job=job, kind="refused", message=job.message, details={"reasons": job.reasons}
                )
                audit.save(force_insert=True)
        else:
            # The job row's created_at is the timeline's "submitted" entry: no event row needed.
            execution = Execution(job=job, attempt=1, trainjob_name=trainjob_name(job_id, 1))
            records.insert_together(job, audit, execution)
            executions.append(execution)
            # robust: a broker outage must not turn an accepted (committed) job into a 500; the
            # stale-execution sweep enqueues it again.
            transaction.on_commit(enqueue.on_commit_send(enqueue.EXECUTION_SUBMIT, execution.pk), robust=True)
    except IntegrityError:
        # The same Idempotency-Key raced in from a concurrent request: answer with that request's job.
        if idempotency_key:
            earlier = _replay(owner, idempotency_key, fingerprint)
            if earlier is not None:
                return Submission(job=earlier, replayed=True)
        raise
    return Submission(job=job, replayed=False, executions=executions)
