"""The runtime rules' per-area checks (pure): mlPolicy, the replicated jobs, the trainer job (restart policy,
backoff, podFailurePolicy, the identity's container), the JobSet failurePolicy and the identity holes, each
appending its reasons in the order of DESIGN.md's table (runtimes.rules runs them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtimes.reasons import (
    ALLOWED_MLPOLICY_KEYS,
    BACKOFF_LIMIT,
    BACKOFF_LIMIT_PER_INDEX,
    COMPLETION_MODE,
    CONTAINER_RESTART_ACTION,
    CONTAINER_RESTART_POLICY,
    EXTRA_REPLICATED_JOB,
    FAIL_INDEX_WITHOUT_PER_INDEX,
    FAILURE_POLICY_PATH,
    INDEXED,
    JOBS_PATH,
    JOBSET_FAIL_ACTION,
    JOBSET_FAILURE_RULE_ACTION,
    JOBSET_MAX_RESTARTS,
    KNOWN_POD_FAILURE_ACTIONS,
    MLPOLICY_UNSUPPORTED,
    NO_NODE_CONTAINER,
    NO_PUBLISH_INIT_CONTAINER,
    NO_TRAINER_JOB,
    NODE_CONTAINER,
    POD_FAILURE_POLICY_IGNORE,
    POD_FAILURE_POLICY_UNKNOWN_ACTION,
    PUBLISH_INIT_CONTAINER,
    RESTART_POLICY,
    SIDECAR_RESTART_POLICY,
    TORCH_TRAINER_JOB,
    TORCH_TRAINER_JOB_NAME,
    Reason,
    SiteRules,
)
from runtimes.rules_messages import add_reason
from runtimes.rules_read import as_list, as_map, found_names, has_named, is_int, is_trainer, show


def check_ml_policy(spec: Mapping[str, Any], reasons: list[Reason]) -> None:
    ml_policy = spec.get("mlPolicy")
    if ml_policy is None:
        return  # no mlPolicy: a plain runtime
    if not isinstance(ml_policy, Mapping):
        add_reason(reasons, MLPOLICY_UNSUPPORTED, "spec.mlPolicy", f"is {show(ml_policy)}, not a mapping")
        return
    extra = [str(k) for k in ml_policy if k not in ALLOWED_MLPOLICY_KEYS]
    if len(extra) == 1:
        add_reason(reasons, MLPOLICY_UNSUPPORTED, f"spec.mlPolicy.{extra[0]}", "is set")
    elif extra:
        add_reason(reasons, MLPOLICY_UNSUPPORTED, "spec.mlPolicy", f"names {', '.join(extra)}")


def _job_name(jobs: list[Any] | tuple[Any, ...], index: int) -> str:
    name = as_map(jobs[index]).get("name")
    return show(name) if isinstance(name, str) else f"{JOBS_PATH}[{index}] (unnamed)"


def check_jobs(raw_jobs: object, trainer_index: int | None, reasons: list[Reason]) -> None:
    jobs = as_list(raw_jobs)
    if trainer_index is None:
        if jobs:
            names = ", ".join(_job_name(jobs, i) for i in range(len(jobs)))
            found = f"({names}) has no job whose template carries the trainer label"
        elif raw_jobs is None or isinstance(raw_jobs, list | tuple):
            found = "is empty or not set, so there is no trainer job"
        else:
            found = f"is {show(raw_jobs)}, not a list, so there is no trainer job"
        add_reason(reasons, NO_TRAINER_JOB, JOBS_PATH, found)
        # Without a trainer job every job would be "extra"; that says nothing the reason above does not.
        return
    trainer = _job_name(jobs, trainer_index)
    for index, job in enumerate(jobs):
        if index == trainer_index:
            continue
        if isinstance(job, Mapping):
            also = " (it carries the trainer label too)" if is_trainer(job) else ""
            found = f"is replicated job {_job_name(jobs, index)}{also}, besides the trainer job {trainer}"
        else:
            shown = "null" if job is None else show(job)
            found = f"is {shown}, not a replicated job, besides the trainer job {trainer}"
        add_reason(reasons, EXTRA_REPLICATED_JOB, f"{JOBS_PATH}[{index}]", found)


def _check_pod_failure_policy(
    policy: object, policy_path: str, waived: bool, reasons: list[Reason]
) -> tuple[bool, list[tuple[str, str]]]:
    """Reports the Ignore rules and returns (an Ignore rule exists, the unknown actions as (path, found)):
    the caller reports those after backoffLimitPerIndex, in the table's order."""
    unknown: list[tuple[str, str]] = []
    pf_rules: object = None
    if isinstance(policy, Mapping):
        pf_rules = policy.get("rules")
        if pf_rules is not None and not isinstance(pf_rules, list | tuple):
            unknown.append((f"{policy_path}.rules", f"is {show(pf_rules)}, so its actions cannot be read"))
    elif policy is not None:
        # What we cannot read may hide an Ignore rule: report it rather than accept it.
        unknown.append((policy_path, f"is {show(policy)}, so its actions cannot be read"))
    has_ignore = False
    for index, rule in enumerate(as_list(pf_rules)):
        path = f"{policy_path}.rules[{index}].action"
        action = as_map(rule).get("action")
        if action == "Ignore":
            has_ignore = True
            add_reason(reasons, POD_FAILURE_POLICY_IGNORE, path, 'is "Ignore"', waived)
        elif not isinstance(action, str) or action not in KNOWN_POD_FAILURE_ACTIONS:
            unknown.append((path, f"is {show(action)}"))
    return has_ignore, unknown


def check_trainer_job(
    index: int, job: Mapping[str, Any], rules: SiteRules, reasons: list[Reason]
) -> tuple[bool, bool, bool]:
    """The trainer job's rules. Returns (states an Ignore rule, states backoffLimitPerIndex, has the
    container the identity is published into) for the warning and the capabilities."""
    job_path = f"{JOBS_PATH}[{index}].template.spec"
    job_spec = as_map(as_map(job.get("template")).get("spec"))
    pod_path = f"{job_path}.template.spec"
    pod_spec = as_map(as_map(job_spec.get("template")).get("spec"))
    waived = rules.allow_rank_restart

    restart_policy = pod_spec.get("restartPolicy")
    if restart_policy != "Never":
        found = "is not set, and JobSet defaults it to OnFailure" if restart_policy is None else None
        add_reason(
            reasons, RESTART_POLICY, f"{pod_path}.restartPolicy", found or f"is {show(restart_policy)}"
        )

    backoff_limit = job_spec.get("backoffLimit")
    if not is_int(backoff_limit, 0):
        found = "is not set, and the Job default is 6" if backoff_limit is None else None
        add_reason(reasons, BACKOFF_LIMIT, f"{job_path}.backoffLimit", found or f"is {show(backoff_limit)}")

    has_ignore, unknown = _check_pod_failure_policy(
        job_spec.get("podFailurePolicy"), f"{job_path}.podFailurePolicy", waived, reasons
    )
    per_index = job_spec.get("backoffLimitPerIndex")
    if per_index is not None:
        add_reason(
            reasons,
            BACKOFF_LIMIT_PER_INDEX,
            f"{job_path}.backoffLimitPerIndex",
            f"is {show(per_index)}",
            waived,
        )
    for path, found in unknown:
        add_reason(reasons, POD_FAILURE_POLICY_UNKNOWN_ACTION, path, found)

    containers = pod_spec.get("containers")
    has_node = has_named(containers, NODE_CONTAINER)
    if not has_node:
        found = (
            "is not set"
            if containers is None
            else f'has no container named "node" ({found_names(containers)})'
        )
        add_reason(reasons, NO_NODE_CONTAINER, f"{pod_path}.containers", found)

    publish_ok = has_node
    if rules.publish_via == PUBLISH_INIT_CONTAINER:
        init_containers = pod_spec.get("initContainers")
        publish_ok = bool(rules.publish_container) and has_named(init_containers, rules.publish_container)
        if not rules.publish_container:
            found = "cannot receive the identity: the site's publish.container names no init container"
            add_reason(reasons, NO_PUBLISH_INIT_CONTAINER, f"{pod_path}.initContainers", found)
        elif not publish_ok:
            named = show(rules.publish_container)
            found = f"has no init container named {named} ({found_names(init_containers)})"
            add_reason(reasons, NO_PUBLISH_INIT_CONTAINER, f"{pod_path}.initContainers", found)
    return has_ignore, per_index is not None, publish_ok


def check_jobset_failure_policy(jobset_spec: Mapping[str, Any], reasons: list[Reason]) -> None:
    policy = jobset_spec.get("failurePolicy")
    if policy is None:
        return  # absent: JobSet fails on the first Job failure, which is what dispatch wants
    if not isinstance(policy, Mapping):
        found = f"is {show(policy)}, so its rules cannot be read"
        add_reason(reasons, JOBSET_FAILURE_RULE_ACTION, FAILURE_POLICY_PATH, found)
        return
    max_restarts = policy.get("maxRestarts")
    if max_restarts is not None and not is_int(max_restarts, 0):
        add_reason(
            reasons, JOBSET_MAX_RESTARTS, f"{FAILURE_POLICY_PATH}.maxRestarts", f"is {show(max_restarts)}"
        )
    js_rules = policy.get("rules")
    if js_rules is not None and not isinstance(js_rules, list | tuple):
        found = f"is {show(js_rules)}, so its actions cannot be read"
        add_reason(reasons, JOBSET_FAILURE_RULE_ACTION, f"{FAILURE_POLICY_PATH}.rules", found)
        return
    for index, rule in enumerate(as_list(js_rules)):
        action = as_map(rule).get("action")
        if action != JOBSET_FAIL_ACTION:
            name = as_map(rule).get("name")
            named = f" (rule {show(name)})" if name is not None else ""
            path = f"{FAILURE_POLICY_PATH}.rules[{index}].action"
            add_reason(reasons, JOBSET_FAILURE_RULE_ACTION, path, f"is {show(action)}{named}")


def _container_restarts(container: Mapping[str, Any], path: str, init: bool) -> list[tuple[str, str]]:
    """The fields by which one container restarts in place, as (path, value) pairs; none for a sidecar."""
    found: list[tuple[str, str]] = []
    policy = container.get("restartPolicy")
    if init and policy == SIDECAR_RESTART_POLICY:
        return found  # a sidecar: restarted on its own, never the rank (and not counted for the pod's phase)
    if policy is not None and policy != "Never":
        found.append((f"{path}.restartPolicy", f"is {show(policy)}"))
    rules = container.get("restartPolicyRules")
    if rules is not None and not isinstance(rules, list | tuple):
        # What we cannot read may hide a Restart rule: report it rather than accept it.
        found.append((f"{path}.restartPolicyRules", f"is {show(rules)}, so its actions cannot be read"))
    for index, rule in enumerate(as_list(rules)):
        if as_map(rule).get("action") == CONTAINER_RESTART_ACTION:
            found.append((f"{path}.restartPolicyRules[{index}].action", 'is "Restart"'))
    return found


def check_identity_holes(
    index: int, job: Mapping[str, Any], ml_policy: Mapping[str, Any], reasons: list[Reason]
) -> None:
    """The four rules after the JobSet ones in DESIGN.md's table; none is waived by allowRankRestart."""
    job_path = f"{JOBS_PATH}[{index}].template.spec"
    job_spec = as_map(as_map(job.get("template")).get("spec"))
    pod_path = f"{job_path}.template.spec"
    pod_spec = as_map(as_map(job_spec.get("template")).get("spec"))

    for field, init in (("initContainers", True), ("containers", False)):
        for i, container in enumerate(as_list(pod_spec.get(field))):
            if not isinstance(container, Mapping):
                continue
            restarts = _container_restarts(container, f"{pod_path}.{field}[{i}]", init)
            if restarts:
                first_path, first = restarts[0]
                more = "".join(f" and {p} {v}" for p, v in restarts[1:])
                name = container.get("name")
                named = f" (container {show(name)})" if isinstance(name, str) else ""
                add_reason(reasons, CONTAINER_RESTART_POLICY, first_path, f"{first}{more}{named}")

    mode = job_spec.get("completionMode")
    if mode is not None and mode != INDEXED:
        add_reason(reasons, COMPLETION_MODE, f"{job_path}.completionMode", f"is {show(mode)}")

    if job_spec.get("backoffLimitPerIndex") is None:
        pf_rules = as_map(job_spec.get("podFailurePolicy")).get("rules")
        for i, rule in enumerate(as_list(pf_rules)):
            if as_map(rule).get("action") == "FailIndex":
                path = f"{job_path}.podFailurePolicy.rules[{i}].action"
                found = f'is "FailIndex" and {job_path}.backoffLimitPerIndex is not set'
                add_reason(reasons, FAIL_INDEX_WITHOUT_PER_INDEX, path, found)

    if ml_policy.get("torch") is not None:
        name = job.get("name")
        if name != TORCH_TRAINER_JOB:
            found = "is not set" if name is None else f"is {show(name)}"
            add_reason(reasons, TORCH_TRAINER_JOB_NAME, f"{JOBS_PATH}[{index}].name", found)
