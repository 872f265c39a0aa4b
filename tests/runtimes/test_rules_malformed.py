"""The runtime rules (runtimes.rules): malformed input never raises and is never accepted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtimes.reasons import TRAINER_ANCESTOR_LABEL, SiteRules
from runtimes.rules import check_runtime
from tests.runtimes.support_rules import ALLOW, VIA_INIT, job_spec, jobset_spec, judge, set_in

# --- malformed input never raises and is never accepted

MALFORMED: list[tuple[str, Any]] = [
    ("empty object", {}),
    ("a list", []),
    ("a string", "ClusterTrainingRuntime"),
    ("spec is a list", {"spec": []}),
    ("template is a string", {"spec": {"template": "x"}}),
    ("replicatedJobs is a mapping", {"spec": {"template": {"spec": {"replicatedJobs": {"name": "node"}}}}}),
    (
        "replicatedJobs holds junk",
        {"spec": {"template": {"spec": {"replicatedJobs": [None, 3, "node", []]}}}},
    ),
    (
        "labels is a list",
        {"spec": {"template": {"spec": {"replicatedJobs": [{"template": {"metadata": {"labels": []}}}]}}}},
    ),
]


def malformed_trainer(**job_spec_fields: Any) -> dict[str, Any]:
    """A runtime whose trainer job is found but whose insides have the wrong types."""
    return {
        "spec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        None,
                        {
                            "name": ["not", "a", "name"],
                            "template": {
                                "metadata": {"labels": {TRAINER_ANCESTOR_LABEL: "trainer"}},
                                "spec": job_spec_fields,
                            },
                        },
                    ]
                }
            }
        }
    }


MALFORMED += [
    ("pod template is a list", malformed_trainer(template=[], backoffLimit=0)),
    (
        "containers is a mapping",
        malformed_trainer(template={"spec": {"restartPolicy": "Never", "containers": {}}}),
    ),
    (
        "containers hold junk",
        malformed_trainer(template={"spec": {"containers": [None, "node", {"name": 1}]}}),
    ),
    ("podFailurePolicy is a string", malformed_trainer(podFailurePolicy="Ignore")),
    ("a rule is a list", malformed_trainer(podFailurePolicy={"rules": [["Ignore"]]})),
    ("an action is a mapping", malformed_trainer(podFailurePolicy={"rules": [{"action": {"x": 1}}]})),
    ("backoffLimit is a list", malformed_trainer(backoffLimit=[0])),
    (
        "mlPolicy is a list",
        {**malformed_trainer(), "spec": {**malformed_trainer()["spec"], "mlPolicy": ["torch"]}},
    ),
    (
        "JobSet failurePolicy is a string",
        {
            "spec": {
                "template": {
                    "spec": {**malformed_trainer()["spec"]["template"]["spec"], "failurePolicy": "x"}
                }
            }
        },
    ),
    (
        "JobSet rules is a mapping",
        {
            "spec": {
                "template": {
                    "spec": {
                        **malformed_trainer()["spec"]["template"]["spec"],
                        "failurePolicy": {"rules": {"action": "RestartJobSet"}, "maxRestarts": "1"},
                    }
                }
            }
        },
    ),
]


@pytest.mark.parametrize("runtime", [pytest.param(rt, id=name) for name, rt in MALFORMED])
@pytest.mark.parametrize("rules", [SiteRules(), VIA_INIT, ALLOW], ids=["default", "via-init", "allow"])
def test_malformed_input_is_refused_not_raised(runtime: Any, rules: SiteRules) -> None:
    verdict = check_runtime(runtime, rules=rules, allow_listed=True)
    assert verdict.refused is True
    json.dumps(verdict.to_dict())  # still JSON-ready for the job record and the API
    assert all(r.message and r.code for r in verdict.reasons)


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("podFailurePolicy", "Ignore", "pod-failure-policy-unknown-action"),
        ("podFailurePolicy", {"rules": "Ignore"}, "pod-failure-policy-unknown-action"),
    ],
    ids=["policy is a string", "rules is a string"],
)
def test_unreadable_pod_failure_policy_is_reported_not_accepted(field: str, value: Any, code: str) -> None:
    """A policy the checker cannot read may hide an Ignore rule: it refuses rather than accepts it."""
    verdict = judge(set_in(job_spec, field, value))
    assert verdict.codes == (code,)
    assert "cannot be read" in verdict.reasons[0].message


def test_unreadable_jobset_failure_policy_is_reported_not_accepted() -> None:
    verdict = judge(set_in(jobset_spec, "failurePolicy", ["RestartJobSet"]))
    assert verdict.codes == ("jobset-failure-rule-action",)
    assert verdict.reasons[0].path == "spec.template.spec.failurePolicy"
