"""The runtime rules: may dispatch run jobs on this (Cluster)TrainingRuntime?

Pure: no Django, no cluster, no I/O. The rules are spec/runtime-requirements.md; the reason codes are the
table in DESIGN.md and are an API (tests, the dashboard and clients match on them). Every reason is
reported, never just the first, in the order of that table and then in field order.

Input is a runtime as a plain dict (what the API server or yaml.safe_load returns). Nothing here raises on
malformed input: a value of the wrong type counts as absent, except where absent would mean "accepted"
(mlPolicy, podFailurePolicy, JobSet failurePolicy); there a value we cannot read is reported, because the
checker must not accept what it does not understand."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from runtimes.digest import changed_paths, describe_paths, spec_digest
from runtimes.reasons import (
    ALLOWED_MLPOLICY_KEYS,
    BACKOFF_LIMIT,
    BACKOFF_LIMIT_PER_INDEX,
    CAP_GANG_SCHEDULING,
    CAP_MULTI_NODE,
    CAP_PROCS_PER_NODE,
    CAP_RANK_IDENTITY,
    COMPLETION_MODE,
    CONTAINER_RESTART_ACTION,
    CONTAINER_RESTART_POLICY,
    DEFAULT_SITE_RULES,
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
    REVIEW_CONTENT,
    REVIEW_MISSING,
    RUNTIME_CHANGED_SINCE_REVIEW,
    RUNTIME_NOT_ALLOWED,
    RUNTIME_NOT_FOUND,
    SIDECAR_RESTART_POLICY,
    TORCH_TRAINER_JOB,
    TORCH_TRAINER_JOB_NAME,
    TRAINER_ANCESTOR_LABEL,
    TRAINER_ANCESTOR_STEP,
    WAIVABLE_CODES,
    AllowListMiss,
    Capability,
    Reason,
    Review,
    SiteRules,
    Verdict,
    not_allowed_message,
)

_EMPTY: Mapping[str, Any] = MappingProxyType({})


_RERUN = (
    "so a failed rank can rerun under the same DISPATCH_ATTEMPT and one execution can contain a "
    "restarted rank"
)


def _m(value: object) -> Mapping[str, Any]:
    """The value as a mapping, or an empty one: lets lookups chain over malformed input."""
    return value if isinstance(value, Mapping) else _EMPTY


def _list(value: object) -> list[Any] | tuple[Any, ...]:
    return value if isinstance(value, list | tuple) else ()


def _show(value: object) -> str:
    """A field's value for a message: JSON-like for scalars, the type for anything bigger."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def _is_int(value: object, expected: int) -> bool:
    # bool is an int in Python; `backoffLimit: false` is not a stated 0.
    return type(value) is int and value == expected


def runtime_ref(runtime: Mapping[str, Any] | None) -> str:
    """Kind/name (Kind/namespace/name for a namespaced runtime) for messages."""
    if not isinstance(runtime, Mapping):
        return "the runtime"
    meta = _m(runtime.get("metadata"))
    kind = runtime.get("kind") or "runtime"
    name = meta.get("name") or "<unnamed>"
    namespace = meta.get("namespace")
    return f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"


def _replicated_jobs(runtime: Mapping[str, Any]) -> list[Any] | tuple[Any, ...]:
    return _list(_m(_m(_m(runtime.get("spec")).get("template")).get("spec")).get("replicatedJobs"))


def _is_trainer(job: object) -> bool:
    labels = _m(_m(_m(_m(job).get("template")).get("metadata")).get("labels"))
    return labels.get(TRAINER_ANCESTOR_LABEL) == TRAINER_ANCESTOR_STEP


def _trainer_index(jobs: list[Any] | tuple[Any, ...]) -> int | None:
    return next((i for i, job in enumerate(jobs) if isinstance(job, Mapping) and _is_trainer(job)), None)


def find_trainer_job(runtime: Mapping[str, Any]) -> tuple[int, Mapping[str, Any]] | None:
    """The index and replicatedJob of the trainer job: the first whose template carries the trainer
    ancestor label (the label sits on the Job template, not the pod template)."""
    if not isinstance(runtime, Mapping):
        return None
    jobs = _replicated_jobs(runtime)
    index = _trainer_index(jobs)
    return None if index is None else (index, jobs[index])


def trainer_pod_spec(runtime: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The trainer job's pod spec (replicatedJobs[i].template.spec.template.spec), if there is one."""
    found = find_trainer_job(runtime)
    if found is None:
        return None
    pod_spec = _m(_m(_m(found[1].get("template")).get("spec")).get("template")).get("spec")
    return pod_spec if isinstance(pod_spec, Mapping) else None


def _has_named(items: object, name: str) -> bool:
    return any(isinstance(c, Mapping) and c.get("name") == name for c in _list(items))


def _found(items: object) -> str:
    """The names of the containers found, for a message."""
    names = [_show(c.get("name")) for c in _list(items) if isinstance(c, Mapping)]
    return "found " + ", ".join(names) if names else "found none"


def identity_warning_for(ignore_rule: bool, per_index: bool) -> str | None:
    """The allowRankRestart identity warning, naming whichever of the two the trainer job states."""
    stated = " and ".join(
        what
        for what, present in (
            ("a podFailurePolicy Ignore rule", ignore_rule),
            ("backoffLimitPerIndex", per_index),
        )
        if present
    )
    return f"allowRankRestart: the runtime's trainer job states {stated}, {_RERUN}" if stated else None


# Why each rule exists, as the second half of its message ("<path> <what was found>; <why>").
_WHY: Final = {
    MLPOLICY_UNSUPPORTED: (
        "mlPolicy may name nothing but torch besides numNodes "
        "(dispatch runs plain and torch runtimes only: MPI, Flux, JAX, XGBoost and the rest are refused)"
    ),
    NO_TRAINER_JOB: (
        f"the trainer job is the one whose template carries the label {TRAINER_ANCESTOR_LABEL}: "
        f"{TRAINER_ANCESTOR_STEP}, and dispatch runs the ranks in it"
    ),
    EXTRA_REPLICATED_JOB: (
        "the runtime's replicated jobs must be the trainer one and nothing else "
        "(initializers, MPI launchers and other steps were never exercised)"
    ),
    RESTART_POLICY: (
        "the trainer pod must state restartPolicy: Never "
        "(a kubelet restarting a container in place raises neither DISPATCH_ATTEMPT "
        "nor the JobSet restart attempt)"
    ),
    BACKOFF_LIMIT: (
        "the trainer job must state backoffLimit: 0 (with a limit above 0 the Job replaces a failed rank's "
        "pod within one execution, which nothing above the Job shows)"
    ),
    POD_FAILURE_POLICY_IGNORE: (
        "an Ignore rule lets the Job replace a failed rank's pod without failing, "
        "so the rank reruns under the same DISPATCH_ATTEMPT"
    ),
    BACKOFF_LIMIT_PER_INDEX: (
        "backoffLimitPerIndex lets the Job replace a failed rank's pod without failing, "
        "so the rank reruns under the same DISPATCH_ATTEMPT"
    ),
    POD_FAILURE_POLICY_UNKNOWN_ACTION: (
        "every podFailurePolicy rule's action must be FailJob, FailIndex, Count or Ignore "
        "(an unknown action has a meaning dispatch does not understand)"
    ),
    NO_NODE_CONTAINER: (
        'the trainer pod needs a container named "node" (the Trainer and dispatch\'s runtime patch name it)'
    ),
    NO_PUBLISH_INIT_CONTAINER: (
        "under publish.via: initContainer dispatch patches that init container, and the Trainer accepts a "
        "patch naming a missing container, so the job would hold quota with no pods"
    ),
    JOBSET_MAX_RESTARTS: (
        "maxRestarts must be 0 or unset "
        "(dispatch restarts nothing natively: a JobSet restart is recovery the plan never chose)"
    ),
    JOBSET_FAILURE_RULE_ACTION: (
        "every JobSet failurePolicy rule's action must be FailJobSet "
        "(dispatch restarts nothing natively: a JobSet restart is recovery the plan never chose)"
    ),
    CONTAINER_RESTART_POLICY: (
        "a container of the trainer pod must not state its own restartPolicy (other than Never) or a Restart "
        "rule: the kubelet would then rerun the rank in place whatever the pod's restartPolicy says, raising "
        "neither DISPATCH_ATTEMPT nor the JobSet restart attempt (sidecar init containers, restartPolicy: "
        "Always, are fine)"
    ),
    COMPLETION_MODE: (
        "the trainer job must leave completionMode unset (JobSet sets Indexed) or state Indexed: without a "
        "completion index there is no rank"
    ),
    FAIL_INDEX_WITHOUT_PER_INDEX: (
        "the Job API rejects a FailIndex rule without backoffLimitPerIndex, so the Job could never be "
        "created and the job would wait in queued"
    ),
    TORCH_TRAINER_JOB_NAME: (
        "with mlPolicy.torch the Trainer's torch plugin points every rank at <trainjob>-node-0-0 for "
        'rendezvous, so the trainer job must be named "node"'
    ),
}


_WAIVED = " (waived: allowRankRestart is set)"


_WAIVABLE = " (allowRankRestart would waive this)"


def _add(reasons: list[Reason], code: str, path: str, found: str, waived: bool = False) -> None:
    suffix = (_WAIVED if waived else _WAIVABLE) if code in WAIVABLE_CODES else ""
    reasons.append(Reason(code, f"{path} {found}; {_WHY[code]}{suffix}", path, waived))


def _check_ml_policy(spec: Mapping[str, Any], reasons: list[Reason]) -> None:
    ml_policy = spec.get("mlPolicy")
    if ml_policy is None:
        return  # no mlPolicy: a plain runtime
    if not isinstance(ml_policy, Mapping):
        _add(reasons, MLPOLICY_UNSUPPORTED, "spec.mlPolicy", f"is {_show(ml_policy)}, not a mapping")
        return
    extra = [str(k) for k in ml_policy if k not in ALLOWED_MLPOLICY_KEYS]
    if len(extra) == 1:
        _add(reasons, MLPOLICY_UNSUPPORTED, f"spec.mlPolicy.{extra[0]}", "is set")
    elif extra:
        _add(reasons, MLPOLICY_UNSUPPORTED, "spec.mlPolicy", f"names {', '.join(extra)}")


def _job_name(jobs: list[Any] | tuple[Any, ...], index: int) -> str:
    name = _m(jobs[index]).get("name")
    return _show(name) if isinstance(name, str) else f"{JOBS_PATH}[{index}] (unnamed)"


def _check_jobs(raw_jobs: object, trainer_index: int | None, reasons: list[Reason]) -> None:
    jobs = _list(raw_jobs)
    if trainer_index is None:
        if jobs:
            names = ", ".join(_job_name(jobs, i) for i in range(len(jobs)))
            found = f"({names}) has no job whose template carries the trainer label"
        elif raw_jobs is None or isinstance(raw_jobs, list | tuple):
            found = "is empty or not set, so there is no trainer job"
        else:
            found = f"is {_show(raw_jobs)}, not a list, so there is no trainer job"
        _add(reasons, NO_TRAINER_JOB, JOBS_PATH, found)
        # Without a trainer job every job would be "extra"; that says nothing the reason above does not.
        return
    trainer = _job_name(jobs, trainer_index)
    for index, job in enumerate(jobs):
        if index == trainer_index:
            continue
        if isinstance(job, Mapping):
            also = " (it carries the trainer label too)" if _is_trainer(job) else ""
            found = f"is replicated job {_job_name(jobs, index)}{also}, besides the trainer job {trainer}"
        else:
            shown = "null" if job is None else _show(job)
            found = f"is {shown}, not a replicated job, besides the trainer job {trainer}"
        _add(reasons, EXTRA_REPLICATED_JOB, f"{JOBS_PATH}[{index}]", found)


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
            unknown.append((f"{policy_path}.rules", f"is {_show(pf_rules)}, so its actions cannot be read"))
    elif policy is not None:
        # What we cannot read may hide an Ignore rule: report it rather than accept it.
        unknown.append((policy_path, f"is {_show(policy)}, so its actions cannot be read"))
    has_ignore = False
    for index, rule in enumerate(_list(pf_rules)):
        path = f"{policy_path}.rules[{index}].action"
        action = _m(rule).get("action")
        if action == "Ignore":
            has_ignore = True
            _add(reasons, POD_FAILURE_POLICY_IGNORE, path, 'is "Ignore"', waived)
        elif not isinstance(action, str) or action not in KNOWN_POD_FAILURE_ACTIONS:
            unknown.append((path, f"is {_show(action)}"))
    return has_ignore, unknown


def _check_trainer_job(
    index: int, job: Mapping[str, Any], rules: SiteRules, reasons: list[Reason]
) -> tuple[bool, bool, bool]:
    """The trainer job's rules. Returns (states an Ignore rule, states backoffLimitPerIndex, has the
    container the identity is published into) for the warning and the capabilities."""
    job_path = f"{JOBS_PATH}[{index}].template.spec"
    job_spec = _m(_m(job.get("template")).get("spec"))
    pod_path = f"{job_path}.template.spec"
    pod_spec = _m(_m(job_spec.get("template")).get("spec"))
    waived = rules.allow_rank_restart

    restart_policy = pod_spec.get("restartPolicy")
    if restart_policy != "Never":
        found = "is not set, and JobSet defaults it to OnFailure" if restart_policy is None else None
        _add(reasons, RESTART_POLICY, f"{pod_path}.restartPolicy", found or f"is {_show(restart_policy)}")

    backoff_limit = job_spec.get("backoffLimit")
    if not _is_int(backoff_limit, 0):
        found = "is not set, and the Job default is 6" if backoff_limit is None else None
        _add(reasons, BACKOFF_LIMIT, f"{job_path}.backoffLimit", found or f"is {_show(backoff_limit)}")

    has_ignore, unknown = _check_pod_failure_policy(
        job_spec.get("podFailurePolicy"), f"{job_path}.podFailurePolicy", waived, reasons
    )
    per_index = job_spec.get("backoffLimitPerIndex")
    if per_index is not None:
        _add(
            reasons,
            BACKOFF_LIMIT_PER_INDEX,
            f"{job_path}.backoffLimitPerIndex",
            f"is {_show(per_index)}",
            waived,
        )
    for path, found in unknown:
        _add(reasons, POD_FAILURE_POLICY_UNKNOWN_ACTION, path, found)

    containers = pod_spec.get("containers")
    has_node = _has_named(containers, NODE_CONTAINER)
    if not has_node:
        found = (
            "is not set" if containers is None else f'has no container named "node" ({_found(containers)})'
        )
        _add(reasons, NO_NODE_CONTAINER, f"{pod_path}.containers", found)

    publish_ok = has_node
    if rules.publish_via == PUBLISH_INIT_CONTAINER:
        init_containers = pod_spec.get("initContainers")
        publish_ok = bool(rules.publish_container) and _has_named(init_containers, rules.publish_container)
        if not rules.publish_container:
            found = "cannot receive the identity: the site's publish.container names no init container"
            _add(reasons, NO_PUBLISH_INIT_CONTAINER, f"{pod_path}.initContainers", found)
        elif not publish_ok:
            found = (
                f"has no init container named {_show(rules.publish_container)} ({_found(init_containers)})"
            )
            _add(reasons, NO_PUBLISH_INIT_CONTAINER, f"{pod_path}.initContainers", found)
    return has_ignore, per_index is not None, publish_ok


def _check_jobset_failure_policy(jobset_spec: Mapping[str, Any], reasons: list[Reason]) -> None:
    policy = jobset_spec.get("failurePolicy")
    if policy is None:
        return  # absent: JobSet fails on the first Job failure, which is what dispatch wants
    if not isinstance(policy, Mapping):
        found = f"is {_show(policy)}, so its rules cannot be read"
        _add(reasons, JOBSET_FAILURE_RULE_ACTION, FAILURE_POLICY_PATH, found)
        return
    max_restarts = policy.get("maxRestarts")
    if max_restarts is not None and not _is_int(max_restarts, 0):
        _add(reasons, JOBSET_MAX_RESTARTS, f"{FAILURE_POLICY_PATH}.maxRestarts", f"is {_show(max_restarts)}")
    js_rules = policy.get("rules")
    if js_rules is not None and not isinstance(js_rules, list | tuple):
        found = f"is {_show(js_rules)}, so its actions cannot be read"
        _add(reasons, JOBSET_FAILURE_RULE_ACTION, f"{FAILURE_POLICY_PATH}.rules", found)
        return
    for index, rule in enumerate(_list(js_rules)):
        action = _m(rule).get("action")
        if action != JOBSET_FAIL_ACTION:
            name = _m(rule).get("name")
            named = f" (rule {_show(name)})" if name is not None else ""
            path = f"{FAILURE_POLICY_PATH}.rules[{index}].action"
            _add(reasons, JOBSET_FAILURE_RULE_ACTION, path, f"is {_show(action)}{named}")


def _container_restarts(container: Mapping[str, Any], path: str, init: bool) -> list[tuple[str, str]]:
    """The fields by which one container restarts in place, as (path, value) pairs; none for a sidecar."""
    found: list[tuple[str, str]] = []
    policy = container.get("restartPolicy")
    if init and policy == SIDECAR_RESTART_POLICY:
        return found  # a sidecar: restarted on its own, never the rank (and not counted for the pod's phase)
    if policy is not None and policy != "Never":
        found.append((f"{path}.restartPolicy", f"is {_show(policy)}"))
    rules = container.get("restartPolicyRules")
    if rules is not None and not isinstance(rules, list | tuple):
        # What we cannot read may hide a Restart rule: report it rather than accept it.
        found.append((f"{path}.restartPolicyRules", f"is {_show(rules)}, so its actions cannot be read"))
    for index, rule in enumerate(_list(rules)):
        if _m(rule).get("action") == CONTAINER_RESTART_ACTION:
            found.append((f"{path}.restartPolicyRules[{index}].action", 'is "Restart"'))
    return found


def _check_identity_holes(
    index: int, job: Mapping[str, Any], ml_policy: Mapping[str, Any], reasons: list[Reason]
) -> None:
    """The four rules after the JobSet ones in DESIGN.md's table; none is waived by allowRankRestart."""
    job_path = f"{JOBS_PATH}[{index}].template.spec"
    job_spec = _m(_m(job.get("template")).get("spec"))
    pod_path = f"{job_path}.template.spec"
    pod_spec = _m(_m(job_spec.get("template")).get("spec"))

    for field, init in (("initContainers", True), ("containers", False)):
        for i, container in enumerate(_list(pod_spec.get(field))):
            if not isinstance(container, Mapping):
                continue
            restarts = _container_restarts(container, f"{pod_path}.{field}[{i}]", init)
            if restarts:
                first_path, first = restarts[0]
                more = "".join(f" and {p} {v}" for p, v in restarts[1:])
                name = container.get("name")
                named = f" (container {_show(name)})" if isinstance(name, str) else ""
                _add(reasons, CONTAINER_RESTART_POLICY, first_path, f"{first}{more}{named}")

    mode = job_spec.get("completionMode")
    if mode is not None and mode != INDEXED:
        _add(reasons, COMPLETION_MODE, f"{job_path}.completionMode", f"is {_show(mode)}")

    if job_spec.get("backoffLimitPerIndex") is None:
        pf_rules = _m(job_spec.get("podFailurePolicy")).get("rules")
        for i, rule in enumerate(_list(pf_rules)):
            if _m(rule).get("action") == "FailIndex":
                path = f"{job_path}.podFailurePolicy.rules[{i}].action"
                found = f'is "FailIndex" and {job_path}.backoffLimitPerIndex is not set'
                _add(reasons, FAIL_INDEX_WITHOUT_PER_INDEX, path, found)

    if ml_policy.get("torch") is not None:
        name = job.get("name")
        if name != TORCH_TRAINER_JOB:
            found = "is not set" if name is None else f"is {_show(name)}"
            _add(reasons, TORCH_TRAINER_JOB_NAME, f"{JOBS_PATH}[{index}].name", found)


# Capabilities that do not depend on the runtime's values are built once (the checker is on hot paths).
_PPN_YES = Capability(
    CAP_PROCS_PER_NODE,
    True,
    "the runtime has mlPolicy.torch, so the Trainer applies the job's procs per node",
)


_PPN_NO = Capability(
    CAP_PROCS_PER_NODE, False, "the runtime has no mlPolicy.torch, so the Trainer would ignore procs per node"
)


_MULTI_NO = Capability(CAP_MULTI_NODE, False, "the runtime has no trainer job, so there is nothing to scale")


_IDENTITY_ENV_YES = Capability(
    CAP_RANK_IDENTITY,
    True,
    'DISPATCH_JOB and DISPATCH_ATTEMPT are published as env into container "node" of the trainer job; the '
    "rank is the completion index",
)


_IDENTITY_ENV_NO = Capability(
    CAP_RANK_IDENTITY, False, 'the trainer pod has no container "node" to publish the identity into'
)


_GANG_NO = Capability(
    CAP_GANG_SCHEDULING,
    False,
    "the runtime has no spec.podGroupPolicy, so ranks are scheduled one by one, not as a group",
)


def _capabilities(
    ml_policy: Mapping[str, Any],
    spec: Mapping[str, Any],
    has_trainer: bool,
    publish_ok: bool,
    rules: SiteRules,
) -> tuple[Capability, ...]:
    procs = _PPN_YES if isinstance(ml_policy.get("torch"), Mapping) else _PPN_NO
    if has_trainer:
        num_nodes = ml_policy.get("numNodes")
        default = num_nodes if type(num_nodes) is int else 1  # the Trainer treats an unset numNodes as 1
        multi = Capability(
            CAP_MULTI_NODE,
            True,
            f"the job's numNodes sets how many pods the trainer job runs (runtime default: {default})",
        )
    else:
        multi = _MULTI_NO
    if rules.publish_via == PUBLISH_INIT_CONTAINER:
        target = _show(rules.publish_container)
        identity = Capability(
            CAP_RANK_IDENTITY,
            publish_ok,
            f"DISPATCH_JOB and DISPATCH_ATTEMPT are published into init container {target} of the trainer "
            "job; the rank is the completion index"
            if publish_ok
            else f"the trainer pod has no init container {target} to publish the identity into",
        )
    else:
        identity = _IDENTITY_ENV_YES if publish_ok else _IDENTITY_ENV_NO
    group_policy = _m(spec.get("podGroupPolicy"))
    plugins = [k for k in ("coscheduling", "volcano") if k in group_policy]
    if plugins:
        gang = Capability(
            CAP_GANG_SCHEDULING,
            True,
            f"spec.podGroupPolicy.{plugins[0]}: the Trainer creates a PodGroup, so all ranks are scheduled "
            "together or not at all",
        )
    else:
        gang = _GANG_NO
    return procs, multi, identity, gang


def _missing_capabilities(ref: str) -> tuple[Capability, ...]:
    why = f"{ref} does not exist in the cluster"
    return tuple(
        Capability(name, False, why)
        for name in (CAP_PROCS_PER_NODE, CAP_MULTI_NODE, CAP_RANK_IDENTITY, CAP_GANG_SCHEDULING)
    )


def _check_review(runtime: Mapping[str, Any], review: Review, ref: str, reasons: list[Reason]) -> None:
    """A runtime on the allow-list is matched by name; its content must still be what was reviewed."""
    again = (
        "it runs again once a platform user re-approves it "
        "(Runtimes page, or POST /api/v1/runtimes/allow-list)"
    )
    if review.state == REVIEW_MISSING:
        message = (
            f"{ref} could not be read when it was allow-listed{_by(review)}, so nobody reviewed its content; "
            + again
        )
        reasons.append(Reason(RUNTIME_CHANGED_SINCE_REVIEW, message, "spec"))
        return
    if review.state != REVIEW_CONTENT or spec_digest(runtime) == review.spec_hash:
        return
    paths = [f"spec.{p}" for p in changed_paths(review.spec or {}, _m(runtime.get("spec")))] or ["spec"]
    message = (
        f"{ref} changed since it was reviewed{_by(review)}: {describe_paths(paths)} "
        f"{'differs' if len(paths) == 1 else 'differ'} from the reviewed spec; " + again
    )
    reasons.append(Reason(RUNTIME_CHANGED_SINCE_REVIEW, message, paths[0]))


def _by(review: Review) -> str:
    return f" ({review.reviewed})" if review.reviewed else ""


def check_runtime(
    runtime: Mapping[str, Any] | None,
    *,
    rules: SiteRules = DEFAULT_SITE_RULES,
    allow_listed: bool | AllowListMiss | None = None,
    ref: str = "",
    review: Review | None = None,
) -> Verdict:
    """Judge a runtime against every rule.

    runtime: the whole object as a plain dict, or None when it does not exist in the cluster.
    allow_listed: None when the allow-list does not apply (file mode); True when the runtime is on it;
        False, or an AllowListMiss saying why (the list is empty, listed for the other purpose), when not.
    ref: how to name the runtime in messages, e.g. "ClusterTrainingRuntime/foo" (derived when empty).
    review: what the allow-list entry recorded when the runtime was reviewed (None: not compared); a spec
        that no longer has the reviewed digest is runtime-changed-since-review, naming the changed paths.
    """
    reasons: list[Reason] = []
    if runtime is not None and not isinstance(runtime, Mapping):
        runtime = _EMPTY  # not an object at all: judged as a runtime with nothing in it
    ref = ref or runtime_ref(runtime)
    if allow_listed is False or isinstance(allow_listed, AllowListMiss):
        miss = allow_listed if isinstance(allow_listed, AllowListMiss) else AllowListMiss()
        reasons.append(Reason(RUNTIME_NOT_ALLOWED, not_allowed_message(ref, miss), "metadata.name"))
    if runtime is None:
        reasons.append(Reason(RUNTIME_NOT_FOUND, f"{ref} does not exist in the cluster", ""))
        return Verdict(True, tuple(reasons), None, _missing_capabilities(ref))

    if review is not None:
        _check_review(runtime, review, ref, reasons)
    spec = _m(runtime.get("spec"))
    _check_ml_policy(spec, reasons)

    jobset_spec = _m(_m(spec.get("template")).get("spec"))
    raw_jobs = jobset_spec.get("replicatedJobs")
    jobs = _list(raw_jobs)
    trainer_index = _trainer_index(jobs)
    _check_jobs(raw_jobs, trainer_index, reasons)
    ignore_rule = per_index = publish_ok = False
    if trainer_index is not None:
        ignore_rule, per_index, publish_ok = _check_trainer_job(
            trainer_index, jobs[trainer_index], rules, reasons
        )

    _check_jobset_failure_policy(jobset_spec, reasons)
    if trainer_index is not None:
        _check_identity_holes(trainer_index, jobs[trainer_index], _m(spec.get("mlPolicy")), reasons)

    refused = any(not r.waived for r in reasons)
    warning = identity_warning_for(ignore_rule, per_index) if rules.allow_rank_restart else None
    capabilities = _capabilities(_m(spec.get("mlPolicy")), spec, trainer_index is not None, publish_ok, rules)
    return Verdict(refused, tuple(reasons), warning, capabilities)
