"""jobs.supervision.tombstones.supersedes: which of two deliveries of one pod's deletion is kept (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.supervision.tombstones import newer_version, supersedes


def _pod(version: str, *, disrupted: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if disrupted:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"})
    return {"metadata": {"uid": "u1", "resourceVersion": version}, "status": {"conditions": conditions}}


def test_the_delivery_with_a_disruption_target_wins_whatever_its_resource_version() -> None:
    assert supersedes(_pod("90", disrupted=True), _pod("100"))
    assert not supersedes(_pod("100"), _pod("90", disrupted=True))


def test_without_a_difference_in_disruption_the_newer_resource_version_wins_as_an_integer() -> None:
    # As text "9" > "10"; etcd's revisions are integers.
    assert supersedes(_pod("10"), _pod("9"))
    assert not supersedes(_pod("9"), _pod("10"))
    assert supersedes(_pod("12", disrupted=True), _pod("11", disrupted=True))


def test_a_tie_or_versions_that_are_not_integers_keep_the_tombstone_already_kept() -> None:
    assert not supersedes(_pod("10"), _pod("10"))
    assert not supersedes(_pod("abc"), _pod("9"))


def test_a_disruption_target_that_is_not_true_is_no_disruption() -> None:
    false = _pod("5")
    false["status"]["conditions"].append({"type": "DisruptionTarget", "status": "False"})
    assert supersedes(_pod("6"), false)


@pytest.mark.parametrize(
    ("candidate", "kept", "newer"), [("10", "9", True), ("9", "10", False), ("", "1", False)]
)
def test_newer_version(candidate: str, kept: str, newer: bool) -> None:
    assert newer_version(candidate, kept) is newer
