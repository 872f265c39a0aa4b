"""The runtime rules (runtimes.rules): what a reason's message says, and the path it names."""

from __future__ import annotations

from typing import Any

import pytest

from runtimes.reasons import TRAINER_ANCESTOR_LABEL, Reason, SiteRules, Verdict
from tests.runtimes.support_rules import (
    JOB0,
    POD0,
    VIA_INIT,
    Mutation,
    combine,
    container_field,
    delete_in,
    extra_job,
    job_spec,
    jobs,
    jobset_spec,
    judge,
    pfp,
    pod_spec,
    rename_trainer,
    restart_rule,
    set_in,
)


def reason(verdict: Verdict, code: str) -> Reason:
    matches = [r for r in verdict.reasons if r.code == code]
    assert len(matches) == 1, f"expected one {code}, got {verdict.codes}"
    return matches[0]


# --- what the messages say

MESSAGE_CASES: list[tuple[str, Mutation, SiteRules, str, str, str]] = [
    # (case, change, rules, code, path, text the message must contain)
    (
        "restartPolicy OnFailure",
        set_in(pod_spec, "restartPolicy", "OnFailure"),
        SiteRules(),
        "restart-policy",
        f"{POD0}.restartPolicy",
        f'{POD0}.restartPolicy is "OnFailure"; the trainer pod must state restartPolicy: Never (a kubelet '
        "restarting a container in place raises neither DISPATCH_ATTEMPT nor the JobSet restart attempt)",
    ),
    (
        "restartPolicy absent names the JobSet default",
        delete_in(pod_spec, "restartPolicy"),
        SiteRules(),
        "restart-policy",
        f"{POD0}.restartPolicy",
        f"{POD0}.restartPolicy is not set, and JobSet defaults it to OnFailure",
    ),
    (
        "backoffLimit 3",
        set_in(job_spec, "backoffLimit", 3),
        SiteRules(),
        "backoff-limit",
        f"{JOB0}.backoffLimit",
        f"{JOB0}.backoffLimit is 3; the trainer job must state backoffLimit: 0",
    ),
    (
        "backoffLimit absent names the Job default",
        delete_in(job_spec, "backoffLimit"),
        SiteRules(),
        "backoff-limit",
        f"{JOB0}.backoffLimit",
        "is not set, and the Job default is 6",
    ),
    (
        "Ignore rule names its index",
        pfp("Count", "Ignore"),
        SiteRules(),
        "pod-failure-policy-ignore",
        f"{JOB0}.podFailurePolicy.rules[1].action",
        'rules[1].action is "Ignore"',
    ),
    (
        "unknown action is quoted",
        pfp("Retry"),
        SiteRules(),
        "pod-failure-policy-unknown-action",
        f"{JOB0}.podFailurePolicy.rules[0].action",
        'rules[0].action is "Retry"; every podFailurePolicy rule\'s action must be FailJob, FailIndex, Count '
        "or Ignore",
    ),
    (
        "backoffLimitPerIndex value",
        set_in(job_spec, "backoffLimitPerIndex", 2),
        SiteRules(),
        "backoff-limit-per-index",
        f"{JOB0}.backoffLimitPerIndex",
        f"{JOB0}.backoffLimitPerIndex is 2",
    ),
    (
        "mlPolicy names the framework",
        set_in(lambda rt: rt["spec"]["mlPolicy"], "mpi", {"numProcPerNode": 1}),
        SiteRules(),
        "mlpolicy-unsupported",
        "spec.mlPolicy.mpi",
        "spec.mlPolicy.mpi is set",
    ),
    (
        "mlPolicy names every extra key",
        lambda rt: rt["spec"]["mlPolicy"].update(jax={}, flux={}),
        SiteRules(),
        "mlpolicy-unsupported",
        "spec.mlPolicy",
        "spec.mlPolicy names jax, flux",
    ),
    (
        "no node container lists what it found",
        lambda rt: pod_spec(rt)["containers"][0].update(name="trainer"),
        SiteRules(),
        "no-node-container",
        f"{POD0}.containers",
        'has no container named "node" (found "trainer")',
    ),
    (
        "missing publish init container is named",
        set_in(pod_spec, "initContainers", [{"name": "setup"}]),
        VIA_INIT,
        "no-publish-init-container",
        f"{POD0}.initContainers",
        'has no init container named "publish-identity" (found "setup")',
    ),
    (
        "empty publish.container says so",
        lambda rt: None,
        SiteRules(publish_via="initContainer"),
        "no-publish-init-container",
        f"{POD0}.initContainers",
        "publish.container names no init container",
    ),
    (
        "JobSet maxRestarts value",
        set_in(jobset_spec, "failurePolicy", {"maxRestarts": 5}),
        SiteRules(),
        "jobset-max-restarts",
        "spec.template.spec.failurePolicy.maxRestarts",
        "spec.template.spec.failurePolicy.maxRestarts is 5",
    ),
    (
        "JobSet rule action and name",
        set_in(jobset_spec, "failurePolicy", {"rules": [{"name": "retry-all", "action": "RestartJobSet"}]}),
        SiteRules(),
        "jobset-failure-rule-action",
        "spec.template.spec.failurePolicy.rules[0].action",
        'rules[0].action is "RestartJobSet" (rule "retry-all"); every JobSet failurePolicy rule\'s action '
        "must be FailJobSet",
    ),
    (
        "container restartPolicy names the container",
        container_field("restartPolicy", "OnFailure"),
        SiteRules(),
        "container-restart-policy",
        f"{POD0}.containers[0].restartPolicy",
        f'{POD0}.containers[0].restartPolicy is "OnFailure" (container "node"); a container of the trainer '
        "pod must not state its own restartPolicy (other than Never) or a Restart rule: the kubelet would "
        "then rerun the rank in place whatever the pod's restartPolicy says",
    ),
    (
        "container Restart rule names the rule",
        container_field("restartPolicyRules", [{"action": "Stop"}, restart_rule(42)]),
        SiteRules(),
        "container-restart-policy",
        f"{POD0}.containers[0].restartPolicyRules[1].action",
        f'{POD0}.containers[0].restartPolicyRules[1].action is "Restart" (container "node")',
    ),
    (
        "both in one container: one reason naming both",
        combine(
            container_field("restartPolicy", "Always"),
            container_field("restartPolicyRules", [restart_rule(42)]),
        ),
        SiteRules(),
        "container-restart-policy",
        f"{POD0}.containers[0].restartPolicy",
        f'{POD0}.containers[0].restartPolicy is "Always" and '
        f'{POD0}.containers[0].restartPolicyRules[0].action is "Restart" (container "node")',
    ),
    (
        "init container restartPolicy",
        set_in(pod_spec, "initContainers", [{"name": "setup", "restartPolicy": "OnFailure"}]),
        SiteRules(),
        "container-restart-policy",
        f"{POD0}.initContainers[0].restartPolicy",
        f'{POD0}.initContainers[0].restartPolicy is "OnFailure" (container "setup")',
    ),
    (
        "completionMode value",
        set_in(job_spec, "completionMode", "NonIndexed"),
        SiteRules(),
        "completion-mode",
        f"{JOB0}.completionMode",
        f'{JOB0}.completionMode is "NonIndexed"; the trainer job must leave completionMode unset '
        "(JobSet sets Indexed) or state Indexed: without a completion index there is no rank",
    ),
    (
        "FailIndex names the rule and the missing field",
        pfp("Count", "FailIndex"),
        SiteRules(),
        "fail-index-without-per-index",
        f"{JOB0}.podFailurePolicy.rules[1].action",
        f'{JOB0}.podFailurePolicy.rules[1].action is "FailIndex" and {JOB0}.backoffLimitPerIndex is not set; '
        "the Job API rejects a FailIndex rule without backoffLimitPerIndex",
    ),
    (
        "torch trainer job name",
        combine(set_in(lambda rt: rt["spec"]["mlPolicy"], "torch", {}), rename_trainer("trainer")),
        SiteRules(),
        "torch-trainer-job-name",
        "spec.template.spec.replicatedJobs[0].name",
        'spec.template.spec.replicatedJobs[0].name is "trainer"; with mlPolicy.torch the Trainer\'s torch '
        "plugin points every rank at <trainjob>-node-0-0 for rendezvous, so the trainer job must be named "
        '"node"',
    ),
    (
        "no trainer job lists the jobs",
        lambda rt: jobs(rt)[0]["template"].pop("metadata"),
        SiteRules(),
        "no-trainer-job",
        "spec.template.spec.replicatedJobs",
        f'("node") has no job whose template carries the trainer label; the trainer job is the one whose '
        f"template carries the label {TRAINER_ANCESTOR_LABEL}: trainer",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "rules", "code", "path", "text"),
    [pytest.param(m, r, c, p, t, id=name) for name, m, r, c, p, t in MESSAGE_CASES],
)
def test_message_names_path_and_value(
    mutate: Mutation, rules: SiteRules, code: str, path: str, text: str
) -> None:
    found = reason(judge(mutate, rules), code)
    assert found.path == path
    assert text in found.message


def test_each_extra_job_is_its_own_reason_naming_it() -> None:
    def mutate(rt: dict[str, Any]) -> None:
        jobs(rt).insert(0, extra_job("model-initializer", "model-initializer"))
        jobs(rt).append(extra_job("launcher"))

    verdict = judge(mutate)
    extras = [r for r in verdict.reasons if r.code == "extra-replicated-job"]
    assert [r.path for r in extras] == [
        "spec.template.spec.replicatedJobs[0]",
        "spec.template.spec.replicatedJobs[2]",
    ]
    assert '"model-initializer"' in extras[0].message
    assert '"launcher"' in extras[1].message
    assert all('besides the trainer job "node"' in r.message for r in extras)


def test_a_second_trainer_labelled_job_is_extra_and_says_so() -> None:
    verdict = judge(lambda rt: jobs(rt).append(extra_job("node-b", "trainer")))
    extra = reason(verdict, "extra-replicated-job")
    assert extra.path == "spec.template.spec.replicatedJobs[1]"
    assert "carries the trainer label too" in extra.message


def test_no_trainer_job_reports_no_trainer_rules_and_no_extras() -> None:
    """Without a trainer job, its rules cannot be judged and every job being 'extra' would be noise."""

    def mutate(rt: dict[str, Any]) -> None:
        jobs(rt)[0]["template"].pop("metadata")
        jobs(rt).append(extra_job("launcher"))
        delete_in(pod_spec, "restartPolicy")(rt)

    assert judge(mutate).codes == ("no-trainer-job",)
