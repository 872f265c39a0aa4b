"""The runtime rules (runtimes.rules): the helpers others use, the verdict's JSON form and the site rules'
own checks."""

from __future__ import annotations

import json

import pytest

from runtimes.reasons import SiteRules, Verdict
from runtimes.rules import find_trainer_job, trainer_pod_spec
from tests.runtimes.support_rules import break_everything, example, extra_job, jobs, judge

# --- the helpers others use


def test_find_trainer_job_returns_index_and_job() -> None:
    rt = example()
    jobs(rt).insert(0, extra_job("dataset-initializer", "dataset-initializer"))
    found = find_trainer_job(rt)
    assert found is not None
    assert found[0] == 1
    assert found[1]["name"] == "node"
    pod = trainer_pod_spec(rt)
    assert pod is not None
    assert pod["restartPolicy"] == "Never"


def test_helpers_return_none_without_a_trainer_job() -> None:
    rt = example()
    jobs(rt)[0]["template"].pop("metadata")
    assert find_trainer_job(rt) is None
    assert trainer_pod_spec(rt) is None


def test_verdict_round_trips_through_json() -> None:
    rules = SiteRules(allow_rank_restart=True, publish_via="initContainer", publish_container="x")
    verdict = judge(break_everything, rules, allow_listed=False)
    data = json.loads(json.dumps(verdict.to_dict()))
    assert set(data) == {"refused", "reasons", "identity_warning", "capabilities"}
    assert set(data["reasons"][0]) == {"code", "message", "path", "waived"}
    assert set(data["capabilities"][0]) == {"name", "supported", "why"}
    assert Verdict.from_dict(data) == verdict


def test_unknown_publish_via_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match=r"publish\.via"):
        SiteRules(publish_via="environment")
