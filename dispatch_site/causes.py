"""The typed causes of a job's state (DESIGN.md, Status), and the bounds of a recovery policy over them.

One definition for every layer: the site settings (a default recovery policy), the supervisor, the API and the
pages name causes from here. `Cause` is a plain enum of strings (Django's TextChoices, so model fields and
forms take it as their choices); nothing here touches the database.
"""

from __future__ import annotations

from typing import Final

from django.db import models


class Cause(models.TextChoices):
    PREEMPTED = "preempted"
    NODE_LOST = "node-lost"
    CLUSTER_LOST = "cluster-lost"  # the MultiKueue worker running the attempt was lost (issue 35)
    OOM = "oom"
    TIMEOUT = "timeout"
    NO_CAPACITY = "no-capacity"
    IMAGE_PULL = "image-pull"
    EVICTED = "evicted"
    CONFIG_ERROR = "config-error"
    APP_ERROR = "app-error"
    RUNTIME_MISSING = "runtime-missing"
    IDENTITY_VIOLATION = "identity-violation"
    CANCELLED = "cancelled"
    UNKNOWN_FAILURE = "unknown-failure"  # nothing explains the failure: the raw conditions are kept


# Recovery budgets (DESIGN.md): infrastructure causes retry from one budget, user causes from another.
INFRA_CAUSES: Final = frozenset(
    {Cause.PREEMPTED, Cause.NODE_LOST, Cause.CLUSTER_LOST, Cause.EVICTED, Cause.NO_CAPACITY}
)
USER_CAUSES: Final = frozenset({Cause.APP_ERROR, Cause.OOM, Cause.CONFIG_ERROR})

RECOVERY_POLICY_PARTS: Final = ("retry", "backoff_seconds", "budgets")

# The causes a recovery policy may name: every cause that evidence explains (not `unknown-failure`).
FAILURE_CAUSES: Final[tuple[str, ...]] = tuple(str(c) for c in Cause if c != Cause.UNKNOWN_FAILURE)
# `cancelled` is a person's decision and `identity-violation` means the promise was already broken: neither
# is retried automatically.
RETRYABLE_CAUSES: Final[tuple[str, ...]] = tuple(
    c for c in FAILURE_CAUSES if c not in (Cause.CANCELLED, Cause.IDENTITY_VIOLATION)
)
MAX_RETRIES: Final = 10
MAX_BACKOFF_SECONDS: Final = 3600
