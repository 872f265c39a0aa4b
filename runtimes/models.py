"""The platform-curated allow-list, the verdict history per runtime, and the site settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from dispatch_site.names import DEFAULT_LABEL_DOMAIN
from runtimes.reasons import REVIEW_CONTENT, REVIEW_MISSING, REVIEW_NAME, REVIEW_STALE, Review
from runtimes.settings_checks import DEFAULT_TRAINER_VERSION


class RuntimeKind(models.TextChoices):
    CLUSTER = "ClusterTrainingRuntime", "ClusterTrainingRuntime"
    NAMESPACED = "TrainingRuntime", "TrainingRuntime"


def runtime_ref(kind: str, namespace: str, name: str) -> str:
    """How a runtime is named in messages and the audit log: Kind/name or Kind/namespace/name."""
    return f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"


class ReviewState(models.TextChoices):
    CONTENT = REVIEW_CONTENT, "the spec as reviewed is recorded"
    NAME = REVIEW_NAME, "by name only (written in code, never by the service)"
    MISSING = REVIEW_MISSING, "not reviewed: the runtime could not be read when it was added"
    STALE = REVIEW_STALE, "reviewed before reviews covered labels and annotations: re-approve it"


class AllowListEntry(models.Model):
    kind = models.CharField(max_length=32, choices=RuntimeKind.choices)
    namespace = models.CharField(max_length=63, blank=True, default="")  # "" for a ClusterTrainingRuntime
    name = models.CharField(max_length=253)
    for_jobs = models.BooleanField(default=True)
    for_sessions = models.BooleanField(default=False)
    note = models.TextField(blank=True, default="")
    added_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    added_at = models.DateTimeField(auto_now_add=True)
    # What was reviewed: the runtime's spec, its behaviour-changing labels and annotations, and their digest
    # (runtimes.digest.review_digest), recorded when the entry is added and each time a platform user
    # re-approves it. A runtime that no longer has the digest is refused (runtime-changed-since-review).
    # Entries from before reviews covered all of it are "stale": refused until re-approved.
    review = models.CharField(max_length=16, choices=ReviewState.choices, default=ReviewState.NAME)
    reviewed_hash = models.CharField(max_length=64, blank=True, default="")
    reviewed_spec = models.JSONField(null=True, blank=True)
    reviewed_metadata = models.JSONField(null=True, blank=True)  # runtimes.digest.reviewed_metadata
    reviewed_at = models.DateTimeField(null=True, blank=True)
    reviewed_by = models.CharField(max_length=150, blank=True, default="")  # the reviewer's username

    class Meta:
        ordering = ["kind", "namespace", "name"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "namespace", "name"], name="allow_list_unique_runtime"),
        ]

    def __str__(self) -> str:
        return self.ref

    @property
    def ref(self) -> str:
        return runtime_ref(self.kind, self.namespace, self.name)

    @property
    def purposes(self) -> list[str]:
        return [p for p, yes in (("jobs", self.for_jobs), ("sessions", self.for_sessions)) if yes]

    def as_review(self) -> Review:
        """What the rule checker compares the runtime with (runtimes.rules.check_runtime(review=...))."""
        who = self.reviewed_by or "dispatch"
        when = f" at {self.reviewed_at:%Y-%m-%d %H:%M} UTC" if self.reviewed_at else ""
        return Review(
            state=self.review,
            spec_hash=self.reviewed_hash,
            spec=self.reviewed_spec,
            reviewed=f"reviewed by {who}{when}" if self.reviewed_at else "",
            metadata=self.reviewed_metadata,
        )


class RuntimeVerdict(models.Model):
    """One row each time a runtime's verdict (or the runtime itself) changed, newest last."""

    kind = models.CharField(max_length=32, choices=RuntimeKind.choices)
    namespace = models.CharField(max_length=63, blank=True, default="")
    name = models.CharField(max_length=253)
    refused = models.BooleanField()
    verdict = models.JSONField()  # runtimes.rules.Verdict.to_dict()
    resource_version = models.CharField(max_length=64, blank=True, default="")
    generation = models.BigIntegerField(null=True)
    runtime = models.JSONField(null=True)  # the object as it was checked; None when it did not exist
    checked_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-checked_at", "-id"]
        indexes = [models.Index(fields=["kind", "namespace", "name", "-checked_at"])]

    def __str__(self) -> str:
        verdict = "refused" if self.refused else "accepted"
        return f"{runtime_ref(self.kind, self.namespace, self.name)}: {verdict}"

    @property
    def codes(self) -> list[str]:
        return [r["code"] for r in self.verdict.get("reasons", [])]


class PublishVia(models.TextChoices):
    ENV = "env", "env (container node)"
    INIT_CONTAINER = "initContainer", "initContainer"


DEFAULT_MAX_OPEN_SESSIONS = 5
MAX_OPEN_SESSIONS_LIMIT = 100


class SiteSettings(models.Model):
    """One row (pk=1): the site-wide rules every runtime and job is checked against."""

    allow_rank_restart = models.BooleanField(default=False)
    publish_via = models.CharField(max_length=16, choices=PublishVia.choices, default=PublishVia.ENV)
    publish_container = models.CharField(max_length=63, blank=True, default="")
    label_domain = models.CharField(max_length=253, default=DEFAULT_LABEL_DOMAIN)
    trainer_version = models.CharField(max_length=32, default=DEFAULT_TRAINER_VERSION)
    # The site's recovery policy (jobs.recovery): overrides of the built-in default; a job may override it.
    recovery_policy = models.JSONField(default=dict, blank=True)
    # Kueue, per namespace ("*": every namespace without its own entry): the LocalQueue a job without a
    # queue_name joins ({namespace: queue}), and the WorkloadPriorityClasses a job may ask for
    # ({namespace: [class, ...]}; none allowed where nothing is listed). jobs.queueing reads them.
    kueue_default_queues = models.JSONField(default=dict, blank=True)
    kueue_priority_classes = models.JSONField(default=dict, blank=True)
    # Sessions (starting or running) one user may hold at once: each holds a pod and its resources.
    max_open_sessions_per_user = models.PositiveIntegerField(
        default=DEFAULT_MAX_OPEN_SESSIONS,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_OPEN_SESSIONS_LIMIT)],
        help_text="sessions (starting or running) one user may hold at once",
    )
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return "site settings"

    @classmethod
    def load(cls) -> SiteSettings:
        obj, _ = cls.objects.get_or_create(pk=1)
        return obj

    def as_dict(self) -> dict[str, Any]:
        return {
            "allow_rank_restart": self.allow_rank_restart,
            "publish_via": self.publish_via,
            "publish_container": self.publish_container,
            "label_domain": self.label_domain,
            "trainer_version": self.trainer_version,
            "recovery_policy": self.recovery_policy,
            "kueue_default_queues": self.kueue_default_queues,
            "kueue_priority_classes": self.kueue_priority_classes,
            "max_open_sessions_per_user": self.max_open_sessions_per_user,
        }
