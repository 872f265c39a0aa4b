"""What each job's plan meant, and whether the job as the API shows it matches (pure: the expected outcome
does not come from the code under test)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from scripts.chaoslib.plan import (
    APP_ERROR,
    KUEUE_HIGH,
    KUEUE_LOW,
    LONG,
    POLICIES,
    SUCCEEDS,
    expected_policy,
)

INFRASTRUCTURE_CAUSES: Final = ("preempted", "node-lost", "evicted", "no-capacity")
TERMINAL: Final = ("succeeded", "failed", "cancelled", "refused")


@dataclass(frozen=True)
class Hit:
    """A disruption this run made to one attempt of a job: dispatch should see `cause`."""

    fault: str
    cause: str
    attempt: int
    at: float
    pod: str = ""
    message: str = ""  # what the attempt's message must name (a Kueue eviction's reason), when set


def retried(policy: Mapping[str, Any], earlier: Sequence[str], cause: str) -> bool:
    """Whether the policy (the harness's: plan.expected_policy) starts A+1 after a failure with `cause`, given
    the causes of the attempts before. The documented semantics (jobs/recovery.py's docstring, DESIGN.md),
    written out here so the expectation does not come from the code under test."""
    allowed = int((policy.get("retry") or {}).get(cause, 0))
    if sum(1 for c in earlier if c == cause) >= allowed:
        return False
    if cause in INFRASTRUCTURE_CAUSES:
        budget = int((policy.get("budgets") or {}).get("infrastructure", 0))
        if sum(1 for c in earlier if c in INFRASTRUCTURE_CAUSES) >= budget:
            return False
    return True


SEEN_WITHIN: Final = 30.0  # seconds dispatch may take to notice a disruption and start A+1 (a cycle is 10 s)

# How long after a worker dies holding a start dispatch may go on not knowing that the attempt was created
# (docs/reliability.md, "One start at a time"): the dead delivery's claim runs for its lease (120 s,
# jobs/submission/claim.py SUBMIT_LEASE_SECONDS), then the stale sweep (every 60 s) enqueues the start again,
# which finds the TrainJob under its name and records it. Written out here, as the policy semantics are, so
# the expectation does not come from the code under test: a dispatch slower than that still shows as a
# mismatch. Seed 1 at 81ecc66: a worker was killed holding the start of a job whose rank was then on the lost
# node; the TrainJob ran, dispatch read the job `pending` until its cancel 130 s later (10 s after the lease
# ran out, 30 s before the next sweep), so the node loss never reached an attempt dispatch knew of.
START_RECOVERY_SECONDS: Final = 120.0 + 60.0


def expected_outcomes(
    *,
    kind: str,
    fail_rank: int | None,
    policy: Mapping[str, Any],
    hits: Iterable[Hit],
    cancel: str | None,
    cancel_at: float | None = None,
    plane_outage: bool = False,
    unseen_until: Mapping[int, float] | None = None,
) -> list[dict[str, Any]]:
    """What the job's plan meant, as alternatives (any one matching is a match). Pure.

    `cancel`: None (no cancel), "accepted" (202), "refused" (409: the job had already ended), "unknown" (no
    answer we could read: the cancel may or may not have landed). A hit's `at` is when the disruption took
    effect (the pod gone). A cancel accepted at `cancel_at` ends the job `cancelled`; the hits that took
    effect SEEN_WITHIN before it must show on their attempts, and one the policy does not retry should have
    ended the job first (then the cancel should have been refused).

    `unseen_until`: per attempt, the run's time until which dispatch may not know the attempt was created at
    all (a worker was killed holding its start: START_RECOVERY_SECONDS after the kill). A hit on such an
    attempt counts against a cancel only SEEN_WITHIN after that time, not after the hit.

    `plane_outage`: the run stopped the API server (kill-apiserver), and every controller and KWOK with it.
    A Kueue job whose pods were not Running and Ready within the plane's waitForPodsReady timeout (15 s) is
    then evicted by Kueue (PodsReadyTimeout), which dispatch ends and retries like any eviction: one more
    alternative for such a job, an attempt ended `evicted` naming PodsReadyTimeout, then the rest."""
    first_per_attempt: dict[int, Hit] = {}
    unseen = unseen_until or {}
    for hit in sorted(hits, key=lambda h: (h.attempt, h.at)):
        known = max(hit.at, unseen.get(hit.attempt, 0.0))  # when dispatch can first see it
        if cancel == "accepted" and (cancel_at is None or known + SEEN_WITHIN > cancel_at):
            continue  # the cancel may have come first
        first_per_attempt.setdefault(hit.attempt, hit)
    attempt_causes: dict[int, str] = {}
    attempt_messages: dict[int, str] = {}
    earlier: list[str] = []
    outcome: dict[str, Any] | None = None
    attempt = 1
    for number in sorted(first_per_attempt):
        hit = first_per_attempt[number]
        if number != attempt:
            break  # a hit on an attempt the run's own faults never led to: the attempt count shows it
        attempt_causes[attempt] = hit.cause
        if hit.message:
            attempt_messages[attempt] = hit.message
        if not retried(policy, earlier, hit.cause):
            outcome = {
                "state": "failed",
                "cause": hit.cause,
                "why": f"{hit.fault} hit attempt {attempt}; the policy does not retry {hit.cause}",
            }
            break
        earlier.append(hit.cause)
        attempt += 1
    why = f"{len(earlier)} disruption(s) retried by the policy; then " if earlier else ""
    cancelled = {
        "state": "cancelled",
        "cause": "cancelled",
        "pods": "none",
        "why": why + "its cancel was accepted",
    }
    if outcome is None and cancel == "accepted":
        outcome = dict(cancelled)
    if outcome is None:
        if kind in (SUCCEEDS, LONG, KUEUE_LOW, KUEUE_HIGH):
            outcome = {"state": "succeeded", "cause": "", "why": why + "it runs to its end"}
        elif kind == APP_ERROR:
            outcome = {
                "state": "failed",
                "cause": "app-error",
                "rank": fail_rank,
                "exit_code": 3,
                "why": why + f"rank {fail_rank} exits 3",
            }
        else:  # runs until cancelled: only a cancel ends it
            outcome = {"state": "cancelled", "cause": "cancelled", "pods": "none", "why": why + "cancelled"}
    outcome |= {"attempts": attempt, "attempt_causes": attempt_causes}
    if attempt_messages:
        outcome["attempt_messages"] = attempt_messages
    alternatives = [outcome]
    slow_ready = outcome["state"] == "succeeded" and retried(policy, earlier, "evicted")
    if plane_outage and kind in (KUEUE_LOW, KUEUE_HIGH) and slow_ready:
        alternatives.append(
            outcome
            | {
                "attempts": attempt + 1,
                "attempt_causes": attempt_causes | {attempt: "evicted"},
                "attempt_messages": attempt_messages | {attempt: "PodsReadyTimeout"},
                "why": outcome["why"] + ", after a PodsReadyTimeout eviction in the API server's outage",
            }
        )
    if cancel == "unknown":
        alternatives.append(cancelled | {"attempts": attempt, "attempt_causes": attempt_causes})
    return alternatives


def int_or_none(value: Any) -> int | None:
    try:
        return None if value is None or value == "" else int(value)
    except (TypeError, ValueError):
        return None


def mismatch(expected: Mapping[str, Any], seen: Mapping[str, Any], pods_left: Sequence[str]) -> list[str]:
    """What differs between one expected outcome and the job as the API shows it. Pure."""
    problems = []
    state, cause = seen.get("state"), seen.get("cause") or ""
    if state != expected["state"]:
        problems.append(
            f"state {state!r} (cause {cause!r}: {str(seen.get('message') or '')[:160]!r}), "
            f"expected {expected['state']!r}"
        )
    elif expected.get("cause") and cause != expected["cause"]:
        problems.append(f"cause {cause!r}, expected {expected['cause']!r}")
    if "rank" in expected and int_or_none(seen.get("failing_rank")) != expected["rank"]:
        problems.append(f"failing rank {seen.get('failing_rank')!r}, expected {expected['rank']!r}")
    if "exit_code" in expected and int_or_none(seen.get("exit_code")) != expected["exit_code"]:
        problems.append(f"exit code {seen.get('exit_code')!r}, expected {expected['exit_code']!r}")
    executions = sorted(seen.get("executions") or [], key=lambda e: int(e.get("attempt") or 0))
    counted = expected["state"] != "cancelled" and "attempts" in expected
    if counted and len(executions) != expected["attempts"]:
        listed = ", ".join(
            f"{e.get('attempt')}: {e.get('state')}/{e.get('cause') or '-'}" for e in executions
        )
        problems.append(f"{len(executions)} attempt(s) ({listed}), expected {expected['attempts']}")
    for attempt, hit_cause in (expected.get("attempt_causes") or {}).items():
        execution = next((e for e in executions if int(e.get("attempt") or 0) == int(attempt)), None)
        retried_past = int(attempt) < int(expected.get("attempts") or 0)
        if execution is not None and retried_past and (execution.get("cause") or "") != hit_cause:
            problems.append(
                f"attempt {attempt} ended {execution.get('state')}/{execution.get('cause') or '-'}, "
                f"expected cause {hit_cause!r}"
            )
    for attempt, text in (expected.get("attempt_messages") or {}).items():
        execution = next((e for e in executions if int(e.get("attempt") or 0) == int(attempt)), None)
        if execution is not None and text not in str(execution.get("message") or ""):
            problems.append(f"attempt {attempt}'s message does not name {text}")
    if expected.get("pods") == "none" and pods_left:
        problems.append(f"{len(pods_left)} pod(s) left: {', '.join(pods_left[:4])}")
    return problems


def judge_job(
    alternatives: Sequence[Mapping[str, Any]], seen: Mapping[str, Any], pods_left: Sequence[str]
) -> list[str]:
    """[] when any alternative matches, else the problems against the first one. Pure."""
    found = [mismatch(e, seen, pods_left) for e in alternatives]
    return [] if any(not f for f in found) else found[0]


def judge_jobs(
    accepted: Mapping[str, Mapping[str, Any]],
    hits: Mapping[str, Sequence[Hit]],
    seen: Mapping[str, Mapping[str, Any]],
    pods: Mapping[str, Sequence[Mapping[str, Any]]],
    trainjobs_of: Mapping[str, list[dict[str, Any]]],
    *,
    plane_outage: bool = False,
    unseen: Mapping[str, Mapping[int, float]] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every accepted job judged against its plan: (a row a job, the rows of the mismatches with their
    timelines). Pure: what the run saw at its end goes in. `unseen`: per job, expected_outcomes'
    `unseen_until` (the attempts whose start a killed worker held)."""
    results, mismatches = [], []
    for job_id, entry in accepted.items():
        alternatives = expected_outcomes(
            kind=entry["kind"],
            fail_rank=entry["plan"].get("fail_rank"),
            policy=expected_policy(POLICIES[entry["policy_name"]]),
            hits=hits.get(job_id, []),
            cancel=entry.get("cancel"),
            cancel_at=entry.get("cancel_at"),
            plane_outage=plane_outage,
            unseen_until=(unseen or {}).get(job_id),
        )
        left = [f"{p['name']} ({p['phase']})" for p in pods.get(job_id, [])]
        problems = judge_job(alternatives, seen[job_id], left)
        row = {
            "job": job_id,
            "index": entry["index"],
            "kind": entry["kind"],
            "policy": entry["policy_name"],
            "cancel": entry.get("cancel"),
            "hits": [asdict(h) for h in hits.get(job_id, [])],
            "foreign_pods": entry.get("foreign_pods", []),
            "expected": alternatives,
            "seen": {
                k: seen[job_id].get(k)
                for k in ("state", "cause", "message", "failing_rank", "exit_code", "current_attempt")
            },
            "seen_attempts": [
                {k: e.get(k) for k in ("attempt", "state", "cause", "message")}
                for e in seen[job_id].get("executions") or []
            ],
            "trainjobs_at_end": trainjobs_of.get(job_id, []),
            "ok": not problems,
            "problems": problems,
        }
        results.append(row)
        if problems:
            mismatches.append(
                {
                    "job": job_id,
                    "kind": entry["kind"],
                    "expected": alternatives[0],
                    "seen": row["seen"],
                    "problems": problems,
                    "hits": row["hits"],
                    "foreign_pods": row["foreign_pods"],
                    "cancel": entry.get("cancel"),
                    "attempts": row["seen_attempts"],
                    "trainjobs_at_end": row["trainjobs_at_end"],
                    "timeline": [
                        {
                            k: e.get(k)
                            for k in (
                                "at",
                                "attempt",
                                "kind",
                                "from_state",
                                "to_state",
                                "cause",
                                "message",
                            )
                        }
                        for e in (seen[job_id].get("timeline") or [])[-12:]
                    ],
                }
            )
    return results, mismatches
