"""The change feed's outbox and status webhooks.

Change: one row per job change, written by a signal in the same transaction as the change itself (a JobEvent
row, or a new job): nothing a transaction commits is missing from it, whatever happens to Redis or a worker.
Its `seq` is given after the commit by the sequencer (jobs.observability.feed.sequence), in the order rows
became visible: an id is handed out when a row is inserted, so a later id can commit first, and a reader that
followed ids would skip the earlier one for good. A seq is only ever given to committed rows, each larger
than every seq given before, so `seq > cursor` never misses a row.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from dispatch_site.encrypted import EncryptedTextField


class Change(models.Model):
    seq = models.BigIntegerField(null=True, blank=True, unique=True)
    # job and owner: indexed by change_job_seq and change_owner_seq (their leading column).
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="+", db_index=False)
    event = models.ForeignKey(
        "jobs.JobEvent", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    # Copied from the job, so the feed filters by who may see it without a join.
    namespace = models.CharField(max_length=63)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    kind = models.CharField(max_length=32)  # submitted, or the JobEvent's kind
    type = models.CharField(max_length=40)  # the webhook event type (jobs.observability.payloads)
    from_state = models.CharField(max_length=16, blank=True, default="")
    to_state = models.CharField(max_length=16, blank=True, default="")
    cause = models.CharField(max_length=32, blank=True, default="")
    attempt = models.PositiveIntegerField(null=True, blank=True)
    at = models.DateTimeField()
    data = models.JSONField(default=dict, blank=True)  # message, rank, exit code, evidence summary, ...

    class Meta:
        indexes = [
            # The sequencer reads the rows that have no seq yet, in insertion order.
            models.Index(fields=["id"], name="change_unsequenced", condition=Q(seq__isnull=True)),
            models.Index(fields=["owner", "seq"], name="change_owner_seq"),
            models.Index(fields=["namespace", "seq"], name="change_namespace_seq"),
            models.Index(fields=["job", "seq"], name="change_job_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind} #{self.seq}"


class WebhookEndpoint(models.Model):
    """Where a user's job events are POSTed. `namespace` empty: the owner's own jobs; a namespace (platform
    only): every job in it ("*": every job)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=200, blank=True, default="")
    namespace = models.CharField(max_length=63, blank=True, default="")
    event_types = models.JSONField(default=list, blank=True)  # [] = every type
    # The signing secret ("whsec_" + base64), shown once; during a rotation the previous one signs too, until
    # previous_secret_until.
    # Encrypted at rest (dispatch_site.encrypted: keys from SECRET_KEY and SECRET_KEY_FALLBACKS).
    secret = EncryptedTextField()
    previous_secret = EncryptedTextField(blank=True, default="")
    previous_secret_until = models.DateTimeField(null=True, blank=True)
    active = models.BooleanField(default=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.TextField(blank=True, default="")
    # The fan-out's cursor: changes up to this seq have their deliveries (created at subscription: only
    # changes after it are sent).
    fanned_seq = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.pk} {self.url}"


class DeliveryState(models.TextChoices):
    PENDING = "pending"  # to be sent (again) at next_attempt_at
    DELIVERED = "delivered"
    FAILED = "failed"  # every attempt of the schedule failed (the endpoint was disabled)


class WebhookDelivery(models.Model):
    """One change for one endpoint: its message (webhook-id `msg_id`, the same on every attempt)."""

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    change = models.ForeignKey(Change, on_delete=models.CASCADE, related_name="+")
    job_id = models.CharField(max_length=16)
    seq = models.BigIntegerField()
    msg_id = models.CharField(max_length=64, unique=True)
    event_type = models.CharField(max_length=40)
    payload = models.JSONField()
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    claim_until = models.DateTimeField(null=True, blank=True)
    last_status = models.IntegerField(null=True, blank=True)
    last_latency_ms = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-seq"]
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "change"], name="delivery_unique_change"),
        ]
        indexes = [
            # Per-job order: the oldest undelivered message of (endpoint, job) goes first.
            models.Index(fields=["endpoint", "job_id", "seq"], name="delivery_endpoint_job_seq"),
            models.Index(fields=["next_attempt_at"], name="delivery_due", condition=Q(state="pending")),
            models.Index(fields=["endpoint", "-seq"], name="delivery_endpoint_newest"),
        ]

    def __str__(self) -> str:
        return self.msg_id


class WebhookAttempt(models.Model):
    """Every attempt of every delivery: when, the HTTP status (none when no answer came), how long it took."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    at = models.DateTimeField()
    status_code = models.IntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField()
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["delivery", "number"]

    def __str__(self) -> str:
        return f"{self.delivery_id} #{self.number}"


class JobCount(models.Model):
    """Jobs per (state, cause, namespace), so a scrape reads a few hundred rows however many jobs there are.

    On PostgreSQL, triggers on the jobs table (migration 0001) append a JobCountDelta row (+1/-1) for every
    insert, delete and change of state, cause or namespace, in the transaction that made it; the compaction
    (jobs.observability.collector.compact_job_counts, every 30 s from beat) folds them into these rows. A
    scrape adds both. Appending, not updating one row per state, keeps concurrent writers off a shared hot
    row."""

    state = models.CharField(max_length=16)
    cause = models.CharField(max_length=32, blank=True, default="")
    namespace = models.CharField(max_length=63)
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["state", "cause", "namespace"], name="jobcount_unique_key"),
        ]

    def __str__(self) -> str:
        return f"{self.state}/{self.cause}/{self.namespace}: {self.n}"


class JobCountDelta(models.Model):
    state = models.CharField(max_length=16)
    cause = models.CharField(max_length=32, blank=True, default="")
    namespace = models.CharField(max_length=63)
    n = models.IntegerField()

    def __str__(self) -> str:
        return f"{self.state}/{self.cause}/{self.namespace}: {self.n:+d}"
