"""Recovery policies as data (jobs.recovery): which failure starts attempt A+1, after how long, within which
budget. The expected decisions follow DESIGN.md: infrastructure causes (preempted, node-lost, evicted,
no-capacity) and user causes (app-error, oom, config-error) have separate budgets; nothing else is retried
unless a policy says so, and cancelled / identity-violation / unknown-failure never are."""

from __future__ import annotations

import pytest

from jobs.recovery import DEFAULT_POLICY, decide, resolve


def test_the_default_retries_preemption_up_to_3_times_and_never_an_app_error() -> None:
    policy = resolve(None, None)
    assert decide(policy, [], "preempted").retry
    assert decide(policy, ["preempted", "preempted"], "preempted").retry
    assert not decide(policy, ["preempted", "preempted", "preempted"], "preempted").retry
    refused = decide(policy, [], "app-error")
    assert not refused.retry and "0 of 0" in refused.why


def test_the_infrastructure_budget_caps_all_infrastructure_causes_together() -> None:
    policy = resolve(None, {"retry": {"preempted": 5, "node-lost": 5}, "budgets": {"infrastructure": 2}})
    assert decide(policy, ["preempted"], "node-lost").retry
    capped = decide(policy, ["preempted", "node-lost"], "preempted")
    assert not capped.retry and "infrastructure budget" in capped.why


def test_user_causes_have_their_own_budget() -> None:
    policy = resolve(None, {"retry": {"app-error": 3, "oom": 3}, "budgets": {"user": 1}})
    assert decide(policy, ["preempted", "preempted"], "app-error").retry  # infrastructure retries don't count
    assert not decide(policy, ["oom"], "app-error").retry


@pytest.mark.parametrize("cause", ["cancelled", "identity-violation", "unknown-failure", ""])
def test_some_causes_are_never_retried_whatever_the_policy(cause: str) -> None:
    policy = resolve(None, {"retry": {"app-error": 3}})
    assert not decide(policy, [], cause).retry


def test_backoff_doubles_with_each_retry_of_the_same_cause() -> None:
    policy = resolve(None, {"retry": {"preempted": 3}, "backoff_seconds": {"preempted": 5}})
    assert [decide(policy, ["preempted"] * n, "preempted").backoff_seconds for n in range(3)] == [5, 10, 20]


def test_the_site_default_and_the_job_override_merge_per_key() -> None:
    site = {"retry": {"oom": 1}, "budgets": {"user": 1}}
    job = {"retry": {"preempted": 0}}
    policy = resolve(site, job)
    assert policy["retry"]["oom"] == 1 and policy["retry"]["preempted"] == 0
    assert policy["retry"]["node-lost"] == DEFAULT_POLICY["retry"]["node-lost"]
    assert policy["budgets"] == {"infrastructure": 3, "user": 1}
    assert resolve(None, None) == DEFAULT_POLICY and resolve(None, None) is not DEFAULT_POLICY
