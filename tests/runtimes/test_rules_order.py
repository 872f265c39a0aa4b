"""The runtime rules (runtimes.rules) together: several reasons at once, all of them in DESIGN.md's table
order, and the accepted neighbours of the four newer rules."""

from __future__ import annotations

from typing import Any

import pytest

from runtimes.reasons import SiteRules
from tests.runtimes.support_rules import (
    ALLOW,
    Mutation,
    break_everything,
    combine,
    container_field,
    job_spec,
    jobs,
    jobset_spec,
    judge,
    pfp,
    pod_spec,
    restart_rule,
    set_in,
)

# --- several reasons at once: all of them, in DESIGN.md's table order

ALL_CODES_IN_ORDER = [
    "runtime-not-allowed",
    "mlpolicy-unsupported",
    "extra-replicated-job",
    "restart-policy",
    "backoff-limit",
    "pod-failure-policy-ignore",
    "backoff-limit-per-index",
    "pod-failure-policy-unknown-action",
    "no-node-container",
    "no-publish-init-container",
    "jobset-max-restarts",
    "jobset-failure-rule-action",
    "jobset-failure-rule-action",
]


def test_every_reason_is_reported_in_a_stable_order() -> None:
    rules = SiteRules(publish_via="initContainer", publish_container="publish-identity")
    first = judge(break_everything, rules, allow_listed=False)
    assert list(first.codes) == ALL_CODES_IN_ORDER
    assert first.refused is True
    # The order does not depend on anything but the runtime: a second check gives the same reasons.
    assert judge(break_everything, rules, allow_listed=False).reasons == first.reasons
    # JobSet rules keep their own order: rules[0] and rules[2] are refused, rules[1] (FailJobSet) is not.
    assert [r.path for r in first.reasons if r.code == "jobset-failure-rule-action"] == [
        "spec.template.spec.failurePolicy.rules[0].action",
        "spec.template.spec.failurePolicy.rules[2].action",
    ]


def break_the_four_new_rules(rt: dict[str, Any]) -> None:
    """Trips each of the four rules after the JobSet ones in DESIGN.md's table, and nothing else."""
    pod_spec(rt)["containers"][0]["restartPolicyRules"] = [restart_rule(42)]
    job_spec(rt)["completionMode"] = "NonIndexed"
    pfp("FailIndex")(rt)
    rt["spec"]["mlPolicy"]["torch"] = {"numProcPerNode": "auto"}
    jobs(rt)[0]["name"] = "trainer"


FOUR_NEW_CODES = [
    "container-restart-policy",
    "completion-mode",
    "fail-index-without-per-index",
    "torch-trainer-job-name",
]


@pytest.mark.parametrize("rules", [SiteRules(), ALLOW], ids=["default", "allowRankRestart"])
def test_a_runtime_tripping_all_four_new_rules_gets_all_four_none_waived(rules: SiteRules) -> None:
    verdict = judge(break_the_four_new_rules, rules)
    assert list(verdict.codes) == FOUR_NEW_CODES
    assert verdict.refused is True
    assert not any(r.waived for r in verdict.reasons)
    assert verdict.identity_warning is None  # nothing was waived, so there is nothing to warn about


def test_the_new_rules_come_after_every_older_reason() -> None:
    """DESIGN.md's table order: the four new codes after jobset-failure-rule-action."""

    def mutate(rt: dict[str, Any]) -> None:
        break_the_four_new_rules(rt)
        jobset_spec(rt)["failurePolicy"] = {"rules": [{"action": "RestartJobSet"}]}
        pod_spec(rt)["restartPolicy"] = "OnFailure"

    assert list(judge(mutate).codes) == ["restart-policy", "jobset-failure-rule-action", *FOUR_NEW_CODES]


# The accepted neighbours of the four rules: what they must not catch.
NEIGHBOURS: list[tuple[str, Mutation, SiteRules, list[str]]] = [
    ("container restartPolicy Never", container_field("restartPolicy", "Never"), SiteRules(), []),
    (
        "sidecar init container with restartPolicy Always",
        set_in(pod_spec, "initContainers", [{"name": "log-shipper", "restartPolicy": "Always"}]),
        SiteRules(),
        [],
    ),
    (
        "FailIndex with backoffLimitPerIndex under allowRankRestart",
        combine(pfp("FailIndex"), set_in(job_spec, "backoffLimitPerIndex", 0)),
        ALLOW,
        ["backoff-limit-per-index"],  # waived, so the runtime is accepted with the identity warning
    ),
    (
        "torch with a trainer job named node",
        set_in(lambda rt: rt["spec"]["mlPolicy"], "torch", {"numProcPerNode": "auto"}),
        SiteRules(),
        [],
    ),
]


@pytest.mark.parametrize(
    ("mutate", "rules", "codes"), [pytest.param(m, r, c, id=name) for name, m, r, c in NEIGHBOURS]
)
def test_accepted_neighbours_of_the_new_rules(mutate: Mutation, rules: SiteRules, codes: list[str]) -> None:
    verdict = judge(mutate, rules)
    assert verdict.refused is False
    assert list(verdict.codes) == codes
    assert all(r.waived for r in verdict.reasons)


def test_fail_index_with_per_index_under_allow_rank_restart_warns_of_backoff_limit_per_index() -> None:
    verdict = judge(combine(pfp("FailIndex"), set_in(job_spec, "backoffLimitPerIndex", 0)), ALLOW)
    assert verdict.identity_warning == (
        "allowRankRestart: the runtime's trainer job states backoffLimitPerIndex, so a failed rank can rerun "
        "under the same DISPATCH_ATTEMPT and one execution can contain a restarted rank"
    )
