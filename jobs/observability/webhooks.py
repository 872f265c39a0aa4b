"""Status webhooks: endpoints (subscriptions), the fan-out of changes into deliveries, and sending them.

- An endpoint belongs to a user and receives the changes of their own jobs, or (platform) of every job in a
  namespace. Its secret is shown once, at creation and at each rotation; during a rotation's grace period
  messages carry a signature for the old secret too.
- The fan-out reads the outbox (jobs.observability.feed: numbered in commit order) after each endpoint's
  cursor and records one delivery per change, its webhook-id fixed (`msg_<endpoint>_<seq>`), in one
  transaction with the cursor's move. Nothing is lost when Redis loses its queues: the deliveries and the
  cursors are rows, and the periodic sweep sends whatever is due.
- Per job, in order: a delivery is sent only when no earlier delivery of the same job to the same endpoint is
  still pending (compare-and-set claim), and a delivered one hands over to the next.
- A failed attempt is retried on the schedule WEBHOOK_RETRY_SCHEDULE (exponential, over hours by default);
  when every attempt of a delivery failed, the endpoint is disabled and says why; re-enabling it sends what
  waited, in order.
- Each attempt is counted, and the next one scheduled, by the claim itself, before the POST: a worker that
  dies while sending cannot keep an attempt off the endpoint's count. The POST itself is bounded in time and
  in what it reads (jobs.observability.webhook_send), and runs on the `webhooks` queue's own worker.
- A user has at most WEBHOOK_ENDPOINTS_PER_USER endpoints.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone

from dispatch_site import metrics, roles
from dispatch_site.audit import audit_record
from jobs import enqueue
from jobs.observability import cursors, feed, payloads, signing, webhook_send
from jobs.observability.models import (
    Change,
    DeliveryState,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from jobs.observability.webhook_send import AttemptResult

logger = logging.getLogger(__name__)

FANOUT_BATCH = 1000
CLAIM_SECONDS = 120  # at least; longer than one attempt's whole deadline (_claim_seconds)
COUNTDOWN_MAX = 300  # a retry due within this is sent by a countdown; later ones by the sweep
ALL_NAMESPACES = "*"
# The outcomes of one delivery attempt (dispatch_webhook_deliveries{outcome}).
OUTCOME_DELIVERED, OUTCOME_FAILED, OUTCOME_DISABLED = "delivered", "failed", "disabled"
OUTCOMES = (OUTCOME_DELIVERED, OUTCOME_FAILED, OUTCOME_DISABLED)


class WebhookInputError(ValueError):
    """A bad endpoint request: `field` names what is wrong (a 400 with field errors)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class NotAllowed(PermissionError):
    pass


class TooManyEndpoints(Exception):
    """The owner already has WEBHOOK_ENDPOINTS_PER_USER endpoints: a conflict with what exists (409), not a
    bad field; deleting one makes room."""


# ---------------------------------------------------------------- addresses


def url_problem(url: str, *, resolve: bool = True) -> str:
    """Why dispatch will not POST to this URL, or "". HTTPS only (WEBHOOK_ALLOW_HTTP for tests); never to a
    private, loopback or link-local address (WEBHOOK_ALLOW_PRIVATE_ADDRESSES for tests), checked on every
    send, since a name can resolve differently later."""
    parsed = urlparse(url)
    if parsed.scheme not in ("https", "http") or not parsed.hostname:
        return "must be an https:// URL with a host"
    if parsed.scheme == "http" and not settings.WEBHOOK_ALLOW_HTTP:
        return "must be an https:// URL (plain http is not allowed here)"
    if parsed.username or parsed.password:
        return "must not carry credentials in the URL (sign with the endpoint's secret instead)"
    if settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES or not resolve:
        return ""
    try:
        infos = socket.getaddrinfo(parsed.hostname, parsed.port or 443, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        return f"its host {parsed.hostname!r} does not resolve: {exc}"
    for info in infos:
        if not webhook_send.address_allowed(str(info[4][0])):
            return f"its host {parsed.hostname!r} resolves to {info[4][0]}, a private or local address"
    return ""


# ---------------------------------------------------------------- endpoints


def endpoints_of(user: Any) -> QuerySet[WebhookEndpoint]:
    """The endpoints a user may see and manage: their own; platform: every one."""
    endpoints = WebhookEndpoint.objects.select_related("owner")
    return endpoints if roles.is_platform(user) else endpoints.filter(owner_id=user.pk)


def _check_types(event_types: Iterable[str]) -> list[str]:
    types = list(dict.fromkeys(event_types))
    unknown = [t for t in types if t not in payloads.EVENT_TYPES]
    if unknown:
        raise WebhookInputError(
            "event_types", f"unknown event type {unknown[0]!r}; one of {', '.join(payloads.EVENT_TYPES)}"
        )
    return types


def _check_namespace(user: Any, namespace: str) -> str:
    if namespace and not roles.is_platform(user):
        raise NotAllowed("only the platform role subscribes to a namespace; leave it empty for your own jobs")
    return namespace


def endpoint_create(
    *,
    owner: Any,
    url: str,
    namespace: str = "",
    description: str = "",
    event_types: Sequence[str] = (),
) -> tuple[WebhookEndpoint, str]:
    """A new endpoint and its secret (returned once: only a digest-free copy is kept, to sign with). It
    receives the changes made from now on. A user has at most WEBHOOK_ENDPOINTS_PER_USER endpoints."""
    # Where the host resolves to is checked on every send (a name can point elsewhere later).
    problem = url_problem(url, resolve=False)
    if problem:
        raise WebhookInputError("url", problem)
    types = _check_types(event_types)
    _check_namespace(owner, namespace)
    feed.sequence()
    secret = signing.new_secret()
    with transaction.atomic():
        # The owner's row is the lock: two creates at once count one after the other (one lock order: the
        # user, then their endpoints).
        get_user_model().objects.select_for_update().filter(pk=owner.pk).first()
        cap = int(settings.WEBHOOK_ENDPOINTS_PER_USER)
        if WebhookEndpoint.objects.filter(owner_id=owner.pk).count() >= cap:
            raise TooManyEndpoints(
                f"you have {cap} webhook endpoints, the most one user may have "
                f"(WEBHOOK_ENDPOINTS_PER_USER={cap}): delete one, or subscribe one endpoint to more events"
            )
        endpoint = WebhookEndpoint.objects.create(
            owner=owner,
            url=url,
            namespace=namespace,
            description=description,
            event_types=types,
            secret=secret,
            fanned_seq=feed.latest_seq(),
        )
    audit_record(
        actor=owner,
        action="webhook.create",
        object_type="webhook",
        object_id=str(endpoint.pk),
        details={"url": url, "namespace": namespace, "event_types": types},
    )
    return endpoint, secret


def endpoint_update(
    *,
    actor: Any,
    endpoint: WebhookEndpoint,
    url: str | None = None,
    description: str | None = None,
    event_types: Sequence[str] | None = None,
    active: bool | None = None,
) -> WebhookEndpoint:
    """Change an endpoint. active=False pauses it (deliveries wait); active=True (re)enables it and sends
    what waited, in order, a fresh retry schedule for deliveries that had failed."""
    now = timezone.now()
    fields: dict[str, Any] = {"updated_at": now}
    if url is not None:
        problem = url_problem(url, resolve=False)
        if problem:
            raise WebhookInputError("url", problem)
        fields["url"] = url
    if description is not None:
        fields["description"] = description
    if event_types is not None:
        fields["event_types"] = _check_types(event_types)
    with transaction.atomic():
        if active is True:
            fields |= {"active": True, "disabled_at": None, "disabled_reason": ""}
            WebhookDelivery.objects.filter(endpoint=endpoint, state=DeliveryState.FAILED).update(
                state=DeliveryState.PENDING, attempts=0, next_attempt_at=now, claim_until=None
            )
        elif active is False:
            fields |= {
                "active": False,
                "disabled_at": now,
                "disabled_reason": f"paused by {actor.get_username()}",
            }
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(**fields)
        audit_record(
            actor=actor,
            action="webhook.update",
            object_type="webhook",
            object_id=str(endpoint.pk),
            details={k: v for k, v in fields.items() if k in ("url", "event_types", "active", "description")},
        )
        if active is True:
            transaction.on_commit(enqueue.on_commit_send(enqueue.WEBHOOKS_SWEEP), robust=True)
    endpoint.refresh_from_db()
    return endpoint


def endpoint_rotate_secret(*, actor: Any, endpoint: WebhookEndpoint, revoke_previous: bool = False) -> str:
    """A new secret (returned once). The old one keeps signing, beside it, for WEBHOOK_SECRET_GRACE_SECONDS,
    so the receiver can switch without losing a message; with revoke_previous (a leaked secret) it signs
    nothing more from now on, and neither does one still in its grace period."""
    secret = signing.new_secret()
    now = timezone.now()
    if revoke_previous:
        previous: dict[str, Any] = {"previous_secret": "", "previous_secret_until": None}
    else:
        until = now + timedelta(seconds=settings.WEBHOOK_SECRET_GRACE_SECONDS)
        previous = {"previous_secret": F("secret"), "previous_secret_until": until}
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret=secret, updated_at=now, **previous)
    audit_record(
        actor=actor,
        action="webhook.rotate-secret",
        object_type="webhook",
        object_id=str(endpoint.pk),
        details={"previous_revoked": revoke_previous},
    )
    endpoint.refresh_from_db()
    return secret


def endpoint_delete(*, actor: Any, endpoint: WebhookEndpoint) -> None:
    audit_record(
        actor=actor,
        action="webhook.delete",
        object_type="webhook",
        object_id=str(endpoint.pk),
        details={"url": endpoint.url},
    )
    endpoint.delete()


def signing_secrets(endpoint: WebhookEndpoint, now: datetime) -> list[str]:
    secrets_ = [endpoint.secret]
    if endpoint.previous_secret and endpoint.previous_secret_until and endpoint.previous_secret_until > now:
        secrets_.append(endpoint.previous_secret)
    return secrets_


# ---------------------------------------------------------------- fan-out


def owner_may_receive(endpoint: WebhookEndpoint) -> bool:
    """An endpoint delivers only with its owner's authority as it stands now: an active owner, and for a
    namespace subscription (which only the platform role may make) that role still held. A demoted or
    deactivated owner's endpoint receives nothing: changes made meanwhile are skipped, not kept for later."""
    owner = endpoint.owner
    if not owner.is_active:
        return False
    return not endpoint.namespace or roles.is_platform(owner)


def _scope(endpoint: WebhookEndpoint) -> QuerySet[Change]:
    changes = Change.objects.all()
    if endpoint.namespace == ALL_NAMESPACES:
        pass
    elif endpoint.namespace:
        changes = changes.filter(namespace=endpoint.namespace)
    else:
        changes = changes.filter(owner_id=endpoint.owner_id)
    if endpoint.event_types:
        changes = changes.filter(type__in=endpoint.event_types)
    return changes


def _payload(change: Change, cursor: str) -> dict[str, Any]:
    return payloads.feed_item(
        cursor=cursor,
        job_id=change.job_id,
        namespace=change.namespace,
        kind=change.kind,
        type_=change.type,
        from_state=change.from_state,
        to_state=change.to_state,
        cause=change.cause,
        attempt=change.attempt,
        at=change.at,
        data=change.data,
    )


def _delivery(endpoint: WebhookEndpoint, change: Change, now: datetime) -> WebhookDelivery:
    seq = int(change.seq or 0)
    # Sealed for the owner: neither the message id nor its cursor says anything of others' activity.
    cursor = cursors.seal(seq, endpoint.owner_id)
    return WebhookDelivery(
        endpoint=endpoint,
        change=change,
        job_id=change.job_id,
        seq=seq,
        msg_id=f"msg_{endpoint.pk}_{cursor}",
        event_type=change.type,
        payload=payloads.message_body(change.type, change.at, _payload(change, cursor)),
        next_attempt_at=now,
    )


def fanout() -> int:
    """Record a delivery for every new change each endpoint subscribes to; enqueue the ones due at the head
    of their job's line. Returns how many deliveries it recorded."""
    feed.sequence()
    top = feed.latest_seq()
    made = 0
    heads: set[tuple[int, str]] = set()
    for endpoint_id in WebhookEndpoint.objects.filter(fanned_seq__lt=top).values_list("pk", flat=True):
        while True:
            with transaction.atomic():
                endpoint = (
                    WebhookEndpoint.objects.select_for_update(of=("self",))
                    .select_related("owner")
                    .filter(pk=endpoint_id)
                    .first()
                )
                if endpoint is None or endpoint.fanned_seq >= top:
                    break
                if not owner_may_receive(endpoint):
                    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(fanned_seq=top)
                    break
                rows = list(
                    _scope(endpoint)
                    .filter(seq__gt=endpoint.fanned_seq, seq__lte=top)
                    .order_by("seq")[:FANOUT_BATCH]
                )
                now = timezone.now()
                WebhookDelivery.objects.bulk_create(
                    [_delivery(endpoint, change, now) for change in rows],
                    ignore_conflicts=True,
                )
                done = len(rows) < FANOUT_BATCH
                moved_to = top if done else int(rows[-1].seq or top)
                WebhookEndpoint.objects.filter(pk=endpoint.pk).update(fanned_seq=moved_to)
                made += len(rows)
                if endpoint.active:
                    heads |= {(endpoint.pk, change.job_id) for change in rows}
            if done:
                break
    for endpoint_id, job_id in heads:
        head = _head(endpoint_id, job_id)
        if head is not None:
            enqueue.send(enqueue.WEBHOOK_DELIVER, head)
    return made


def _earlier_pending() -> Exists:
    return Exists(
        WebhookDelivery.objects.filter(
            endpoint_id=OuterRef("endpoint_id"),
            job_id=OuterRef("job_id"),
            seq__lt=OuterRef("seq"),
            state=DeliveryState.PENDING,
        )
    )


def _head(endpoint_id: int, job_id: str) -> int | None:
    """The oldest pending delivery of a job to an endpoint: the only one that may be sent now."""
    pk: int | None = (
        WebhookDelivery.objects.filter(endpoint_id=endpoint_id, job_id=job_id, state=DeliveryState.PENDING)
        .order_by("seq")
        .values_list("pk", flat=True)
        .first()
    )
    return pk


# ---------------------------------------------------------------- sending


INTERRUPTED = (
    "no outcome recorded: the attempt is in flight, or its worker stopped while sending (it counts as a "
    "failed attempt)"
)


def _claim_seconds() -> float:
    """A claim outlives its attempt (the whole deadline) with room to record the outcome."""
    return max(CLAIM_SECONDS, float(settings.WEBHOOK_TIMEOUT_SECONDS) + 60)


@dataclass(frozen=True)
class Claim:
    delivery: WebhookDelivery
    attempt: WebhookAttempt
    claim_until: datetime


def _claimable(delivery_id: int, now: datetime) -> QuerySet[WebhookDelivery]:
    """Pending, due, at the head of its job's line, its endpoint active, and nobody else sending it."""
    return (
        WebhookDelivery.objects.filter(
            pk=delivery_id,
            state=DeliveryState.PENDING,
            next_attempt_at__lte=now,
            endpoint__active=True,
        )
        .filter(Q(claim_until__isnull=True) | Q(claim_until__lt=now))
        .filter(~_earlier_pending())
    )


def _claim(delivery_id: int, now: datetime) -> Claim | None:
    """Compare-and-set on (state, attempts, claim): the attempt is counted, and the next one scheduled, in the
    claim itself, before anything is sent. A worker that dies mid-send leaves an attempt that counts against
    the endpoint and a delivery due again on the schedule once the claim expires. A delivery whose schedule
    was spent that way (its last attempt never came back) fails here, and its endpoint is disabled."""
    found = _claimable(delivery_id, now).values_list("attempts", flat=True).first()
    if found is None:
        return None
    attempts = int(found)
    schedule = retry_schedule()
    free = Q(claim_until__isnull=True) | Q(claim_until__lt=now)
    if attempts > len(schedule):
        _give_up(delivery_id, attempts, now, free)
        return None
    number = attempts + 1
    claim_until = now + timedelta(seconds=_claim_seconds())
    last = number > len(schedule)
    due_again = claim_until if last else now + timedelta(seconds=float(schedule[number - 1]))
    with transaction.atomic():
        taken = (
            WebhookDelivery.objects.filter(pk=delivery_id, state=DeliveryState.PENDING, attempts=attempts)
            .filter(free)
            .update(
                claim_until=claim_until,
                attempts=number,
                next_attempt_at=due_again,
                last_status=None,
                last_error=INTERRUPTED,
            )
        )
        if taken != 1:
            return None
        attempt = WebhookAttempt.objects.create(
            delivery_id=delivery_id, number=number, at=now, status_code=None, latency_ms=0, error=INTERRUPTED
        )
    delivery = WebhookDelivery.objects.select_related("endpoint").get(pk=delivery_id)
    return Claim(delivery=delivery, attempt=attempt, claim_until=claim_until)


def _give_up(delivery_id: int, attempts: int, now: datetime, free: Q) -> None:
    with transaction.atomic():
        failed = (
            WebhookDelivery.objects.filter(pk=delivery_id, state=DeliveryState.PENDING, attempts=attempts)
            .filter(free)
            .update(state=DeliveryState.FAILED, claim_until=None)
        )
        if failed == 1:
            delivery = WebhookDelivery.objects.get(pk=delivery_id)
            _disable(delivery, delivery.endpoint_id, attempts, now, delivery.last_error or INTERRUPTED)


def retry_schedule() -> list[float]:
    return list(settings.WEBHOOK_RETRY_SCHEDULE)


def delivery_send(*, delivery_id: int) -> None:
    """One attempt at one delivery (see the module docstring); the task calls it with the primary key. The
    attempt is recorded before the POST (see _claim), its outcome after it."""
    now = timezone.now()
    claim = _claim(delivery_id, now)
    if claim is None:
        return
    delivery, endpoint = claim.delivery, claim.delivery.endpoint
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True)
    headers = signing.headers(signing_secrets(endpoint, now), delivery.msg_id, int(now.timestamp()), body)
    headers["User-Agent"] = "dispatch-webhooks/1"
    # The addresses are judged by the connection itself (webhook_send.CheckedResolver), inside the deadline.
    problem = url_problem(endpoint.url, resolve=False)
    if not owner_may_receive(endpoint):
        result = AttemptResult(
            status=None,
            latency_ms=0,
            error="not sent: its owner no longer may receive it (deactivated, or no longer platform for a "
            "namespace subscription)",
        )
    elif problem:
        result = AttemptResult(status=None, latency_ms=0, error=f"not sent: the URL {problem}")
    else:
        result = webhook_send.post(
            endpoint.url,
            body,
            headers,
            deadline=float(settings.WEBHOOK_TIMEOUT_SECONDS),
            cafile=settings.WEBHOOK_CA_BUNDLE,
            allow_private=settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES,
        )
    metrics.WEBHOOK_DELIVERY_SECONDS.observe(result.latency_ms / 1000)
    _record(claim, result)


def _record(claim: Claim, result: AttemptResult) -> None:
    """The outcome of the attempt _claim recorded. Only while the claim is still this attempt's: one that
    outlived its claim (another sender took the delivery over) records its own attempt row, nothing else."""
    delivery, endpoint = claim.delivery, claim.delivery.endpoint
    now = timezone.now()
    number = delivery.attempts
    schedule = retry_schedule()
    countdown: float | None = None
    with transaction.atomic():
        WebhookAttempt.objects.filter(pk=claim.attempt.pk).update(
            status_code=result.status, latency_ms=result.latency_ms, error=result.error
        )
        mine = WebhookDelivery.objects.filter(
            pk=delivery.pk, state=DeliveryState.PENDING, attempts=number, claim_until=claim.claim_until
        )
        common = {
            "last_status": result.status,
            "last_latency_ms": result.latency_ms,
            "last_error": result.error,
            "claim_until": None,
        }
        if result.ok:
            if mine.update(state=DeliveryState.DELIVERED, delivered_at=now, **common):
                metrics.WEBHOOK_DELIVERIES.labels(OUTCOME_DELIVERED).inc()
                transaction.on_commit(lambda: _send_head(endpoint.pk, delivery.job_id), robust=True)
        elif number > len(schedule):
            if mine.update(state=DeliveryState.FAILED, **common):
                _disable(delivery, endpoint.pk, number, now, _outcome(result))
        elif mine.update(**common):
            metrics.WEBHOOK_DELIVERIES.labels(OUTCOME_FAILED).inc()
            delay = float(schedule[number - 1])
            countdown = delay if delay <= COUNTDOWN_MAX else None
        if countdown is not None:
            transaction.on_commit(
                lambda: enqueue.send(enqueue.WEBHOOK_DELIVER, delivery.pk, countdown=countdown), robust=True
            )


def _disable(delivery: WebhookDelivery, endpoint_id: int, attempts: int, now: datetime, last: str) -> None:
    reason = (
        f"disabled at {now:%Y-%m-%d %H:%M:%S} UTC: message {delivery.msg_id} ({delivery.event_type}, "
        f"job {delivery.job_id}) failed {attempts} attempts since "
        f"{delivery.created_at:%Y-%m-%d %H:%M:%S}; "
        f"the last one: {last}. Fix the receiver, then enable the endpoint again: what "
        "waited is sent in order."
    )
    WebhookEndpoint.objects.filter(pk=endpoint_id, active=True).update(
        active=False, disabled_at=now, disabled_reason=reason, updated_at=now
    )
    metrics.WEBHOOK_DELIVERIES.labels(OUTCOME_DISABLED).inc()
    logger.warning("webhook endpoint %s %s", endpoint_id, reason)


def _send_head(endpoint_id: int, job_id: str) -> None:
    head = _head(endpoint_id, job_id)
    if head is not None:
        enqueue.send(enqueue.WEBHOOK_DELIVER, head)


def _outcome(result: AttemptResult) -> str:
    if result.status is None:
        return result.error or "no answer"
    text = f"HTTP {result.status}"
    return f"{text}: {result.error[:200]}" if result.error else text


def sweep(*, limit: int = 500) -> int:
    """The periodic safety net: fan out, then enqueue every delivery that is due and at the head of its job's
    line (lost task messages, retries further out than a countdown). Returns how many it enqueued."""
    fanout()
    now = timezone.now()
    due = list(
        WebhookDelivery.objects.filter(
            state=DeliveryState.PENDING, next_attempt_at__lte=now, endpoint__active=True
        )
        .filter(Q(claim_until__isnull=True) | Q(claim_until__lt=now))
        .filter(~_earlier_pending())
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    for pk in due:
        enqueue.send(enqueue.WEBHOOK_DELIVER, pk)
    return len(due)
