"""The runtime rules (runtimes.rules) under allowRankRestart: the reasons it waives and the identity
warning it brings."""

from __future__ import annotations

import pytest

from tests.runtimes.support_rules import ALLOW, Mutation, combine, job_spec, judge, pfp, pod_spec, set_in

# --- allowRankRestart: waived reasons and the identity warning

WARNING_CASES = [
    (
        "Ignore rule",
        pfp("Ignore"),
        ["pod-failure-policy-ignore"],
        "allowRankRestart: the runtime's trainer job states a podFailurePolicy Ignore rule, so a failed rank "
        "can rerun under the same DISPATCH_ATTEMPT and one execution can contain a restarted rank",
    ),
    (
        "backoffLimitPerIndex",
        set_in(job_spec, "backoffLimitPerIndex", 1),
        ["backoff-limit-per-index"],
        "allowRankRestart: the runtime's trainer job states backoffLimitPerIndex, so a failed rank can rerun "
        "under the same DISPATCH_ATTEMPT and one execution can contain a restarted rank",
    ),
    (
        "both",
        combine(pfp("Ignore"), set_in(job_spec, "backoffLimitPerIndex", 1)),
        ["pod-failure-policy-ignore", "backoff-limit-per-index"],
        "allowRankRestart: the runtime's trainer job states a podFailurePolicy Ignore rule and "
        "backoffLimitPerIndex, so a failed rank can rerun under the same DISPATCH_ATTEMPT and one execution "
        "can contain a restarted rank",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "codes", "warning"), [pytest.param(m, c, w, id=name) for name, m, c, w in WARNING_CASES]
)
def test_allow_rank_restart_waives_and_warns(mutate: Mutation, codes: list[str], warning: str) -> None:
    verdict = judge(mutate, ALLOW)
    assert verdict.refused is False
    assert list(verdict.codes) == codes  # still listed, so the plan can show them
    assert all(r.waived for r in verdict.reasons)
    assert verdict.identity_warning == warning


@pytest.mark.parametrize(
    ("mutate", "codes"), [pytest.param(m, c, id=name) for name, m, c, _ in WARNING_CASES]
)
def test_without_allow_rank_restart_the_same_runtime_is_refused(mutate: Mutation, codes: list[str]) -> None:
    verdict = judge(mutate)
    assert verdict.refused is True
    assert list(verdict.codes) == codes
    assert not any(r.waived for r in verdict.reasons)
    assert verdict.identity_warning is None


def test_waiver_does_not_cover_other_reasons() -> None:
    verdict = judge(combine(pfp("Ignore", "Retry"), set_in(pod_spec, "restartPolicy", "OnFailure")), ALLOW)
    assert verdict.refused is True
    assert {r.code: r.waived for r in verdict.reasons} == {
        "restart-policy": False,
        "pod-failure-policy-ignore": True,
        "pod-failure-policy-unknown-action": False,
    }
    assert verdict.identity_warning is not None
    assert "podFailurePolicy Ignore rule, so" in verdict.identity_warning


def test_allow_rank_restart_on_a_clean_runtime_warns_nothing() -> None:
    verdict = judge(None, ALLOW)
    assert (verdict.refused, verdict.reasons, verdict.identity_warning) == (False, (), None)
