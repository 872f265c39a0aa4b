"""The runtime rules' messages (pure): why each rule exists, the waiver suffixes, and the allowRankRestart
identity warning (runtimes.rules)."""

from __future__ import annotations

from typing import Final

from runtimes.reasons import (
    BACKOFF_LIMIT,
    BACKOFF_LIMIT_PER_INDEX,
    COMPLETION_MODE,
    CONTAINER_RESTART_POLICY,
    EXTRA_REPLICATED_JOB,
    FAIL_INDEX_WITHOUT_PER_INDEX,
    JOBSET_FAILURE_RULE_ACTION,
    JOBSET_MAX_RESTARTS,
    MLPOLICY_UNSUPPORTED,
    NO_NODE_CONTAINER,
    NO_PUBLISH_INIT_CONTAINER,
    NO_TRAINER_JOB,
    POD_FAILURE_POLICY_IGNORE,
    POD_FAILURE_POLICY_UNKNOWN_ACTION,
    RESTART_POLICY,
    TORCH_TRAINER_JOB_NAME,
    TRAINER_ANCESTOR_LABEL,
    TRAINER_ANCESTOR_STEP,
    WAIVABLE_CODES,
    Reason,
)

_RERUN = (
    "so a failed rank can rerun under the same DISPATCH_ATTEMPT and one execution can contain a "
    "restarted rank"
)


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


def add_reason(reasons: list[Reason], code: str, path: str, found: str, waived: bool = False) -> None:
    suffix = (_WAIVED if waived else _WAIVABLE) if code in WAIVABLE_CODES else ""
    reasons.append(Reason(code, f"{path} {found}; {_WHY[code]}{suffix}", path, waived))
