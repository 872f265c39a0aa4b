"""Helpers of the runtime-rule tests (runtimes.rules): the spec's example runtime and the mutations that
change one thing in it, so a failing case names the rule that broke. Pure: no database, no cluster."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from runtimes.reasons import DEFAULT_SITE_RULES, TRAINER_ANCESTOR_LABEL, SiteRules, Verdict
from runtimes.rules import check_runtime

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
