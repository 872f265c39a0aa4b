"""The runtime rules (runtimes.rules) one at a time: the spec's example passes, then one table of cases
per rule."""

from __future__ import annotations

import copy

import pytest

from runtimes.reasons import TRAINER_ANCESTOR_LABEL, SiteRules
from runtimes.rules import check_runtime
from tests.runtimes.support_rules import (
    ALLOW,
    VIA_INIT,
    Mutation,
    combine,
    container_field,
    delete_in,
    example,
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

# --- the example


def test_spec_example_passes_with_no_reasons() -> None:
    verdict = check_runtime(example())
    assert verdict.refused is False
    assert verdict.reasons == ()
    assert verdict.identity_warning is None


def test_the_checker_does_not_change_its_input() -> None:
    rt = example()
    pfp("Ignore", "Retry")(rt)
    before = copy.deepcopy(rt)
    check_runtime(rt, rules=ALLOW)
    assert rt == before


# --- one rule at a time: (case, change to the example, site rules, codes expected in order)

RULE_CASES: list[tuple[str, Mutation | None, SiteRules, list[str]]] = [
    # mlPolicy: nothing but torch besides numNodes
    ("mlpolicy absent (plain)", delete_in(lambda rt: rt["spec"], "mlPolicy"), SiteRules(), []),
    ("mlpolicy numNodes only", None, SiteRules(), []),
    ("mlpolicy torch", set_in(lambda rt: rt["spec"]["mlPolicy"], "torch", {}), SiteRules(), []),
    (
        "mlpolicy mpi",
        set_in(lambda rt: rt["spec"]["mlPolicy"], "mpi", {}),
        SiteRules(),
        ["mlpolicy-unsupported"],
    ),
    (
        "mlpolicy jax",
        set_in(lambda rt: rt["spec"]["mlPolicy"], "jax", {}),
        SiteRules(),
        ["mlpolicy-unsupported"],
    ),
    (
        "mlpolicy flux",
        set_in(lambda rt: rt["spec"]["mlPolicy"], "flux", {}),
        SiteRules(),
        ["mlpolicy-unsupported"],
    ),
    (
        "mlpolicy xgboost",
        set_in(lambda rt: rt["spec"]["mlPolicy"], "xgboost", {}),
        SiteRules(),
        ["mlpolicy-unsupported"],
    ),
    # the trainer job: found by the ancestor label on the Job template
    (
        "trainer label removed",
        delete_in(lambda rt: jobs(rt)[0]["template"], "metadata"),
        SiteRules(),
        ["no-trainer-job"],
    ),
    (
        "ancestor label says dataset-initializer",
        set_in(
            lambda rt: jobs(rt)[0]["template"]["metadata"]["labels"],
            TRAINER_ANCESTOR_LABEL,
            "dataset-initializer",
        ),
        SiteRules(),
        ["no-trainer-job"],
    ),
    (
        "trainer label on the pod template instead of the Job template",
        lambda rt: job_spec(rt)["template"].update(metadata=jobs(rt)[0]["template"].pop("metadata")),
        SiteRules(),
        ["no-trainer-job"],
    ),
    ("no replicated jobs", set_in(jobset_spec, "replicatedJobs", []), SiteRules(), ["no-trainer-job"]),
    ("replicatedJobs absent", delete_in(jobset_spec, "replicatedJobs"), SiteRules(), ["no-trainer-job"]),
    # nothing but the trainer job
    (
        "an initializer besides the trainer",
        lambda rt: jobs(rt).insert(0, extra_job("dataset-initializer", "dataset-initializer")),
        SiteRules(),
        ["extra-replicated-job"],
    ),
    (
        "launcher and sidecar besides the trainer",
        lambda rt: jobs(rt).extend([extra_job("launcher"), extra_job("sidecar")]),
        SiteRules(),
        ["extra-replicated-job", "extra-replicated-job"],
    ),
    # restartPolicy: Never, stated
    (
        "restartPolicy OnFailure",
        set_in(pod_spec, "restartPolicy", "OnFailure"),
        SiteRules(),
        ["restart-policy"],
    ),
    ("restartPolicy Always", set_in(pod_spec, "restartPolicy", "Always"), SiteRules(), ["restart-policy"]),
    ("restartPolicy absent", delete_in(pod_spec, "restartPolicy"), SiteRules(), ["restart-policy"]),
    (
        "restartPolicy lower-case never",
        set_in(pod_spec, "restartPolicy", "never"),
        SiteRules(),
        ["restart-policy"],
    ),
    # backoffLimit: 0, stated
    ("backoffLimit 3", set_in(job_spec, "backoffLimit", 3), SiteRules(), ["backoff-limit"]),
    ("backoffLimit absent", delete_in(job_spec, "backoffLimit"), SiteRules(), ["backoff-limit"]),
    ("backoffLimit false is not 0", set_in(job_spec, "backoffLimit", False), SiteRules(), ["backoff-limit"]),
    ("backoffLimit string '0'", set_in(job_spec, "backoffLimit", "0"), SiteRules(), ["backoff-limit"]),
    # podFailurePolicy: FailJob and Count are accepted, Ignore refused, unknown actions refused
    ("podFailurePolicy FailJob and Count", pfp("FailJob", "Count"), SiteRules(), []),
    (
        "podFailurePolicy FailIndex is a known action (but needs backoffLimitPerIndex)",
        pfp("FailIndex"),
        SiteRules(),
        ["fail-index-without-per-index"],
    ),
    ("podFailurePolicy without rules", set_in(job_spec, "podFailurePolicy", {}), SiteRules(), []),
    ("podFailurePolicy Ignore", pfp("FailJob", "Ignore"), SiteRules(), ["pod-failure-policy-ignore"]),
    (
        "two Ignore rules, one reason each",
        pfp("Ignore", "Count", "Ignore"),
        SiteRules(),
        ["pod-failure-policy-ignore", "pod-failure-policy-ignore"],
    ),
    ("podFailurePolicy Retry", pfp("Retry"), SiteRules(), ["pod-failure-policy-unknown-action"]),
    ("actions are case-sensitive", pfp("ignore"), SiteRules(), ["pod-failure-policy-unknown-action"]),
    ("rule without an action", pfp(None), SiteRules(), ["pod-failure-policy-unknown-action"]),
    (
        "rules is not a list",
        set_in(job_spec, "podFailurePolicy", {"rules": {"action": "Ignore"}}),
        SiteRules(),
        ["pod-failure-policy-unknown-action"],
    ),
    # backoffLimitPerIndex: refused unless allowRankRestart
    (
        "backoffLimitPerIndex 1",
        set_in(job_spec, "backoffLimitPerIndex", 1),
        SiteRules(),
        ["backoff-limit-per-index"],
    ),
    (
        "backoffLimitPerIndex 0",
        set_in(job_spec, "backoffLimitPerIndex", 0),
        SiteRules(),
        ["backoff-limit-per-index"],
    ),
    ("backoffLimitPerIndex null", set_in(job_spec, "backoffLimitPerIndex", None), SiteRules(), []),
    # the node container
    (
        "container renamed",
        lambda rt: pod_spec(rt)["containers"][0].update(name="trainer"),
        SiteRules(),
        ["no-node-container"],
    ),
    ("containers absent", delete_in(pod_spec, "containers"), SiteRules(), ["no-node-container"]),
    (
        "node only as an init container",
        lambda rt: pod_spec(rt).update(initContainers=pod_spec(rt).pop("containers")),
        SiteRules(),
        ["no-node-container"],
    ),
    (
        "node among several containers",
        lambda rt: pod_spec(rt)["containers"].insert(0, {"name": "sidecar"}),
        SiteRules(),
        [],
    ),
    # publish via initContainer
    ("publish via env needs no init container", None, SiteRules(publish_via="env"), []),
    (
        "publish init container present",
        set_in(pod_spec, "initContainers", [{"name": "publish-identity"}]),
        VIA_INIT,
        [],
    ),
    ("publish init container missing", None, VIA_INIT, ["no-publish-init-container"]),
    (
        "publish init container named but a regular container",
        lambda rt: pod_spec(rt)["containers"].append({"name": "publish-identity"}),
        VIA_INIT,
        ["no-publish-init-container"],
    ),
    (
        "publish init container with another name",
        set_in(pod_spec, "initContainers", [{"name": "setup"}]),
        VIA_INIT,
        ["no-publish-init-container"],
    ),
    (
        "publish.container left empty",
        set_in(pod_spec, "initContainers", [{"name": "setup"}]),
        SiteRules(publish_via="initContainer"),
        ["no-publish-init-container"],
    ),
    # JobSet failurePolicy: absent fine; maxRestarts 0 or unset; every rule FailJobSet
    ("JobSet failurePolicy absent", None, SiteRules(), []),
    ("JobSet maxRestarts 0", set_in(jobset_spec, "failurePolicy", {"maxRestarts": 0}), SiteRules(), []),
    ("JobSet failurePolicy empty", set_in(jobset_spec, "failurePolicy", {}), SiteRules(), []),
    (
        "JobSet maxRestarts 3",
        set_in(jobset_spec, "failurePolicy", {"maxRestarts": 3}),
        SiteRules(),
        ["jobset-max-restarts"],
    ),
    (
        "JobSet FailJobSet rules",
        set_in(jobset_spec, "failurePolicy", {"rules": [{"action": "FailJobSet"}, {"action": "FailJobSet"}]}),
        SiteRules(),
        [],
    ),
    *[
        (
            f"JobSet rule {action}",
            set_in(jobset_spec, "failurePolicy", {"rules": [{"action": "FailJobSet"}, {"action": action}]}),
            SiteRules(),
            ["jobset-failure-rule-action"],
        )
        for action in (
            "RestartJobSet",
            "RestartJobSetAndIgnoreMaxRestarts",
            "RestartJob",
            "RestartJobAndIgnoreMaxRestarts",
            "failjobset",
        )
    ],
    (
        "JobSet rule without an action",
        set_in(jobset_spec, "failurePolicy", {"rules": [{"name": "r"}]}),
        SiteRules(),
        ["jobset-failure-rule-action"],
    ),
    # a container's own restartPolicy or Restart rule; sidecar init containers are fine
    ("container restartPolicy Never", container_field("restartPolicy", "Never"), SiteRules(), []),
    (
        "container restartPolicy OnFailure",
        container_field("restartPolicy", "OnFailure"),
        SiteRules(),
        ["container-restart-policy"],
    ),
    (
        "container restartPolicy Always",
        container_field("restartPolicy", "Always"),
        SiteRules(),
        ["container-restart-policy"],
    ),
    (
        "container Restart rule for exit code 42",
        container_field("restartPolicyRules", [restart_rule()]),
        SiteRules(),
        ["container-restart-policy"],
    ),
    (
        # The shape the API server admits (it requires a container restartPolicy beside restart rules).
        "container restartPolicy Never with a Restart rule",
        combine(
            container_field("restartPolicy", "Never"),
            container_field("restartPolicyRules", [restart_rule(42)]),
        ),
        SiteRules(),
        ["container-restart-policy"],
    ),
    (
        "restartPolicy and a Restart rule in one container: one reason",
        combine(
            container_field("restartPolicy", "OnFailure"),
            container_field("restartPolicyRules", [restart_rule(), restart_rule(7)]),
        ),
        SiteRules(),
        ["container-restart-policy"],
    ),
    (
        "two containers restarting: one reason each",
        combine(
            lambda rt: pod_spec(rt)["containers"].append({"name": "sidecar", "restartPolicy": "Always"}),
            container_field("restartPolicy", "OnFailure"),
        ),
        SiteRules(),
        ["container-restart-policy", "container-restart-policy"],
    ),
    (
        "restartPolicyRules is not a list",
        container_field("restartPolicyRules", {"action": "Restart"}),
        SiteRules(),
        ["container-restart-policy"],
    ),
    ("empty restartPolicyRules", container_field("restartPolicyRules", []), SiteRules(), []),
    (
        "sidecar init container (restartPolicy Always)",
        set_in(pod_spec, "initContainers", [{"name": "log-shipper", "restartPolicy": "Always"}]),
        SiteRules(),
        [],
    ),
    (
        "init container restartPolicy OnFailure is no sidecar",
        set_in(pod_spec, "initContainers", [{"name": "setup", "restartPolicy": "OnFailure"}]),
        SiteRules(),
        ["container-restart-policy"],
    ),
    (
        "init container with a Restart rule",
        set_in(pod_spec, "initContainers", [{"name": "setup", "restartPolicyRules": [restart_rule()]}]),
        SiteRules(),
        ["container-restart-policy"],
    ),
    # completionMode: unset (JobSet sets Indexed) or Indexed
    ("completionMode Indexed", set_in(job_spec, "completionMode", "Indexed"), SiteRules(), []),
    (
        "completionMode NonIndexed",
        set_in(job_spec, "completionMode", "NonIndexed"),
        SiteRules(),
        ["completion-mode"],
    ),
    (
        "completionMode is case-sensitive",
        set_in(job_spec, "completionMode", "indexed"),
        SiteRules(),
        ["completion-mode"],
    ),
    # FailIndex needs backoffLimitPerIndex (the Job API rejects it otherwise)
    (
        "two FailIndex rules without backoffLimitPerIndex, one reason each",
        pfp("FailIndex", "FailJob", "FailIndex"),
        SiteRules(),
        ["fail-index-without-per-index", "fail-index-without-per-index"],
    ),
    (
        "FailIndex with backoffLimitPerIndex is refused for backoffLimitPerIndex only",
        combine(pfp("FailIndex"), set_in(job_spec, "backoffLimitPerIndex", 0)),
        SiteRules(),
        ["backoff-limit-per-index"],
    ),
    # torch: the trainer job must be named node
    (
        "torch with the trainer job named node",
        set_in(lambda rt: rt["spec"]["mlPolicy"], "torch", {}),
        SiteRules(),
        [],
    ),
    (
        "torch with the trainer job named trainer",
        combine(set_in(lambda rt: rt["spec"]["mlPolicy"], "torch", {}), rename_trainer("trainer")),
        SiteRules(),
        ["torch-trainer-job-name"],
    ),
    (
        "torch with an unnamed trainer job",
        combine(
            set_in(lambda rt: rt["spec"]["mlPolicy"], "torch", {}), delete_in(lambda rt: jobs(rt)[0], "name")
        ),
        SiteRules(),
        ["torch-trainer-job-name"],
    ),
    ("a plain runtime may name its trainer job anything", rename_trainer("trainer"), SiteRules(), []),
    # accepted as they are
    (
        "podGroupPolicy coscheduling",
        set_in(lambda rt: rt["spec"], "podGroupPolicy", {"coscheduling": {"scheduleTimeoutSeconds": 60}}),
        SiteRules(),
        [],
    ),
]


@pytest.mark.parametrize(
    ("mutate", "rules", "expected"),
    [pytest.param(m, r, e, id=name) for name, m, r, e in RULE_CASES],
)
def test_rule(mutate: Mutation | None, rules: SiteRules, expected: list[str]) -> None:
    verdict = judge(mutate, rules)
    assert list(verdict.codes) == expected
    assert verdict.refused is bool(expected)
