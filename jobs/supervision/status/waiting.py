"""Waiting causes: pods that cannot be scheduled, pull their image or start their container, and Jobs that
cannot create their pods. Each waits for its threshold, then fails the execution, which dispatch stops.
Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from jobs.supervision.status.events import EventView, first_event_time, latest_event_message
from jobs.supervision.status.model import (
    CONFIG_ERROR,
    CONFIG_WAITING_REASONS,
    FAILED,
    IMAGE_PULL,
    IMAGE_PULL_REASONS,
    NO_CAPACITY,
    RESTART_ATTEMPT,
    TRANSIENT_API_ERROR,
    Context,
    DerivedStatus,
)
from jobs.supervision.status.readers import (
    as_int,
    evidence_row,
    iso,
    labels_of,
    meta_of,
    name_of,
    object_ref,
    pod_ref,
)
from jobs.waits import parse_time


def create_failures(
    status: DerivedStatus,
    events: Sequence[EventView],
    jobs: Sequence[Mapping[str, Any]],
    pods: Mapping[str, Mapping[str, Any]],
    restart_attempt: int,
    ctx: Context,
    namespace: Any,
) -> None:
    """A Job of the current restart attempt that cannot create its pods (admission, quota): FailedCreate
    events newer than the newest pod that Job made. An old FailedCreate (a quota that was raised since, the
    pods then made) says nothing about now. Waits like any waiting cause: "exceeded quota" is no capacity
    (NO_CAPACITY_AFTER_SECONDS), anything else a configuration error (an admission denial, 15 s); past it
    the execution fails and dispatch stops it."""
    current = {
        name_of(j): j for j in jobs if (as_int(labels_of(j).get(RESTART_ATTEMPT)) or 0) == restart_attempt
    }
    streaks: dict[str, list[EventView]] = {}
    for event in events:
        if event.kind != "Job" or event.reason != "FailedCreate" or event.name not in current:
            continue
        job_uid = str(meta_of(current[event.name]).get("uid") or "")
        if event.uid and job_uid and event.uid != job_uid:
            continue  # about an earlier Job of that name (a JobSet restart recreates the same names)
        streaks.setdefault(event.name, []).append(event)
    for job_name, streak in sorted(streaks.items()):
        made = [
            parse_time(p.get("created"))
            for p in pods.values()
            if str(p.get("name", "")).startswith(f"{job_name}-")
            and p.get("restart_attempt", 0) == restart_attempt
        ]
        newest_pod = max((m for m in made if m), default=None)
        # Pod creation times have whole seconds: a pod made in the second of a failure counts as after it.
        after = [
            e
            for e in streak
            if e.at is not None and (newest_pod is None or e.at.replace(microsecond=0) > newest_pod)
        ]
        if not after:
            continue  # a pod was made after the last failure: resolved
        latest = max(after, key=lambda e: e.at or datetime.min.replace(tzinfo=UTC))
        since = min(e.first or e.at or ctx.now for e in after)
        if newest_pod is not None and since < newest_pod:
            since = newest_pod  # a repeated event's first time may predate the pod that resolved it once
        quota = "exceeded quota" in latest.message
        cause = NO_CAPACITY if quota else CONFIG_ERROR
        threshold = ctx.thresholds.no_capacity_after if quota else ctx.thresholds.resources_failed_after
        status.queued_reason = {
            "reason": "pods-not-created",
            "message": latest.message,
            "since": iso(since),
        }
        waited = (ctx.now - since).total_seconds()
        if waited < threshold:
            recheck(status, since, threshold)
            return
        ev = [evidence_row(f"Job {namespace}/{job_name}", "event[FailedCreate]", latest.message, latest.at)]
        status.state = FAILED
        status.cause = cause
        status.message = f"the Job {job_name} could not create its pods for {int(waited)} s: {latest.message}"
        status.evidence = ev + status.evidence
        status.stop = True
        return


def jobset_create_failures(
    status: DerivedStatus,
    events: Sequence[EventView],
    jobset: Mapping[str, Any],
    jobs: Sequence[Mapping[str, Any]],
    restart_attempt: int,
    ctx: Context,
) -> None:
    """A JobSet that cannot create its Jobs (the API server refuses each: a pod template the Job API rejects,
    an admission denial, a quota on Jobs): its Warning JobCreationFailed events [J: jobset_controller.go
    reconcileReplicatedJobs] newer than the newest Job of the current restart attempt. Waits like
    create_failures ("exceeded quota" is no capacity, anything else a configuration error, 15 s), then fails
    the execution, which dispatch stops. Before, such a job read `queued: the JobSet's pods are being
    created` for ever (status-facts §10 lists JobCreationFailed as config-error evidence)."""
    name, uid = name_of(jobset), str(meta_of(jobset).get("uid") or "")
    streak = [
        e
        for e in events
        if e.kind == "JobSet"
        and e.reason == "JobCreationFailed"
        and e.name == name
        and (not e.uid or not uid or e.uid == uid)
        and not TRANSIENT_API_ERROR.search(e.message)  # the API server's outage: the controller retries
    ]
    if not streak:
        return
    made = [
        parse_time(meta_of(j).get("creationTimestamp"))
        for j in jobs
        if (as_int(labels_of(j).get(RESTART_ATTEMPT)) or 0) == restart_attempt
    ]
    newest_job = max((m for m in made if m), default=None)
    after = [
        e
        for e in streak
        if e.at is not None and (newest_job is None or e.at.replace(microsecond=0) > newest_job)
    ]
    if not after:
        return  # a Job was made after the last failure: resolved
    latest = max(after, key=lambda e: e.at or datetime.min.replace(tzinfo=UTC))
    since = min(e.first or e.at or ctx.now for e in after)
    if newest_job is not None and since < newest_job:
        since = newest_job
    quota = "exceeded quota" in latest.message
    threshold = ctx.thresholds.no_capacity_after if quota else ctx.thresholds.resources_failed_after
    status.queued_reason = {"reason": "jobs-not-created", "message": latest.message, "since": iso(since)}
    waited = (ctx.now - since).total_seconds()
    if waited < threshold:
        recheck(status, since, threshold)
        return
    ref = object_ref("JobSet", jobset)
    status.state = FAILED
    status.cause = NO_CAPACITY if quota else CONFIG_ERROR
    status.message = f"the JobSet could not create its Jobs for {int(waited)} s: {latest.message}"
    status.evidence = [
        evidence_row(ref, "event[JobCreationFailed]", latest.message, latest.at),
        *status.evidence,
    ]
    status.stop = True


def recheck(status: DerivedStatus, since: datetime, threshold: float) -> None:
    due = since + timedelta(seconds=threshold)
    if status.recheck_at is None or due < status.recheck_at:
        status.recheck_at = due


def waiting_causes(
    status: DerivedStatus,
    live: list[dict[str, Any]],
    events: Sequence[EventView],
    ctx: Context,
    *,
    running: bool,
) -> None:
    """Waiting causes of live pods: unschedulable (no-capacity), image pull, container config errors.
    Past their threshold the execution fails with that cause, and dispatch stops it."""
    unschedulable = [p for p in live if p.get("unschedulable") and p.get("phase") == "Pending"]
    if unschedulable:
        pod = min(unschedulable, key=lambda p: p["unschedulable"].get("since") or "~")
        info = pod["unschedulable"]
        message = info.get("message") or latest_event_message(events, pod["name"], "FailedScheduling")
        _wait_or_fail(
            status,
            ctx,
            pod,
            reason="unschedulable",
            cause=NO_CAPACITY,
            message=message,
            since_text=info.get("since"),
            threshold=ctx.thresholds.no_capacity_after,
            evidence=(
                "status.conditions[PodScheduled]",
                f"{info.get('reason')}: {message}",
            ),
            doing="be scheduled",
        )
        return
    for pod in live:
        for row in pod.get("containers", []) + pod.get("init_containers", []):
            waiting = row.get("waiting")
            if waiting in IMAGE_PULL_REASONS or waiting in CONFIG_WAITING_REASONS:
                cause = IMAGE_PULL if waiting in IMAGE_PULL_REASONS else CONFIG_ERROR
                since_text = first_event_time(
                    events, pod["name"], ("Failed", "BackOff", "ErrImageNeverPull")
                ) or pod.get("created")
                message = row.get("waiting_message") or waiting
                _wait_or_fail(
                    status,
                    ctx,
                    pod,
                    reason=cause,
                    cause=cause,
                    message=f"{waiting}: {message}",
                    since_text=since_text,
                    threshold=ctx.thresholds.stuck_after,
                    evidence=(f"status.containerStatuses[{row['name']}].state.waiting.reason", waiting),
                    doing="start",
                )
                return


def _wait_or_fail(
    status: DerivedStatus,
    ctx: Context,
    pod: Mapping[str, Any],
    *,
    reason: str,
    cause: str,
    message: str,
    since_text: str | None,
    threshold: float,
    evidence: tuple[str, Any],
    doing: str,
) -> None:
    """A waiting cause: the queued reason, and past its threshold a failure with that cause (dispatch then
    stops the TrainJob: it would never run)."""
    status.queued_reason = {"reason": reason, "message": message, "since": since_text, "pod": pod["name"]}
    since = parse_time(since_text)
    if since is None or (ctx.now - since).total_seconds() < threshold:
        if since is not None:
            recheck(status, since, threshold)
        return
    waited = int((ctx.now - since).total_seconds())
    status.state = FAILED
    status.cause = cause
    status.rank = pod.get("rank")
    status.message = f"rank {pod.get('rank')} could not {doing} for {waited} s: {message}"
    status.evidence = [evidence_row(pod_ref(pod), evidence[0], evidence[1], since_text), *status.evidence]
    status.stop = True


def waiting_evidence(pods: Iterable[Mapping[str, Any]], events: Sequence[EventView]) -> list[dict[str, Any]]:
    """What kept a timed-out job waiting (no-capacity, image pull), as evidence under the timeout."""
    out = []
    for pod in pods:
        info = pod.get("unschedulable")
        if info:
            out.append(
                evidence_row(
                    pod_ref(pod),
                    "status.conditions[PodScheduled]",
                    f"{info.get('reason')}: {info.get('message')}",
                    info.get("since"),
                )
            )
        for row in pod.get("containers", []):
            if row.get("waiting") in IMAGE_PULL_REASONS:
                out.append(
                    evidence_row(
                        pod_ref(pod),
                        f"status.containerStatuses[{row['name']}].state.waiting.reason",
                        row["waiting"],
                    )
                )
    return out
