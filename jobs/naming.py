"""Names of what a job creates. Pure.

Names are deterministic from (job, attempt): a retried submission finds "already exists" instead of
creating a second TrainJob. The JobSet the Trainer builds is named after the TrainJob, and JobSet's webhook
rejects a JobSet whose longest pod name exceeds 63 characters (trainer-facts §4), which would only show up
as an event after the TrainJob exists; longest_pod_name lets start refuse it first.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any, Final

from runtimes.reasons import TRAINER_ANCESTOR_LABEL

POD_NAME_LIMIT: Final = 63
# The prefix of the labels dispatch puts on what it creates, unless the platform sets another (SiteSettings).
# The label by which a TrainJob names its Kueue LocalQueue (a job's queue_name).
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_MARK: Final = "kueue-deactivated"  # dispatch's annotation on a Workload it deactivated: <domain>/<this>


def kueue_mark_key(label_domain: str) -> str:
    return f"{label_domain}/{KUEUE_MARK}"


# The label by which a TrainJob names its Kueue WorkloadPriorityClass (a job's priority_class).
KUEUE_PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"
JOB_ID_PREFIX: Final = "j"
JOB_ID_RANDOM_CHARS: Final = 10  # 50 bits
_BASE32: Final = "abcdefghijklmnopqrstuvwxyz234567"  # RFC 4648 alphabet, lowercased: valid in DNS names
_JOB_ID_PATTERN: Final = rf"{JOB_ID_PREFIX}[a-z2-7]{{{JOB_ID_RANDOM_CHARS}}}"
_JOB_ID = re.compile(rf"^{_JOB_ID_PATTERN}$")
# A TrainJob name "<job id>-<attempt>", alone or at the start of a child's name (JobSet, Job, pod).
_TRAINJOB_PREFIX = re.compile(rf"^({_JOB_ID_PATTERN}-\d+)(?:-|$)")
# The Job controller appends "-<5 random chars>" to "<job>-<completion index>" for an Indexed Job's pod.
POD_SUFFIX: Final = "-abcde"
# Ancestor steps whose replicatedJob the Trainer forces to replicas: 1 (trainer-facts §5).
_SINGLE_REPLICA_STEPS: Final = frozenset({"trainer", "dataset-initializer", "model-initializer"})


def new_job_id() -> str:
    """A job's public id: "j" + 10 base32 chars. It starts with a letter, so the TrainJob name
    "<id>-<attempt>" is a valid RFC 1035 label.

    The 50 random bits are drawn at once (one read of the OS's randomness, not one per character: 16 -> 2 us)
    and written five bits to a character."""
    bits = secrets.randbits(5 * JOB_ID_RANDOM_CHARS)
    return JOB_ID_PREFIX + "".join(_BASE32[(bits >> (5 * i)) & 31] for i in range(JOB_ID_RANDOM_CHARS))


def is_job_id(value: str) -> bool:
    return bool(_JOB_ID.fullmatch(value))


def trainjob_name_prefix(name: str) -> str | None:
    """The TrainJob name an object's name starts with ("j...-2" of "j...-2-node-0-1-abcde"), else None."""
    match = _TRAINJOB_PREFIX.match(name)
    return match.group(1) if match else None


def trainjob_name(job_id: str, attempt: int) -> str:
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    return f"{job_id}-{attempt}"


def runtime_copy_name(trainjob_name: str) -> str:
    """The TrainingRuntime copy is named like its TrainJob (a different kind, so no clash)."""
    return trainjob_name


def _m(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _positive_int(value: object, default: int) -> int:
    # bool is an int; a malformed count falls back to what Kubernetes would default it to.
    return value if type(value) is int and value >= 1 else default


def pod_counts(runtime: Mapping[str, Any], num_nodes: int | None) -> list[tuple[str, int, int]]:
    """(replicatedJob name, Job replicas, pods per Job) for every replicatedJob, as the Trainer builds them.

    The trainer-ancestor job runs the job's num_nodes pods (else the runtime's mlPolicy.numNodes, else 1);
    for MPI, rJob `node` runs numNodes pods (numNodes - 1 with runLauncherAsNode); others run their
    `parallelism` (default 1). Ancestor jobs have one replica; others keep `replicas` (default 1).
    """
    spec = _m(runtime.get("spec"))
    ml_policy = spec.get("mlPolicy")
    ml = _m(ml_policy)
    runtime_nodes = _positive_int(ml.get("numNodes"), 1)
    nodes = num_nodes if num_nodes is not None else runtime_nodes
    mpi = ml.get("mpi")
    jobs = _m(_m(spec.get("template")).get("spec")).get("replicatedJobs")
    counts: list[tuple[str, int, int]] = []
    for job in jobs if isinstance(jobs, list | tuple) else ():
        if not isinstance(job, Mapping):
            continue
        name = str(job.get("name", ""))
        template = _m(job.get("template"))
        step = _m(_m(template.get("metadata")).get("labels")).get(TRAINER_ANCESTOR_LABEL)
        replicas = 1 if step in _SINGLE_REPLICA_STEPS else _positive_int(job.get("replicas"), 1)
        pods = _positive_int(_m(template.get("spec")).get("parallelism"), 1)
        if isinstance(mpi, Mapping) and name == "node":
            pods = max(nodes - 1, 1) if mpi.get("runLauncherAsNode") is True else nodes
        elif step == "trainer" and (ml_policy is not None or num_nodes is not None):
            # Without an mlPolicy the runtime's parallelism stands unless the job sets numNodes.
            pods = nodes
        counts.append((name, replicas, pods))
    return counts


def pod_names(trainjob_name: str, runtime: Mapping[str, Any], num_nodes: int | None) -> list[tuple[str, str]]:
    """(replicatedJob name, its longest pod name) per replicatedJob:
    <jobset>-<rjob>-<maxJobIndex>-<maxPodIndex>-abcde."""
    return [
        (name, f"{trainjob_name}-{name}-{replicas - 1}-{pods - 1}{POD_SUFFIX}")
        for name, replicas, pods in pod_counts(runtime, num_nodes)
    ]


def longest_pod_name(trainjob_name: str, runtime: Mapping[str, Any], num_nodes: int | None) -> str | None:
    """The longest pod name the JobSet would create, or None when the runtime has no replicated jobs."""
    names = [pod for _, pod in pod_names(trainjob_name, runtime, num_nodes)]
    return max(names, key=len) if names else None


# MultiKueue's annotation on a worker's copy of a TrainJob: the name of the manager's Workload it runs for
# (Kueue v0.19.2 writes it as an annotation; older releases as a label).
PREBUILT_WORKLOAD: Final = "kueue.x-k8s.io/prebuilt-workload-name"

# Kueue's label on a Workload: the UID of the job (here the TrainJob) it was made for.
WORKLOAD_JOB_UID_LABEL: Final = "kueue.x-k8s.io/job-uid"

# MultiKueue, the admitting worker unreachable past workerLostTimeout: its check goes Retry with this message
# (kueue v0.19.2 pkg/controller/admissionchecks/multikueue/workload.go), and the Workload is evicted with
# reason AdmissionCheck, `Evicted due to AdmissionCheck in Retry state: "<check>" (Admitting remote lost)`
# (pkg/controller/core/workload_controller.go). The eviction clears status.clusterName. A job's attempt and a
# session alike end on it (cause `cluster-lost`).
WORKER_LOST: Final = "Admitting remote lost"
