"""The daily usage rollup: one row per (day, namespace, owner, queue, runtime, outcome), added to as each
attempt ends (jobs.usage.services.usage_rollup), with the queue-wait histogram in the same row (a column per
bucket: one pass over the rows answers every figure). A usage query sums these rows, never the attempts (GET
/api/v1/usage). Kept when old attempts' details are pruned."""

from __future__ import annotations

from typing import Any

from django.db import models

from jobs.usage import measure
from jobs.usage.measure import WAIT_BOUNDS

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


def usage_key(job: Any, outcome: str) -> dict[str, str]:
    """An attempt's rollup key but its day: the job's namespace, owner, queue and runtime, and the outcome.
    One definition for the rollup (jobs.usage.services) and for the attempts it has not counted yet
    (jobs.usage.selectors)."""
    return {
        "namespace": job.namespace,
        "owner": job.owner.get_username(),
        "queue": measure.queue_key(job.plan),
        "runtime": measure.runtime_key(job.runtime_kind, job.runtime_namespace, job.runtime_name),
        "outcome": outcome,
    }


def wait_column(bucket: int) -> str:
    """The column counting the queue waits in jobs.usage.measure.WAIT_BOUNDS' bucket `bucket`."""
    return f"wait_{bucket}"


WAIT_COLUMNS = tuple(wait_column(i) for i in range(len(WAIT_BOUNDS) + 1))


class UsageDay(UsageKey):
    gpu_seconds = models.FloatField(default=0)
    gpu_seconds_lost = models.FloatField(default=0)
    cpu_seconds = models.FloatField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    jobs = models.PositiveIntegerField(default=0)  # jobs whose first attempt ended that day
    for _column in WAIT_COLUMNS:  # the queue-wait histogram: attempts that waited up to each bound
        locals()[_column] = models.PositiveIntegerField(default=0)
    del _column

    class Meta:
        constraints = [models.UniqueConstraint(fields=KEY, name="usage_day_key")]
