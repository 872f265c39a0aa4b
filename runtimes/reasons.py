"""The vocabulary of the runtime rules: the reason codes (an API: DESIGN.md's table), the capabilities, and
the verdict a check returns, as plain frozen data; and the site settings the rules depend on.
Pure: no Django, no cluster, no I/O. runtimes.rules decides; this module names what it decides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

TRAINER_ANCESTOR_LABEL: Final = "trainer.kubeflow.org/trainjob-ancestor-step"


TRAINER_ANCESTOR_STEP: Final = "trainer"


NODE_CONTAINER: Final = "node"


RUNTIME_KINDS: Final = ("ClusterTrainingRuntime", "TrainingRuntime")


PUBLISH_ENV: Final = "env"


PUBLISH_INIT_CONTAINER: Final = "initContainer"


PUBLISH_VIAS: Final = (PUBLISH_ENV, PUBLISH_INIT_CONTAINER)


# Reason codes, in DESIGN.md's order, which is also the order check_runtime reports them in.
RUNTIME_NOT_ALLOWED: Final = "runtime-not-allowed"


RUNTIME_NOT_FOUND: Final = "runtime-not-found"


MLPOLICY_UNSUPPORTED: Final = "mlpolicy-unsupported"


NO_TRAINER_JOB: Final = "no-trainer-job"


EXTRA_REPLICATED_JOB: Final = "extra-replicated-job"


RESTART_POLICY: Final = "restart-policy"


BACKOFF_LIMIT: Final = "backoff-limit"


POD_FAILURE_POLICY_IGNORE: Final = "pod-failure-policy-ignore"


BACKOFF_LIMIT_PER_INDEX: Final = "backoff-limit-per-index"


POD_FAILURE_POLICY_UNKNOWN_ACTION: Final = "pod-failure-policy-unknown-action"


NO_NODE_CONTAINER: Final = "no-node-container"


NO_PUBLISH_INIT_CONTAINER: Final = "no-publish-init-container"


JOBSET_MAX_RESTARTS: Final = "jobset-max-restarts"


JOBSET_FAILURE_RULE_ACTION: Final = "jobset-failure-rule-action"


CONTAINER_RESTART_POLICY: Final = "container-restart-policy"


COMPLETION_MODE: Final = "completion-mode"


FAIL_INDEX_WITHOUT_PER_INDEX: Final = "fail-index-without-per-index"


TORCH_TRAINER_JOB_NAME: Final = "torch-trainer-job-name"


# The allow-list entry recorded the spec a platform user reviewed, and the runtime's spec is no longer it.
RUNTIME_CHANGED_SINCE_REVIEW: Final = "runtime-changed-since-review"


REASON_CODES: Final = (
    RUNTIME_NOT_ALLOWED,
    RUNTIME_CHANGED_SINCE_REVIEW,
    RUNTIME_NOT_FOUND,
    MLPOLICY_UNSUPPORTED,
    NO_TRAINER_JOB,
    EXTRA_REPLICATED_JOB,
    RESTART_POLICY,
    BACKOFF_LIMIT,
    POD_FAILURE_POLICY_IGNORE,
    BACKOFF_LIMIT_PER_INDEX,
    POD_FAILURE_POLICY_UNKNOWN_ACTION,
    NO_NODE_CONTAINER,
    NO_PUBLISH_INIT_CONTAINER,
    JOBSET_MAX_RESTARTS,
    JOBSET_FAILURE_RULE_ACTION,
    CONTAINER_RESTART_POLICY,
    COMPLETION_MODE,
    FAIL_INDEX_WITHOUT_PER_INDEX,
    TORCH_TRAINER_JOB_NAME,
)


WAIVABLE_CODES: Final = frozenset({POD_FAILURE_POLICY_IGNORE, BACKOFF_LIMIT_PER_INDEX})


# Capability names, as the plan shows them.
CAP_PROCS_PER_NODE: Final = "ProcsPerNode"


CAP_MULTI_NODE: Final = "MultiNode"


CAP_RANK_IDENTITY: Final = "RankIdentity"


CAP_GANG_SCHEDULING: Final = "GangScheduling"


ALLOWED_MLPOLICY_KEYS: Final = frozenset({"numNodes", "torch"})


KNOWN_POD_FAILURE_ACTIONS: Final = frozenset({"FailJob", "FailIndex", "Count", "Ignore"})


JOBSET_FAIL_ACTION: Final = "FailJobSet"


INDEXED: Final = "Indexed"


SIDECAR_RESTART_POLICY: Final = "Always"  # an init container with restartPolicy Always is a sidecar


CONTAINER_RESTART_ACTION: Final = "Restart"


TORCH_TRAINER_JOB: Final = "node"  # the torch plugin's master address names the replicated job "node"


JOBS_PATH: Final = "spec.template.spec.replicatedJobs"


FAILURE_POLICY_PATH: Final = "spec.template.spec.failurePolicy"


@dataclass(frozen=True)
class SiteRules:
    """The site settings the rules depend on.

    An unknown publish_via raises ValueError: guessing where the identity goes would break the promise. An
    empty publish_container under initContainer does not raise (a settings row can hold it); every runtime
    is then refused with no-publish-init-container, which names the problem where the platform team looks.
    """

    allow_rank_restart: bool = False
    publish_via: str = PUBLISH_ENV  # "env" | "initContainer"
    publish_container: str = ""  # the init container's name when publish_via == "initContainer"

    def __post_init__(self) -> None:
        if self.publish_via not in PUBLISH_VIAS:
            raise ValueError(f"publish.via is {self.publish_via!r}; use env or initContainer")


DEFAULT_SITE_RULES: Final = SiteRules()


# Who can put a runtime on the allow-list, and where: every runtime-not-allowed message says it.
ALLOW_LIST_WHO: Final = "a platform user adds runtimes on the Runtimes page"


@dataclass(frozen=True)
class AllowListMiss:
    """Why a runtime is not on the allow-list for what it was asked for: the refusal message says so.

    dispatch always enforces its allow-list (a runtime nobody reviewed does not run), even when the list is
    empty; saying that it is empty, or that the runtime is listed for the other purpose only, saves the
    reader from guessing why a runtime that passes every rule is refused.
    """

    purpose: str = ""  # "jobs" or "sessions"; "" when the question was not for one purpose
    list_empty: bool = False  # nothing at all is on the allow-list
    listed_for: tuple[str, ...] = ()  # the purposes the runtime is listed for (not `purpose`)


def not_allowed_message(ref: str, miss: AllowListMiss) -> str:
    """The runtime-not-allowed message: what is missing, and who adds it."""
    purpose = f" for {miss.purpose}" if miss.purpose else ""
    if miss.list_empty:
        return (
            f"{ref} is not on the site's runtime allow-list{purpose}: the allow-list is empty, and dispatch "
            f"runs no runtime nobody reviewed; {ALLOW_LIST_WHO}"
        )
    if miss.listed_for and miss.purpose:
        listed = " and ".join(miss.listed_for)
        return (
            f"{ref} is on the site's runtime allow-list for {listed} only, not for {miss.purpose}; "
            f"a platform user adds it for {miss.purpose} on the Runtimes page"
        )
    return f"{ref} is not on the site's runtime allow-list{purpose}; {ALLOW_LIST_WHO}"


# How an allow-list entry was reviewed (runtimes.models.AllowListEntry.review).
REVIEW_CONTENT: Final = (
    "content"  # the runtime's spec, labels and annotations were read, their digest recorded
)
REVIEW_NAME: Final = "name"  # written in code by name only (tests, fixtures); the service never writes it
REVIEW_MISSING: Final = "missing"  # the runtime could not be read when it was added: no content reviewed
# Allow-listed before reviews covered what they cover now (by name only, or the spec without its labels and
# annotations): refused until a platform user re-approves it (migration runtimes 0006 marks such entries).
REVIEW_STALE: Final = "stale"


@dataclass(frozen=True)
class Review:
    """What a platform user reviewed when they allow-listed (or re-approved) a runtime: the digest of its spec
    and behaviour-changing metadata (runtimes.digest.review_digest), and both as reviewed, so a change can be
    named by field path."""

    state: str  # REVIEW_CONTENT, REVIEW_NAME, REVIEW_MISSING or REVIEW_STALE
    spec_hash: str = ""  # review_digest of the reviewed runtime
    spec: Mapping[str, Any] | None = None
    reviewed: str = ""  # who and when, for messages: "by pat at 2026-05-01 10:00 UTC"
    metadata: Mapping[str, Any] | None = None  # runtimes.digest.reviewed_metadata of the reviewed runtime


@dataclass(frozen=True)
class Reason:
    code: str
    message: str
    path: str  # the offending field path in the runtime ("" when there is no runtime to point into)
    waived: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "path": self.path, "waived": self.waived}


@dataclass(frozen=True)
class Capability:
    name: str
    supported: bool
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "supported": self.supported, "why": self.why}


@dataclass(frozen=True)
class Verdict:
    refused: bool
    reasons: tuple[Reason, ...]  # every reason, waived ones included (waived=True)
    identity_warning: str | None
    capabilities: tuple[Capability, ...]

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(r.code for r in self.reasons)

    @property
    def refusals(self) -> tuple[Reason, ...]:
        """The reasons that refuse the runtime (waived ones left out)."""
        return tuple(r for r in self.reasons if not r.waived)

    def capability(self, name: str) -> Capability | None:
        return next((c for c in self.capabilities if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "refused": self.refused,
            "reasons": [r.to_dict() for r in self.reasons],
            "identity_warning": self.identity_warning,
            "capabilities": [c.to_dict() for c in self.capabilities],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        """The inverse of to_dict (e.g. a verdict stored as JSON on a job record)."""
        reasons = tuple(
            Reason(
                code=str(r["code"]),
                message=str(r["message"]),
                path=str(r.get("path", "")),
                waived=bool(r.get("waived", False)),
            )
            for r in data.get("reasons") or ()
        )
        capabilities = tuple(
            Capability(name=str(c["name"]), supported=bool(c["supported"]), why=str(c.get("why", "")))
            for c in data.get("capabilities") or ()
        )
        warning = data.get("identity_warning")
        return cls(
            refused=bool(data["refused"]),
            reasons=reasons,
            identity_warning=None if warning is None else str(warning),
            capabilities=capabilities,
        )
