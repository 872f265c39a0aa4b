"""The runtime rules (runtimes.rules): the site's runtime allow-list and runtimes that are missing."""

from __future__ import annotations

import pytest

from runtimes.reasons import AllowListMiss
from runtimes.rules import check_runtime
from tests.runtimes.support_rules import judge

# --- allow-list and missing runtimes


@pytest.mark.parametrize(
    ("allow_listed", "codes"),
    [(None, []), (True, []), (False, ["runtime-not-allowed"])],
    ids=["allow-list does not apply", "on the allow-list", "not on the allow-list"],
)
def test_allow_list(allow_listed: bool | None, codes: list[str]) -> None:
    verdict = judge(None, allow_listed=allow_listed, ref="ClusterTrainingRuntime/dispatch-kind")
    assert list(verdict.codes) == codes
    assert verdict.refused is bool(codes)
    if codes:
        assert "ClusterTrainingRuntime/dispatch-kind" in verdict.reasons[0].message


WHO = "a platform user adds runtimes on the Runtimes page"
ALLOW_LIST_MESSAGES: list[tuple[str, bool | AllowListMiss, str]] = [
    (
        "not listed",
        False,
        f"ClusterTrainingRuntime/dispatch-kind is not on the site's runtime allow-list; {WHO}",
    ),
    (
        "not listed for jobs",
        AllowListMiss(purpose="jobs"),
        f"ClusterTrainingRuntime/dispatch-kind is not on the site's runtime allow-list for jobs; {WHO}",
    ),
    (
        "the allow-list is empty",
        AllowListMiss(purpose="jobs", list_empty=True),
        "ClusterTrainingRuntime/dispatch-kind is not on the site's runtime allow-list for jobs: the "
        f"allow-list is empty, and dispatch runs no runtime nobody reviewed; {WHO}",
    ),
    (
        "listed for sessions only",
        AllowListMiss(purpose="jobs", listed_for=("sessions",)),
        "ClusterTrainingRuntime/dispatch-kind is on the site's runtime allow-list for sessions only, not for "
        "jobs; a platform user adds it for jobs on the Runtimes page",
    ),
    (
        "listed for jobs only",
        AllowListMiss(purpose="sessions", listed_for=("jobs",)),
        "ClusterTrainingRuntime/dispatch-kind is on the site's runtime allow-list for jobs only, not for "
        "sessions; a platform user adds it for sessions on the Runtimes page",
    ),
]


@pytest.mark.parametrize(
    ("allow_listed", "message"), [pytest.param(a, m, id=name) for name, a, m in ALLOW_LIST_MESSAGES]
)
def test_allow_list_refusal_says_why_and_who_adds_runtimes(
    allow_listed: bool | AllowListMiss, message: str
) -> None:
    verdict = judge(None, allow_listed=allow_listed, ref="ClusterTrainingRuntime/dispatch-kind")
    assert verdict.refused is True
    assert verdict.codes == ("runtime-not-allowed",)
    assert verdict.reasons[0].message == message


def test_missing_runtime_is_refused_naming_the_ref() -> None:
    verdict = check_runtime(None, ref="ClusterTrainingRuntime/foo")
    assert verdict.refused is True
    assert verdict.codes == ("runtime-not-found",)
    assert "ClusterTrainingRuntime/foo" in verdict.reasons[0].message
    assert verdict.capabilities and not any(c.supported for c in verdict.capabilities)


def test_missing_runtime_not_on_the_allow_list_gets_both_reasons() -> None:
    verdict = check_runtime(None, allow_listed=False, ref="TrainingRuntime/team-a/gone")
    assert verdict.codes == ("runtime-not-allowed", "runtime-not-found")


def test_ref_defaults_to_kind_and_name() -> None:
    verdict = judge(None, allow_listed=False)
    assert verdict.reasons[0].message.startswith("ClusterTrainingRuntime/dispatch-kind ")
