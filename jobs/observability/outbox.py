"""Writes the outbox (Change rows) and observes the metrics of job changes, from signals: nothing in the
services that change jobs has to know.

A JobEvent is written in the same transaction as the state change it records (jobs.submission,
jobs.supervision); its post_save signal runs inside that transaction and adds the Change row there too. A
new accepted job has no JobEvent (its row is its "submitted" entry): its Change is inserted with it, in the
submission's one statement (jobs.models.rows_inserting). Each saved Change moves its counters and wakes the
webhooks' fan-out on commit, so a rolled-back change counts nothing."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models.signals import post_save

from dispatch_site import metrics
from dispatch_site.readcache import ReadCache
from jobs import enqueue
from jobs.models import Execution, Job, JobEvent, JobState, rows_inserting
from jobs.observability import payloads
from jobs.observability.models import Change, WebhookEndpoint

logger = logging.getLogger(__name__)

# Whether any webhook endpoint is active, read at most every few seconds per process: without one, a change
# enqueues no fan-out (the periodic sweep catches anything a fresh endpoint missed).
_endpoints_cache: ReadCache[bool] = ReadCache(limit=1)
ENDPOINTS_MAX_AGE = 5.0


def _webhooks_wanted() -> bool:
    return _endpoints_cache.get(
        "any", ENDPOINTS_MAX_AGE, lambda: WebhookEndpoint.objects.filter(active=True).exists()
    )


def forget_cached_endpoints() -> None:
    _endpoints_cache.clear()


def connect() -> None:
    post_save.connect(_job_event_saved, sender=JobEvent, dispatch_uid="observability-jobevent")
    post_save.connect(_change_saved, sender=Change, dispatch_uid="observability-change")
    rows_inserting.connect(_job_inserting, sender=Job, dispatch_uid="observability-job")


def _job_inserting(sender: Any, instance: Job, **kwargs: Any) -> list[Change]:
    """The Change of a new accepted job, inserted with it."""
    if instance.state != JobState.PENDING:
        return []  # a refused submission is recorded by its "refused" JobEvent
    return [
        change(
            job_id=instance.pk,
            namespace=instance.namespace,
            owner_id=instance.owner_id,
            event_id=None,
            kind=payloads.SUBMITTED,
            from_state="",
            to_state=JobState.PENDING,
            cause="",
            attempt=None,
            at=instance.created_at,
            data={"message": "", "rank": None, "exit_code": None},
        )
    ]


def _change_saved(sender: Any, instance: Change, created: bool, raw: bool = False, **kwargs: Any) -> None:
    """On commit, the counters a change moves and the webhooks' fan-out."""
    if not created or raw:
        return
    transaction.on_commit(lambda: _observe(instance), robust=True)
    if _webhooks_wanted():
        transaction.on_commit(enqueue.on_commit_send(enqueue.WEBHOOKS_FANOUT), robust=True)


def _job_event_saved(
    sender: Any, instance: JobEvent, created: bool, raw: bool = False, **kwargs: Any
) -> None:
    if not created or raw:
        return
    cached = instance._state.fields_cache.get("job")  # the caller's Job, as it read it before the change
    if cached is not None:
        namespace, owner_id, state_before = cached.namespace, cached.owner_id, cached.state
    else:
        row = Job.objects.filter(pk=instance.job_id).values_list("namespace", "owner_id").first()
        if row is None:
            return
        (namespace, owner_id), state_before = row, ""
    rank = exit_code = None
    execution_created: datetime | None = None
    if instance.attempt is not None and instance.kind in ("transition", "failed", "created", "retry"):
        found = instance.execution_facts or (
            Execution.objects.filter(job_id=instance.job_id, attempt=instance.attempt)
            .values_list("rank", "exit_code", "created_at")
            .first()
        )
        if found is not None:
            rank, exit_code, execution_created = found
    from_state, to_state = payloads.states(
        instance.kind, instance.from_state, instance.to_state, state_before
    )
    details = instance.details if isinstance(instance.details, dict) else {}
    change(
        job_id=instance.job_id,
        namespace=namespace,
        owner_id=owner_id,
        event_id=instance.pk,
        kind=instance.kind,
        from_state=from_state,
        to_state=to_state,
        cause=instance.cause,
        attempt=instance.attempt,
        at=instance.at,
        data=payloads.change_data(
            kind=instance.kind, message=instance.message, details=details, rank=rank, exit_code=exit_code
        ),
    ).save(force_insert=True)
    if instance.kind == "created" and execution_created is not None:
        waited = max(0.0, (instance.at - execution_created).total_seconds())
        transaction.on_commit(lambda: metrics.SUBMISSION_TO_TRAINJOB.observe(waited))
    queued_to_running = (from_state, to_state) == (JobState.QUEUED, JobState.RUNNING)
    if instance.kind == "transition" and instance.attempt is not None and queued_to_running:
        queued = (
            Execution.objects.filter(job_id=instance.job_id, attempt=instance.attempt)
            .values_list("submitted_at", "job__spec__queue_name")
            .first()
        )
        if queued is not None and queued[0] is not None and queued[1]:
            held = max(0.0, (instance.at - queued[0]).total_seconds())
            transaction.on_commit(lambda: metrics.QUEUE_WAIT.observe(held))


def change(
    *,
    job_id: str,
    namespace: str,
    owner_id: int,
    event_id: int | None,
    kind: str,
    from_state: str,
    to_state: str,
    cause: str,
    attempt: int | None,
    at: datetime,
    data: dict[str, Any],
) -> Change:
    """One Change row, not saved yet."""
    return Change(
        job_id=job_id,
        event_id=event_id,
        namespace=namespace,
        owner_id=owner_id,
        kind=kind,
        type=payloads.event_type(kind),
        from_state=from_state,
        to_state=to_state,
        cause=cause,
        attempt=attempt,
        at=at,
        data=data,
    )


def _observe(change: Change) -> None:
    """The counters one committed change moves."""
    if change.to_state and change.from_state != change.to_state:
        metrics.JOB_TRANSITIONS.labels(
            change.from_state or payloads.NEW, change.to_state, change.cause or payloads.NO_CAUSE
        ).inc()
    if change.kind == "refused":
        for code in change.data.get("reasons") or []:
            metrics.REFUSALS.labels(code).inc()
    elif change.kind == "retry":
        metrics.RECOVERY_ATTEMPTS.labels(change.cause or payloads.NO_CAUSE).inc()
    elif change.kind == "identity-finding":
        for finding in change.data.get("findings") or []:
            metrics.IDENTITY_FINDINGS.labels("true" if finding.get("expected") else "false").inc()
