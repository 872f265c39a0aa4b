"""Recovery policies as data. Pure.

A policy says, per cause, how many times a failed execution may be followed by a new one (attempt A+1) and
how long to wait first; two budgets cap all retries of infrastructure causes (preempted, node-lost, evicted,
no-capacity) and of user causes (app-error, oom, config-error). Nothing restarts natively: the supervisor
starts a new TrainJob, and every attempt stays visible. `cancelled`, `identity-violation`, `runtime-missing`
and `unknown-failure` are never retried.

    {"retry": {"preempted": 3, "node-lost": 3, "app-error": 0},
     "backoff_seconds": {"preempted": 10},
     "budgets": {"infrastructure": 3, "user": 0}}

The job's `recovery_policy` (submission body) overrides the site's default per key; the result is stored on
the job and shown by plan.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dispatch_site.causes import FAILURE_CAUSES, MAX_BACKOFF_SECONDS, RETRYABLE_CAUSES

INFRASTRUCTURE: Final = "infrastructure"
USER: Final = "user"
BUDGET_OF: Final[dict[str, str]] = {
    "preempted": INFRASTRUCTURE,
    "node-lost": INFRASTRUCTURE,
    "cluster-lost": INFRASTRUCTURE,
    "evicted": INFRASTRUCTURE,
    "no-capacity": INFRASTRUCTURE,
    "app-error": USER,
    "oom": USER,
    "config-error": USER,
}
NEVER_RETRIED: Final = frozenset(c for c in (*FAILURE_CAUSES, "unknown-failure") if c not in RETRYABLE_CAUSES)
DEFAULT_BACKOFF_SECONDS: Final = 10

# The built-in default under the site's: retry what the infrastructure did to a job, never what the job did
# to itself.
DEFAULT_POLICY: Final[dict[str, Any]] = {
    "retry": {
        "preempted": 3,
        "node-lost": 3,
        "cluster-lost": 3,
        "evicted": 3,
        "no-capacity": 0,
        "app-error": 0,
        "oom": 0,
    },
    "backoff_seconds": {},
    "budgets": {INFRASTRUCTURE: 3, USER: 0},
}


def resolve(site_default: Mapping[str, Any] | None, override: Mapping[str, Any] | None) -> dict[str, Any]:
    """The effective policy: the built-in default, then the site's, then the job's, merged per key."""
    policy = copy.deepcopy(DEFAULT_POLICY)
    for layer in (site_default or {}, override or {}):
        for key in ("retry", "backoff_seconds", "budgets"):
            policy[key].update(layer.get(key) or {})
    return policy


@dataclass(frozen=True)
class Decision:
    retry: bool
    backoff_seconds: int
    why: str


def decide(policy: Mapping[str, Any], earlier_causes: Sequence[str], cause: str) -> Decision:
    """Start attempt A+1 after attempt A failed with `cause`? `earlier_causes` are the causes of the attempts
    before A (A's own cause is `cause`)."""
    if cause in NEVER_RETRIED or not cause:
        return Decision(False, 0, f"{cause or 'this failure'} is never retried")
    allowed = int((policy.get("retry") or {}).get(cause, 0))
    used = sum(1 for c in earlier_causes if c == cause)
    if used >= allowed:
        return Decision(False, 0, f"{cause}: {used} of {allowed} retries used")
    budget = BUDGET_OF.get(cause)
    budget_note = ""
    if budget is not None:
        budget_allowed = int((policy.get("budgets") or {}).get(budget, 0))
        budget_used = sum(1 for c in earlier_causes if BUDGET_OF.get(c) == budget)
        if budget_used >= budget_allowed:
            return Decision(False, 0, f"{budget} budget: {budget_used} of {budget_allowed} retries used")
        budget_note = f", {budget} budget {budget_used + 1} of {budget_allowed}"
    base = int((policy.get("backoff_seconds") or {}).get(cause, DEFAULT_BACKOFF_SECONDS))
    backoff = min(base * 2**used, MAX_BACKOFF_SECONDS)
    return Decision(True, backoff, f"{cause}: retry {used + 1} of {allowed}{budget_note}")
