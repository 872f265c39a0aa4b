"""The daily usage rollup: one row per (day, namespace, owner, queue, runtime, outcome), added to as each
attempt ends (jobs.usage.services.usage_rollup), and the queue-wait histogram under the same key. A usage
query sums these rows, never the attempts (GET /api/v1/usage). Kept when old attempts' details are pruned."""

from __future__ import annotations

from django.db import models

KEY = ("day", "namespace", "owner", "queue", "runtime", "outcome")


class UsageKey(models.Model):
    day = models.DateField()  # the UTC day the attempt ended
    namespace = models.CharField(max_length=63)
    owner = models.CharField(max_length=150)  # the job owner's username
    queue = models.CharField(max_length=253, blank=True, default="")  # Kueue LocalQueue; "" without Kueue
    runtime = models.CharField(max_length=400)  # kind/name or kind/namespace/name
    outcome = models.CharField(max_length=32)  # the attempt's cause, or its state (succeeded)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.day} {self.namespace} {self.owner} {self.queue or '-'} {self.runtime} {self.outcome}"


class UsageDay(UsageKey):
    gpu_seconds = models.FloatField(default=0)
    gpu_seconds_lost = models.FloatField(default=0)
    cpu_seconds = models.FloatField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    jobs = models.PositiveIntegerField(default=0)  # jobs whose first attempt ended that day

    class Meta:
        constraints = [models.UniqueConstraint(fields=KEY, name="usage_day_key")]


class UsageWait(UsageKey):
    bucket = models.PositiveSmallIntegerField()  # jobs.usage.measure.WAIT_BOUNDS' index
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=(*KEY, "bucket"), name="usage_wait_key")]
