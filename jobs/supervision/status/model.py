"""States, causes and well-known keys as strings (the values of jobs.models.JobState / Cause: this package
imports no Django), and the derivation's input context and result. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from dispatch_site.names import DEFAULT_LABEL_DOMAIN
from jobs.waits import Thresholds

QUEUED: Final = "queued"
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"

PREEMPTED: Final = "preempted"
NODE_LOST: Final = "node-lost"
CLUSTER_LOST: Final = "cluster-lost"
OOM: Final = "oom"
TIMEOUT: Final = "timeout"
NO_CAPACITY: Final = "no-capacity"
IMAGE_PULL: Final = "image-pull"
EVICTED: Final = "evicted"
CONFIG_ERROR: Final = "config-error"
APP_ERROR: Final = "app-error"
RUNTIME_MISSING: Final = "runtime-missing"
IDENTITY_VIOLATION: Final = "identity-violation"
UNKNOWN_FAILURE: Final = "unknown-failure"
# Not a cause: a rank whose container ended 137 or 143 after its pod's deletion was asked for was killed by
# that deletion (status-facts §10 precedence 3). It is evidence under whatever ended the attempt, never the
# cause of a failure (before, such a rank read `app-error exit 143`).
KILLED: Final = "killed"
# Exit codes of a container stopped by a signal: SIGKILL, SIGTERM.
KILL_EXIT_CODES: Final = frozenset({137, 143})
# A pod's deletionGracePeriodSeconds when a remembered pod does not say (memory written before it was kept):
# the Kubernetes default terminationGracePeriodSeconds.
DEFAULT_GRACE_SECONDS: Final = 30

COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
RESTART_ATTEMPT: Final = "jobset.sigs.k8s.io/restart-attempt"
REPLICATED_JOB: Final = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX: Final = "jobset.sigs.k8s.io/job-index"

IMAGE_PULL_REASONS: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "ImageInspectError"}
)
CONFIG_WAITING_REASONS: Final = frozenset(
    {
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "PreCreateHookError",
        "PreStartHookError",
        "PostStartHookError",
    }
)
CONFIG_TERMINATED_REASONS: Final = frozenset({"StartError"})
NO_CAPACITY_POD_REASONS: Final = frozenset(
    {"UnexpectedAdmissionError", "TopologyAffinityError", "NodeAffinity", "TaintToleration"}
)
NODE_LOST_TAINTS: Final = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})
RUNTIME_NOT_FOUND: Final = re.compile(
    r"TrainingRuntime specified in TrainJob is not found|"
    r"not found ClusterTrainingRuntime specified in TrainJob|"
    r"must be created before the TrainJob",
    re.IGNORECASE,
)

# A controller's request that got no answer from the API server: Go's url.Error, `<Verb> "<url>": <cause>`
# (dial tcp ... connection refused, EOF, i/o timeout, TLS handshake timeout), or the API server saying it
# cannot serve now. The controller retries it with backoff; it is the API server's outage, never the job's
# configuration (seen in `make chaos` seed 3: kube-apiserver killed for 15 s, and 11 jobs whose TrainJobs the
# Trainer was building read `config-error` from "applying runtime snapshot ConfigMap: Patch "https://...":
# dial tcp ...: connect: connection refused").
TRANSIENT_API_ERROR: Final = re.compile(
    r'\b(?:get|post|put|patch|delete) "https?://[^"]*": |'
    r"the server is currently unable to handle the request|"
    r"the server was unable to return a response in the time allotted|"
    r"the server has received too many requests|"
    r"etcdserver: request timed out",
    re.IGNORECASE,
)


# What a job whose TrainJob is not among the objects read says (jobs.supervision.cycle confirms it first).
TRAINJOB_GONE = "the TrainJob is gone: it was deleted outside dispatch"


@dataclass(frozen=True)
class Context:
    now: datetime
    label_domain: str = DEFAULT_LABEL_DOMAIN
    attempt: int | None = None  # None: read from the objects' labels
    identity_warned: bool = False  # the plan carried an allowRankRestart identity warning
    thresholds: Thresholds = field(default_factory=Thresholds)
    # The execution was seen running before (a job that ran never reads `queued` again, unless Kueue requeued
    # it): the cycle sets it from Execution.started_at; the pods' memory says so too.
    ran: bool = False
    # Nodes the cycle could not read (forbidden, unreachable): a pod on one of them is not judged node-lost
    # for want of its node; a node absent from the input and not named here was not found (deleted).
    unread_nodes: frozenset[str] = frozenset()


@dataclass
class DerivedStatus:
    state: str
    cause: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    message: str = ""
    evidence: list[dict[str, Any]] = field(default_factory=list)  # {object, field, value, at}
    queued_reason: dict[str, Any] = field(default_factory=dict)  # {reason, message, since}
    identity_findings: list[dict[str, Any]] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    restart_attempt: int = 0
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # pod uid -> condensed pod (the memory)
    # The MultiKueue worker cluster Kueue admitted the attempt to (Workload.status.clusterName); "" otherwise.
    cluster: str = ""
    # Set when dispatch itself has to act: stop the TrainJob (a waiting cause ran out, or the promise broke).
    stop: bool = False
    # What the page may show beside the status, plain data {kind, message, object}: objects that carry the
    # job's labels outside its TrainJob's owner chain (ignored) and reads that failed (the cycle adds these),
    # and a rank disrupted on its way to a success (the derivation's own).
    warnings: list[dict[str, Any]] = field(default_factory=list)
    # When a waiting cause's threshold runs out: the result may change then with no object changing.
    recheck_at: datetime | None = None
    # Set when dispatch must deactivate the execution's Kueue Workload before anything else (an eviction ends
    # the attempt): {namespace, name, uid, annotations}. The cycle acts; the derivation only says so.
    deactivate: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.state in (SUCCEEDED, FAILED, CANCELLED)

    def contract(self) -> dict[str, Any]:
        """The `derive_status --json` shape (kept exact: checks outside the test suite read it)."""
        return {
            "state": self.state,
            "cause": self.cause,
            "rank": self.rank,
            "exit_code": self.exit_code,
            "evidence": [{k: e.get(k) for k in ("object", "field", "value")} for e in self.evidence],
            "identity_findings": [
                {k: f.get(k) for k in ("rank", "attempt", "restart_attempt", "pods", "why")}
                for f in self.identity_findings
            ],
        }


# ---------------------------------------------------------------- small readers
