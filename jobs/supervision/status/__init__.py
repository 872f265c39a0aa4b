"""Status derivation: one execution's observed objects -> state, typed cause, evidence. Pure.

Input is plain data as the API server returns it (a TrainJob, its JobSet, Jobs, Pods, Events, the Nodes
they ran on, and Kueue Workloads when installed), plus what earlier cycles saw of pods that are gone now
(`memory`):
a preempted, evicted or node-lost pod often vanishes within a second, and its last seen state is the evidence.

The precedence follows `shared/reference/status-facts.md` §10:
- aggregate reasons (Job BackoffLimitExceeded, JobSet/TrainJob FailedJobs) are never the cause by themselves;
  the chain is followed to the failed pods, which are classified one by one;
- per pod: DisruptionTarget > pod status.reason > OOMKilled > config reasons > image pull > a non-zero exit;
- the first rank to fail is the cause, the others are evidence; `unknown-failure` only when nothing explains
  a failure, with the raw conditions kept;
- no-capacity and image-pull are waiting causes: the execution stays `queued` until a threshold, then fails;
- identity findings group pods by (attempt A, JobSet restart-attempt J, rank): a container restarted in place,
  or two pods for one rank within one (A, J), is a rank that ran twice under one identity.

One module per evidence family: `readers` (plain-object readers, the evidence row), `pods` (condensed pods
and their classification), `events`, `jobs` (Job/JobSet/TrainJob conditions and messages), `identity`,
`kueue`, `waiting` (waiting causes and their thresholds) and `derive` (the derivation itself); `model` holds
the states, causes, the Context and the DerivedStatus. Import from this package: the names below are its
interface.
"""

from __future__ import annotations

from jobs.supervision.status.derive import derive
from jobs.supervision.status.events import EventView, event_view, scheduled_node
from jobs.supervision.status.identity import identity_findings
from jobs.supervision.status.jobs import disrupted_pods_named, disruption_from_job_messages
from jobs.supervision.status.kueue import KueueEviction, kueue_eviction, kueue_queued_reason, pods_ready_note
from jobs.supervision.status.model import (
    APP_ERROR,
    CANCELLED,
    CLUSTER_LOST,
    COMPLETION_INDEX,
    CONFIG_ERROR,
    EVICTED,
    FAILED,
    IDENTITY_VIOLATION,
    IMAGE_PULL,
    JOB_INDEX,
    NO_CAPACITY,
    NODE_LOST,
    OOM,
    PREEMPTED,
    QUEUED,
    REPLICATED_JOB,
    RESTART_ATTEMPT,
    RUNNING,
    RUNTIME_MISSING,
    SUCCEEDED,
    TIMEOUT,
    TRAINJOB_GONE,
    UNKNOWN_FAILURE,
    Context,
    DerivedStatus,
)
from jobs.supervision.status.pods import PodFailure, classify_pod, condense_pod, merge_memory, with_tombstone
from jobs.supervision.status.readers import condition, object_ref
from jobs.waits import parse_time

__all__ = [
    "APP_ERROR",
    "CANCELLED",
    "CLUSTER_LOST",
    "COMPLETION_INDEX",
    "CONFIG_ERROR",
    "EVICTED",
    "FAILED",
    "IDENTITY_VIOLATION",
    "IMAGE_PULL",
    "JOB_INDEX",
    "NODE_LOST",
    "NO_CAPACITY",
    "OOM",
    "PREEMPTED",
    "QUEUED",
    "REPLICATED_JOB",
    "RESTART_ATTEMPT",
    "RUNNING",
    "RUNTIME_MISSING",
    "SUCCEEDED",
    "TIMEOUT",
    "TRAINJOB_GONE",
    "UNKNOWN_FAILURE",
    "Context",
    "DerivedStatus",
    "EventView",
    "KueueEviction",
    "PodFailure",
    "classify_pod",
    "condense_pod",
    "condition",
    "derive",
    "disrupted_pods_named",
    "disruption_from_job_messages",
    "event_view",
    "identity_findings",
    "kueue_eviction",
    "kueue_queued_reason",
    "merge_memory",
    "object_ref",
    "parse_time",
    "pods_ready_note",
    "scheduled_node",
    "with_tombstone",
]
