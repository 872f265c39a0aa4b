"""Attempt A+1, and the watch on attempt A until it starts.

A failed execution whose job's recovery policy retries leaves the job `pending` (queued reason
`retry-backoff`). Every cycle, for each such job:

- attempt A is still watched: a list of A's pods (its labels, made by one of its TrainJob's Jobs). A pod that
  A's memory does not hold is looked at closely: when its owner chain leads to A's TrainJob (Job -> JobSet
  -> the TrainJob UID the start recorded) and it ran a rank of A again, or was made after dispatch ended A,
  it is an identity finding on A (its execution, the job and the timeline). That is how a JobSet the
  Trainer rebuilt for A's TrainJob (status-facts §12) shows, whatever stopped the delete;
- once the backoff ran out, A+1 starts (the submit task, from the runtime snapshot stored with the job) when
  A's TrainJob is gone or the Trainer shows it stopped, and none of A's pods still runs; meanwhile the job
  says what it waits for.

The pods are read where A ran: on its MultiKueue worker when it had one. A worker lost with the attempt
(cause `cluster-lost`) cannot be listed, and its pods run under A's identity, never A+1's: A+1 does not
wait for them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from cluster import gateway
from cluster.errors import ClusterError
from cluster.where import on_cluster
from dispatch_site.causes import Cause
from jobs import enqueue
from jobs.models import Execution, Job, JobEvent, JobState
from jobs.naming import trainjob_name
from jobs.objects import TRAINJOB, is_worker_copy, trainjob_stopped
from jobs.supervision.apply import RETRY_BACKOFF, finding_key
from jobs.supervision.status import condense_pod
from jobs.supervision.status.identity import ended_attempt_findings
from runtimes.models import SiteSettings

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def start_due_retries() -> int:
    """Watch attempt A of every job waiting for its retry, and start A+1 where the backoff ran out and A is
    stopped. Returns how many attempts started."""
    now = timezone.now()
    started = 0
    waiting = Job.objects.filter(state=JobState.PENDING, queued_reason__reason=RETRY_BACKOFF)
    for job in waiting:
        ended = Execution.objects.filter(job_id=job.pk, attempt=job.current_attempt).first()
        with on_cluster(ended.cluster if ended is not None else ""):
            running, problem = _watch_ended_attempt(job, ended)
            until = datetime.fromisoformat(str(job.queued_reason.get("until")))
            if until > now:
                continue
            up = _trainjob_still_up(job, ended)
        if up:
            _say_waiting(job, up)
            continue
        if running or problem:
            _say_waiting_for_pods(job, running, problem)
            continue
        if _start_next(job, now):
            started += 1
    return started


def _start_next(job: Job, now: datetime) -> bool:
    attempt = job.current_attempt + 1
    with transaction.atomic():
        moved = Job.objects.filter(
            pk=job.pk,
            state=JobState.PENDING,
            current_attempt=job.current_attempt,
            queued_reason__reason=RETRY_BACKOFF,
        ).update(current_attempt=attempt, queued_reason={}, updated_at=now)
        if not moved:
            return False  # another supervisor started it
        execution = Execution.objects.create(
            job=job, attempt=attempt, trainjob_name=trainjob_name(job.pk, attempt)
        )
        JobEvent.objects.create(
            job_id=job.pk, attempt=attempt, kind="attempt", message=f"starting attempt {attempt}"
        )
        transaction.on_commit(enqueue.on_commit_send(enqueue.EXECUTION_SUBMIT, execution.pk), robust=True)
    return True


def _trainjob_still_up(job: Job, ended: Execution | None) -> str:
    """Why attempt A's TrainJob keeps A+1 waiting ("" once it is gone, or the Trainer shows it stopped):
    while it exists unsuspended, the Trainer rebuilds its JobSet when that goes (status-facts §12), and a
    rebuilt JobSet of A would run beside A+1, outside its quota and unwatched. Only the TrainJob the start
    recorded (its UID) counts; another one under the name is not A's. It is read on the manager, where
    dispatch made it."""
    attempt = job.current_attempt
    name = ended.trainjob_name if ended is not None else trainjob_name(job.pk, attempt)
    try:
        with on_cluster(""):
            trainjob = gateway.get_namespaced(TRAINJOB, job.namespace, name)
    except ClusterError as exc:
        return f"waiting for attempt {attempt}'s TrainJob {name} to stop (it could not be read: {exc})"
    if trainjob is None or trainjob_stopped(trainjob):
        return ""
    uid = str((trainjob.get("metadata") or {}).get("uid") or "")
    if ended is not None and ended.trainjob_uid and uid != ended.trainjob_uid:
        return ""
    return (
        f"waiting for attempt {attempt}'s TrainJob {name} to be suspended or deleted before attempt "
        f"{attempt + 1} starts"
    )


def _say_waiting(job: Job, message: str) -> None:
    if job.queued_reason.get("message") == message:
        return
    reason = {**job.queued_reason, "message": message}
    Job.objects.filter(
        pk=job.pk,
        state=JobState.PENDING,
        current_attempt=job.current_attempt,
        queued_reason__reason=RETRY_BACKOFF,
    ).update(queued_reason=reason, message=message, updated_at=timezone.now())


def _watch_ended_attempt(job: Job, ended: Execution | None) -> tuple[list[str], str]:
    """Attempt A's pods that still run, by a list in the job's namespace (its labels in the job's own
    domain, made by one of its TrainJob's Jobs): a pod still there counts as running unless it finished,
    and a pod being deleted counts whatever its phase says (KWOK and a slow kubelet keep it Running). Pods
    A's memory does not hold are checked for identity findings on the way. (names, "") or ([], what could
    not be read)."""
    if ended is not None and ended.cause == Cause.CLUSTER_LOST:
        return [], ""
    domain = job.label_domain or SiteSettings.load().label_domain
    attempt = job.current_attempt
    prefix = f"{trainjob_name(job.pk, attempt)}-"
    selector = f"{domain}/job={job.pk},{domain}/attempt={attempt}"
    try:
        pods = gateway.list_objects(gateway.PODS, job.namespace, label_selector=selector).items
    except ClusterError as exc:
        return [], str(exc)
    running = []
    ours = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if not any(
            ref.get("kind") == "Job" and str(ref.get("name", "")).startswith(prefix)
            for ref in meta.get("ownerReferences") or ()
        ):
            continue
        ours.append(pod)
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if meta.get("deletionTimestamp") or not finished:
            running.append(str(meta.get("name", "")))
    if ended is not None:
        _record_late_pods(job, ended, ours, domain)
    return sorted(running), ""


def _record_late_pods(job: Job, ended: Execution, pods: list[dict[str, Any]], domain: str) -> None:
    """Pods of the ended attempt A that its memory does not hold, whose owner chain leads to A's TrainJob:
    a rank of A that ran again, or a pod made after A ended, is an identity finding, written once."""
    remembered = list((ended.pods_seen or {}).values())
    known = {str(p.get("uid")) for p in remembered}
    new = [p for p in pods if str((p.get("metadata") or {}).get("uid")) not in known]
    if not new:
        return
    try:
        new = _of_trainjob(ended, job.namespace, domain, new)
    except ClusterError:
        return  # the next cycle looks again
    findings = ended_attempt_findings(
        remembered,
        [condense_pod(p, domain) for p in new],
        attempt=ended.attempt,
        ended_at=ended.finished_at,
        warned=bool(job.identity_warnings),
    )
    if findings:
        _write_findings(job.pk, ended.pk, findings)


def _of_trainjob(
    ended: Execution, namespace: str, domain: str, pods: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The pods whose owner chain leads to the TrainJob the start recorded: Pod -> Job (by UID) -> JobSet
    (by UID) -> TrainJob (the recorded UID). A name or a label alone is not enough (anyone who may create a
    pod can copy them). Executions from before the UID was recorded go by name."""
    if not ended.trainjob_uid:
        return pods
    name = ended.trainjob_name
    root = _root_uid(ended, namespace, domain)
    jobsets = gateway.list_objects(gateway.JOBSETS, namespace, field_selector=f"metadata.name={name}").items
    jobset_uids = {
        str(js["metadata"].get("uid"))
        for js in jobsets
        if root and any(ref.get("uid") == root for ref in js["metadata"].get("ownerReferences") or ())
    }
    if not jobset_uids:
        return []
    jobs = gateway.list_objects(gateway.JOBS, namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}").items
    job_uids = {
        str(j["metadata"].get("uid"))
        for j in jobs
        if any(ref.get("uid") in jobset_uids for ref in j["metadata"].get("ownerReferences") or ())
    }
    return [
        p
        for p in pods
        if any(ref.get("uid") in job_uids for ref in (p.get("metadata") or {}).get("ownerReferences") or ())
    ]


def _root_uid(ended: Execution, namespace: str, domain: str) -> str:
    """The UID of the TrainJob that A's pods belong to where they run: the one the start recorded, or on a
    MultiKueue worker its copy there, known by MultiKueue's prebuilt-workload annotation naming the
    manager's Workload that the recorded TrainJob owns (jobs.objects.is_worker_copy). "" when none is."""
    if not ended.cluster:
        return ended.trainjob_uid
    with on_cluster(""):
        workloads = gateway.list_objects(gateway.WORKLOADS, namespace).items
    names = {
        str(w["metadata"].get("name"))
        for w in workloads
        if any(ref.get("uid") == ended.trainjob_uid for ref in w["metadata"].get("ownerReferences") or ())
    }
    copy = gateway.get_namespaced(TRAINJOB, namespace, ended.trainjob_name)
    if copy is None or not is_worker_copy(copy, domain, ended.job_id, names):
        return ""
    return str(copy["metadata"].get("uid") or "")


def _write_findings(job_id: str, execution_id: int, findings: list[dict[str, Any]]) -> None:
    """Add the findings the ended execution does not hold yet, to it, to the job while A is its current
    attempt, and to the timeline (with cause identity-violation when one is unexpected). Row locks in the
    one order: job, then execution; two supervisors at once write a finding once."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        execution = Execution.objects.select_for_update().get(pk=execution_id)
        known = {finding_key(f) for f in execution.identity_findings or []}
        new = [f for f in findings if finding_key(f) not in known]
        if not new:
            return
        execution.identity_findings = [*(execution.identity_findings or []), *new]
        execution.save(update_fields=["identity_findings"])
        if job.current_attempt == execution.attempt:
            job.identity_findings = [*(job.identity_findings or []), *new]
            job.save(update_fields=["identity_findings"])
        unexpected = [f for f in new if not f.get("expected")]
        what = "identity finding" if len(new) == 1 else f"{len(new)} identity findings"
        JobEvent.objects.create(
            job_id=job_id,
            attempt=execution.attempt,
            kind="identity-finding",
            message=f"{what} after attempt {execution.attempt} ended: " + "; ".join(f["why"] for f in new),
            cause=Cause.IDENTITY_VIOLATION if unexpected else "",
            details={"findings": new},
        )


def _say_waiting_for_pods(job: Job, running: list[str], problem: str) -> None:
    attempt = job.current_attempt
    if problem:
        message = f"waiting for attempt {attempt}'s pods to stop (they could not be listed: {problem})"
    else:
        shown = ", ".join(running[:5]) + (", ..." if len(running) > 5 else "")
        message = f"waiting for attempt {attempt}'s pods to stop: {len(running)} still running ({shown})"
    if job.queued_reason.get("message") == message:
        return
    reason = {**job.queued_reason, "message": message, "waiting_for_pods": running}
    Job.objects.filter(
        pk=job.pk, state=JobState.PENDING, current_attempt=attempt, queued_reason__reason=RETRY_BACKOFF
    ).update(queued_reason=reason, message=message, updated_at=timezone.now())
