"""The runtime rules (runtimes.rules): the capabilities a verdict states for a runtime."""

from __future__ import annotations

from typing import Any

import pytest

from runtimes.reasons import SiteRules, Verdict
from tests.runtimes.support_rules import VIA_INIT, Mutation, delete_in, jobs, judge, pod_spec, set_in

# --- capabilities


def capability(verdict: Verdict, name: str) -> tuple[bool, str]:
    found = verdict.capability(name)
    assert found is not None, f"no capability {name}"
    return found.supported, found.why


def test_procs_per_node_needs_mlpolicy_torch() -> None:
    assert capability(judge(None), "ProcsPerNode") == (
        False,
        "the runtime has no mlPolicy.torch, so the Trainer would ignore procs per node",
    )
    supported, why = capability(judge(set_in(lambda rt: rt["spec"]["mlPolicy"], "torch", {})), "ProcsPerNode")
    assert supported is True
    assert "mlPolicy.torch" in why


def test_multi_node_states_the_runtime_default() -> None:
    supported, why = capability(judge(None), "MultiNode")
    assert supported is True
    assert "default: 2" in why
    supported, why = capability(judge(delete_in(lambda rt: rt["spec"], "mlPolicy")), "MultiNode")
    assert "default: 1" in why  # the Trainer treats an unset numNodes as 1
    assert capability(judge(lambda rt: jobs(rt)[0]["template"].pop("metadata")), "MultiNode")[0] is False


@pytest.mark.parametrize(
    ("mutate", "rules", "supported", "text"),
    [
        pytest.param(None, SiteRules(), True, 'env into container "node"', id="env"),
        pytest.param(
            lambda rt: pod_spec(rt)["containers"][0].update(name="main"),
            SiteRules(),
            False,
            'no container "node"',
            id="env, no node container",
        ),
        pytest.param(
            set_in(pod_spec, "initContainers", [{"name": "publish-identity"}]),
            VIA_INIT,
            True,
            'init container "publish-identity"',
            id="init container",
        ),
        pytest.param(
            None, VIA_INIT, False, 'no init container "publish-identity"', id="init container missing"
        ),
    ],
)
def test_rank_identity_says_where_the_identity_goes(
    mutate: Mutation | None, rules: SiteRules, supported: bool, text: str
) -> None:
    got_supported, why = capability(judge(mutate, rules), "RankIdentity")
    assert got_supported is supported
    assert text in why


@pytest.mark.parametrize(
    ("policy", "supported"),
    [(None, False), ({"coscheduling": {}}, True), ({"volcano": {"networkTopology": {"mode": "hard"}}}, True)],
    ids=["none", "coscheduling", "volcano"],
)
def test_gang_scheduling_follows_pod_group_policy(policy: dict[str, Any] | None, supported: bool) -> None:
    def mutate(rt: dict[str, Any]) -> None:
        if policy is not None:
            rt["spec"]["podGroupPolicy"] = policy

    verdict = judge(mutate)
    assert verdict.reasons == ()  # podGroupPolicy is accepted as it is
    assert capability(verdict, "GangScheduling")[0] is supported
