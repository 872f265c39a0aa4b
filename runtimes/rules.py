"""The runtime rules: may dispatch run jobs on this (Cluster)TrainingRuntime?

Pure: no Django, no cluster, no I/O. The rules are spec/runtime-requirements.md; the reason codes are the
table in DESIGN.md and are an API (tests, the dashboard and clients match on them). Every reason is
reported, never just the first, in the order of that table and then in field order.

Input is a runtime as a plain dict (what the API server or yaml.safe_load returns). Nothing here raises on
malformed input: a value of the wrong type counts as absent, except where absent would mean "accepted"
(mlPolicy, podFailurePolicy, JobSet failurePolicy); there a value we cannot read is reported, because the
checker must not accept what it does not understand.

This module runs the checks in that order; they live beside it: rules_read (reading a runtime),
rules_checks (the per-area checks), rules_messages (why each rule exists) and rules_capabilities."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtimes.digest import changed_paths, describe_paths, review_digest, reviewed_content
from runtimes.reasons import (
    DEFAULT_SITE_RULES,
    REVIEW_CONTENT,
    REVIEW_MISSING,
    REVIEW_STALE,
    RUNTIME_CHANGED_SINCE_REVIEW,
    RUNTIME_NOT_ALLOWED,
    RUNTIME_NOT_FOUND,
    AllowListMiss,
    Reason,
    Review,
    SiteRules,
    Verdict,
    not_allowed_message,
)
from runtimes.rules_capabilities import capabilities_of, missing_capabilities
from runtimes.rules_checks import (
    check_identity_holes,
    check_jobs,
    check_jobset_failure_policy,
    check_ml_policy,
    check_trainer_job,
)
from runtimes.rules_messages import identity_warning_for
from runtimes.rules_read import (
    EMPTY,
    as_list,
    as_map,
    find_trainer_index,
    find_trainer_job,
    runtime_ref,
    trainer_pod_spec,
)

__all__ = ["check_runtime", "find_trainer_job", "identity_warning_for", "runtime_ref", "trainer_pod_spec"]


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
    if review.state == REVIEW_STALE:
        message = (
            f"{ref} was allow-listed{_by(review)} before a review covered what it covers now (the spec "
            "with the labels and annotations that change behaviour), so what it does now was never reviewed; "
            + again
        )
        reasons.append(Reason(RUNTIME_CHANGED_SINCE_REVIEW, message, "metadata"))
        return
    if review.state != REVIEW_CONTENT or review_digest(runtime) == review.spec_hash:
        return
    reviewed = {"spec": review.spec or {}, "metadata": review.metadata or {"labels": {}, "annotations": {}}}
    paths = changed_paths(reviewed, reviewed_content(runtime)) or ["spec"]
    what = "the reviewed runtime" if any(p.startswith("metadata") for p in paths) else "the reviewed spec"
    message = (
        f"{ref} changed since it was reviewed{_by(review)}: {describe_paths(paths)} "
        f"{'differs' if len(paths) == 1 else 'differ'} from {what}; " + again
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
        runtime = EMPTY  # not an object at all: judged as a runtime with nothing in it
    ref = ref or runtime_ref(runtime)
    if allow_listed is False or isinstance(allow_listed, AllowListMiss):
        miss = allow_listed if isinstance(allow_listed, AllowListMiss) else AllowListMiss()
        reasons.append(Reason(RUNTIME_NOT_ALLOWED, not_allowed_message(ref, miss), "metadata.name"))
    if runtime is None:
        reasons.append(Reason(RUNTIME_NOT_FOUND, f"{ref} does not exist in the cluster", ""))
        return Verdict(True, tuple(reasons), None, missing_capabilities(ref))

    if review is not None:
        _check_review(runtime, review, ref, reasons)
    spec = as_map(runtime.get("spec"))
    check_ml_policy(spec, reasons)

    jobset_spec = as_map(as_map(spec.get("template")).get("spec"))
    raw_jobs = jobset_spec.get("replicatedJobs")
    jobs = as_list(raw_jobs)
    trainer_index = find_trainer_index(jobs)
    check_jobs(raw_jobs, trainer_index, reasons)
    ignore_rule = per_index = publish_ok = False
    if trainer_index is not None:
        ignore_rule, per_index, publish_ok = check_trainer_job(
            trainer_index, jobs[trainer_index], rules, reasons
        )

    check_jobset_failure_policy(jobset_spec, reasons)
    if trainer_index is not None:
        check_identity_holes(trainer_index, jobs[trainer_index], as_map(spec.get("mlPolicy")), reasons)

    refused = any(not r.waived for r in reasons)
    warning = identity_warning_for(ignore_rule, per_index) if rules.allow_rank_restart else None
    capabilities = capabilities_of(
        as_map(spec.get("mlPolicy")), spec, trainer_index is not None, publish_ok, rules
    )
    return Verdict(refused, tuple(reasons), warning, capabilities)
