"""Plan a job: read the runtime and judge it with the pure rules and plan (jobs.plan); creates
nothing."""

from __future__ import annotations

import copy
from typing import Any

from cluster import gateway
from dispatch_site import roles
from jobs.kueue_inputs import kueue_inputs
from jobs.naming import new_job_id
from jobs.plan import Plan, build_plan
from jobs.queueing import KueueInputs, choose_queue
from jobs.spec import JobSpec
from runtimes.models import AllowListEntry, SiteSettings
from runtimes.reasons import AllowListMiss
from runtimes.selectors import allow_list_entry, get_runtime, site_rules


def _runtime_key(spec: JobSpec) -> tuple[str, str, str]:
    return spec.runtime.kind, spec.runtime.namespace or "", spec.runtime.name


# How stale a runtime read may be for answering plan and accepting a submission; the task that starts the
# execution reads it afresh and judges it again before creating anything.
PLAN_RUNTIME_MAX_AGE = 2.0


def job_plan(
    *,
    user: Any,
    spec: JobSpec,
    job_id: str | None = None,
    attempt: int = 1,
    runtime_max_age: float = 0.0,
    site: SiteSettings | None = None,
    namespace_granted: bool | None = None,
    stored_runtime: dict[str, Any] | None = None,
    label_domain: str | None = None,
) -> tuple[Plan, Any]:
    """What starting this job would do. Reads the runtime from the cluster (ClusterError when it cannot);
    creates nothing. Returns the plan and the runtime object it judged (None when it does not exist).
    A caller that already read the site settings or the namespace grant passes them in; start passes the
    label domain stored with the job (the site's current one otherwise)."""
    site = site or SiteSettings.load()
    if namespace_granted is None:
        namespace_granted = roles.may_submit_to(user, spec.namespace)
    kind, namespace, name = _runtime_key(spec)
    entry = allow_list_entry(kind, namespace, name, max_age=runtime_max_age)
    runtime: gateway.RuntimeObject | None
    if stored_runtime is not None:
        # A retry (attempt A+1) runs on the runtime as attempt 1 ran it, stored with the job: an edit of the
        # original since then changes nothing.
        runtime = gateway.RuntimeObject.from_body(kind, copy.deepcopy(stored_runtime))
    else:
        runtime = get_runtime(kind, namespace, name, max_age=runtime_max_age)  # never a dispatch copy
    allowed: bool | AllowListMiss = True
    if entry is None or not entry.for_jobs:
        # Refused: say why (an empty list, or listed for sessions only) so nobody has to guess.
        allowed = AllowListMiss(
            purpose="jobs",
            list_empty=entry is None and not AllowListEntry.objects.exists(),
            listed_for=tuple(entry.purposes) if entry else (),
        )
    # Like the runtime, Kueue is read only in a namespace the user is granted (the plan refuses otherwise).
    queueing = (
        kueue_inputs(spec=spec, site=site)
        if namespace_granted
        else KueueInputs(choice=choose_queue(spec, site.kueue_default_queues or {}), read=False)
    )
    plan = build_plan(
        spec=spec,
        runtime=runtime.body if runtime else None,
        rules=site_rules(site),
        allow_listed=allowed,
        # The runtime's content must be what the platform reviewed; a retry runs on the stored runtime of
        # attempt 1, judged against the review when attempt 1 started.
        review=entry.as_review() if entry is not None and stored_runtime is None else None,
        namespace_granted=namespace_granted,
        job_id=job_id or new_job_id(),
        attempt=attempt,
        label_domain=label_domain or site.label_domain,
        trainer_version=site.trainer_version,
        kueue=queueing,
    )
    return plan, runtime
