"""What each refusal reason code means and the fix that clears it: the one table the dashboard shows.

Pure data keyed by the codes in runtimes.reasons (the runtime rules) and jobs.plan (the start-only checks);
tests/api/test_dashboard_refusals.py asserts that every code has an entry. `fix_for` still answers for a
code the table does not know (a newer dispatch wrote it), naming the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from runtimes import reasons


@dataclass(frozen=True)
class Fix:
    code: str
    meaning: str  # what the rule protects, in one sentence
    fix: str  # what the runtime author (or the submitter, for start-only codes) changes
    who: str  # "runtime author", "platform team" or "submitter"


# Start-only codes (jobs.plan): named here as strings, since jobs imports runtimes and not the reverse.
NAMESPACE_NOT_GRANTED: Final = "namespace-not-granted"
PROCS_PER_NODE_UNSUPPORTED: Final = "procs-per-node-unsupported"
NAME_TOO_LONG: Final = "name-too-long"
QUEUE_NOT_FOUND: Final = "queue-not-found"
PRIORITY_CLASS_NOT_ALLOWED: Final = "priority-class-not-allowed"
RESOURCES_INVALID: Final = "resources-invalid"
QUEUE_OVER_CAPACITY: Final = "queue-over-capacity"

_AUTHOR = "runtime author"

FIXES: Final[dict[str, Fix]] = {
    fix.code: fix
    for fix in (
        Fix(
            reasons.RUNTIME_NOT_ALLOWED,
            "Nobody on the platform team has reviewed this runtime for this purpose (jobs or sessions).",
            "Ask the platform team to review the runtime and add it to the allow-list on the Runtimes page.",
            "platform team",
        ),
        Fix(
            reasons.RUNTIME_CHANGED_SINCE_REVIEW,
            "The allow-list approved this runtime's spec as a platform user reviewed it; the spec has "
            "changed since (the message names the field paths), so what would run is not what was reviewed.",
            "Review the changes and re-approve the runtime (Runtimes page, or POST "
            "/api/v1/runtimes/allow-list again), which records the new spec; or undo the change.",
            "platform team",
        ),
        Fix(
            reasons.RUNTIME_NOT_FOUND,
            "The runtime the job names does not exist in the cluster.",
            "Create the runtime (or correct runtime.kind / runtime.name / runtime.namespace in the job).",
            _AUTHOR,
        ),
        Fix(
            reasons.MLPOLICY_UNSUPPORTED,
            "dispatch runs plain and torch runtimes only; MPI, Flux, JAX and XGBoost policies were never "
            "exercised.",
            "Remove every mlPolicy key but numNodes and torch (spec.mlPolicy).",
            _AUTHOR,
        ),
        Fix(
            reasons.NO_TRAINER_JOB,
            "No replicated job is marked as the trainer, so dispatch cannot tell which pods are ranks.",
            "Label the trainer replicated job's template: "
            "metadata.labels[trainer.kubeflow.org/trainjob-ancestor-step]: trainer.",
            _AUTHOR,
        ),
        Fix(
            reasons.EXTRA_REPLICATED_JOB,
            "A replicated job besides the trainer one runs steps dispatch never exercised.",
            "Remove the other replicated jobs (initializers, launchers) from "
            "spec.template.spec.replicatedJobs.",
            _AUTHOR,
        ),
        Fix(
            reasons.RESTART_POLICY,
            "A kubelet restarting a rank's container in place reruns it under the same identity.",
            "Set restartPolicy: Never on the trainer pod template "
            "(replicatedJobs[trainer].template.spec.template.spec.restartPolicy).",
            _AUTHOR,
        ),
        Fix(
            reasons.BACKOFF_LIMIT,
            "With a backoff limit above 0 the Job replaces a failed rank's pod within one execution.",
            "Set backoffLimit: 0 on the trainer job (replicatedJobs[trainer].template.spec.backoffLimit).",
            _AUTHOR,
        ),
        Fix(
            reasons.POD_FAILURE_POLICY_IGNORE,
            "An Ignore rule lets the Job replace a failed rank's pod without failing.",
            "Remove the Ignore rule from podFailurePolicy (or use FailJob / Count); the platform team may "
            "waive it with allowRankRestart.",
            _AUTHOR,
        ),
        Fix(
            reasons.BACKOFF_LIMIT_PER_INDEX,
            "backoffLimitPerIndex lets the Job replace a failed rank's pod without failing.",
            "Remove backoffLimitPerIndex from the trainer job; the platform team may waive it with "
            "allowRankRestart.",
            _AUTHOR,
        ),
        Fix(
            reasons.POD_FAILURE_POLICY_UNKNOWN_ACTION,
            "A podFailurePolicy rule has an action dispatch does not understand.",
            "Use only FailJob, FailIndex, Count or Ignore as podFailurePolicy rule actions.",
            _AUTHOR,
        ),
        Fix(
            reasons.NO_NODE_CONTAINER,
            'The Trainer and dispatch patch the container named "node"; without it nothing runs the job.',
            'Name the trainer pod\'s main container "node".',
            _AUTHOR,
        ),
        Fix(
            reasons.NO_PUBLISH_INIT_CONTAINER,
            "Under publish.via: initContainer dispatch patches an init container the pod does not have.",
            "Add the init container named in the site's publish.container to the trainer pod, or ask the "
            "platform team to publish via env.",
            _AUTHOR,
        ),
        Fix(
            reasons.JOBSET_MAX_RESTARTS,
            "A JobSet restart is recovery the plan never chose.",
            "Remove spec.template.spec.failurePolicy.maxRestarts or set it to 0; dispatch's recovery "
            "policy retries instead.",
            _AUTHOR,
        ),
        Fix(
            reasons.JOBSET_FAILURE_RULE_ACTION,
            "A JobSet failure rule other than FailJobSet restarts or ignores failures natively.",
            "Set every spec.template.spec.failurePolicy.rules[].action to FailJobSet.",
            _AUTHOR,
        ),
        Fix(
            reasons.CONTAINER_RESTART_POLICY,
            "A container's own restartPolicy (or Restart rule) makes the kubelet rerun the rank in place.",
            "Remove restartPolicy / restartPolicyRules from the trainer pod's containers (or state Never); "
            "sidecar init containers with restartPolicy: Always may stay.",
            _AUTHOR,
        ),
        Fix(
            reasons.COMPLETION_MODE,
            "Without an Indexed completion mode a pod has no completion index, so there is no rank.",
            "Remove completionMode from the trainer job (JobSet sets Indexed) or set it to Indexed.",
            _AUTHOR,
        ),
        Fix(
            reasons.FAIL_INDEX_WITHOUT_PER_INDEX,
            "The Job API rejects a FailIndex rule without backoffLimitPerIndex: the job could never start.",
            "Replace the FailIndex action with FailJob (or add backoffLimitPerIndex, which needs "
            "allowRankRestart).",
            _AUTHOR,
        ),
        Fix(
            reasons.TORCH_TRAINER_JOB_NAME,
            "The torch plugin points every rank at <trainjob>-node-0-0 for rendezvous.",
            'Name the trainer replicated job "node" when mlPolicy.torch is set.',
            _AUTHOR,
        ),
        Fix(
            NAMESPACE_NOT_GRANTED,
            "The submitter may not create jobs in that namespace.",
            "Submit to a namespace you are granted, or ask the platform team for a grant.",
            "submitter",
        ),
        Fix(
            PROCS_PER_NODE_UNSUPPORTED,
            "procs_per_node needs mlPolicy.torch; any other runtime would silently ignore it.",
            "Drop procs_per_node from the job, or pick a runtime with mlPolicy.torch.",
            "submitter",
        ),
        Fix(
            NAME_TOO_LONG,
            "A JobSet pod name would exceed 63 characters, so the pods could never be created.",
            "Use fewer nodes, or a runtime whose trainer replicated job has a shorter name.",
            _AUTHOR,
        ),
        Fix(
            QUEUE_NOT_FOUND,
            "The Kueue LocalQueue the job names (or its namespace's default queue) does not exist in the "
            "job's namespace, or Kueue is not installed: Kueue would never admit the job.",
            "Name an existing LocalQueue of the namespace in queue_name (kubectl get localqueues -n "
            "<namespace>), or ask the platform team to create it or to correct the namespace's default queue "
            "in the site settings.",
            "submitter",
        ),
        Fix(
            PRIORITY_CLASS_NOT_ALLOWED,
            "A priority class decides whom Kueue preempts, so a job may ask only for a WorkloadPriorityClass "
            "the platform allows in its namespace (and only with a queue).",
            "Ask for a class the site settings allow in the namespace, or none; ask the platform team to "
            "allow one (site settings: Kueue priority classes per namespace).",
            "submitter",
        ),
        Fix(
            RESOURCES_INVALID,
            "The Job API would refuse the job's pods (e.g. nvidia.com/gpu requested without an equal limit), "
            "so its JobSet could never create them and the job would wait for ever.",
            "Correct the field the reason names: give an extended resource (nvidia.com/gpu) a limit equal to "
            "its request in resources_per_node, keep requests at most their limits; a runtime container's "
            "resources are the runtime author's to correct.",
            "submitter",
        ),
        Fix(
            QUEUE_OVER_CAPACITY,
            "The job asks more in total than its ClusterQueue can ever admit (nominal quota plus borrowing "
            "limit, in one flavor), so Kueue would keep it pending for ever.",
            "Ask for fewer nodes or less per node, or use a queue whose ClusterQueue is large enough; the "
            "platform team can raise the ClusterQueue's quota or borrowing limit.",
            "submitter",
        ),
    )
}


def fix_for(code: str) -> Fix:
    """The table's row; a code the table does not know (a newer dispatch wrote it) still gets a row."""
    return FIXES.get(code) or Fix(code, f"refusal code {code}", "See the reason's message.", _AUTHOR)
