"""The runtime rules (runtimes.rules): one table of cases per rule, then the rules together.

Every case starts from the spec's example runtime (which passes) and changes one thing, so a failing case
names the rule that broke. Pure: no database, no cluster.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from runtimes.reasons import (
    DEFAULT_SITE_RULES,
    TRAINER_ANCESTOR_LABEL,
    AllowListMiss,
    Reason,
    SiteRules,
    Verdict,
)
from runtimes.rules import check_runtime, find_trainer_job, trainer_pod_spec

FIXTURES = Path(__file__).parents[1] / "fixtures"
EXAMPLE: dict[str, Any] = yaml.safe_load((FIXTURES / "dispatch-kind.yaml").read_text())

JOB0 = "spec.template.spec.replicatedJobs[0].template.spec"
POD0 = f"{JOB0}.template.spec"
ALLOW = SiteRules(allow_rank_restart=True)
VIA_INIT = SiteRules(publish_via="initContainer", publish_container="publish-identity")

Mutation = Callable[[dict[str, Any]], None]


def example() -> dict[str, Any]:
    return copy.deepcopy(EXAMPLE)


def jobs(rt: dict[str, Any]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = rt["spec"]["template"]["spec"]["replicatedJobs"]
    return result


def job_spec(rt: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = jobs(rt)[0]["template"]["spec"]
    return result


def pod_spec(rt: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = job_spec(rt)["template"]["spec"]
    return result


def jobset_spec(rt: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = rt["spec"]["template"]["spec"]
    return result


def extra_job(name: str, label: str | None = None) -> dict[str, Any]:
    job: dict[str, Any] = {
        "name": name,
        "template": {
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": name}]}}}
        },
    }
    if label is not None:
        job["template"]["metadata"] = {"labels": {TRAINER_ANCESTOR_LABEL: label}}
    return job


def pfp(*actions: Any) -> Mutation:
    def mutate(rt: dict[str, Any]) -> None:
        job_spec(rt)["podFailurePolicy"] = {
            "rules": [{"action": a, "onPodConditions": [{"type": "DisruptionTarget"}]} for a in actions]
        }

    return mutate


def set_in(getter: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any) -> Mutation:
    def mutate(rt: dict[str, Any]) -> None:
        getter(rt)[key] = value

    return mutate


def delete_in(getter: Callable[[dict[str, Any]], dict[str, Any]], key: str) -> Mutation:
    def mutate(rt: dict[str, Any]) -> None:
        del getter(rt)[key]

    return mutate


def container_field(key: str, value: Any) -> Mutation:
    """Sets a field on the trainer pod's container "node" (containers[0])."""
    return set_in(lambda rt: pod_spec(rt)["containers"][0], key, value)


def restart_rule(*codes: int) -> dict[str, Any]:
    """A container restart rule (Kubernetes ContainerRestartRule): restart in place on these exit codes."""
    return {"action": "Restart", "exitCodes": {"operator": "In", "values": list(codes or (42,))}}


def rename_trainer(name: str) -> Mutation:
    return set_in(lambda rt: jobs(rt)[0], "name", name)


def combine(*mutations: Mutation) -> Mutation:
    def mutate(rt: dict[str, Any]) -> None:
        for change in mutations:
            change(rt)

    return mutate


def judge(mutate: Mutation | None = None, rules: SiteRules = DEFAULT_SITE_RULES, **kwargs: Any) -> Verdict:
    rt = example()
    if mutate is not None:
        mutate(rt)
    return check_runtime(rt, rules=rules, **kwargs)


def reason(verdict: Verdict, code: str) -> Reason:
    matches = [r for r in verdict.reasons if r.code == code]
    assert len(matches) == 1, f"expected one {code}, got {verdict.codes}"
    return matches[0]


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


# --- several reasons at once: all of them, in DESIGN.md's table order


def break_everything(rt: dict[str, Any]) -> None:
    rt["spec"]["mlPolicy"]["mpi"] = {}
    jobs(rt).append(extra_job("launcher"))
    pod_spec(rt)["restartPolicy"] = "OnFailure"
    del job_spec(rt)["backoffLimit"]
    pfp("Retry", "Ignore", "FailJob")(rt)
    job_spec(rt)["backoffLimitPerIndex"] = 1
    pod_spec(rt)["containers"][0]["name"] = "main"
    jobset_spec(rt)["failurePolicy"] = {
        "maxRestarts": 2,
        "rules": [{"action": "RestartJobSet"}, {"action": "FailJobSet"}, {"action": "RestartJob"}],
    }


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
