"""The derivation: one execution's observed objects -> state, typed cause, evidence (see the package).
Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from jobs.naming import KUEUE_QUEUE_LABEL
from jobs.supervision.status.events import EventView, event_view
from jobs.supervision.status.identity import identity_findings
from jobs.supervision.status.jobs import (
    disruption_from_job_messages,
    failed_job_conditions,
    failure_from_job_messages,
    raw_conditions,
)
from jobs.supervision.status.kueue import (
    admitted_cluster,
    kueue_dead_end,
    kueue_eviction,
    kueue_queued_reason,
    pods_ready_note,
)
from jobs.supervision.status.model import (
    CANCELLED,
    CONFIG_ERROR,
    EVICTED,
    FAILED,
    IDENTITY_VIOLATION,
    KILLED,
    NODE_LOST,
    PREEMPTED,
    QUEUED,
    RESTART_ATTEMPT,
    RUNNING,
    RUNTIME_MISSING,
    RUNTIME_NOT_FOUND,
    SUCCEEDED,
    TIMEOUT,
    TRAINJOB_GONE,
    TRANSIENT_API_ERROR,
    UNKNOWN_FAILURE,
    Context,
    DerivedStatus,
)
from jobs.supervision.status.pods import (
    PodFailure,
    classify_pod,
    condense_pod,
    disrupted_but_succeeded,
    ran,
    rank_row,
    sentence,
)
from jobs.supervision.status.readers import (
    as_int,
    as_map,
    attempt_of,
    evidence_row,
    iso,
    labels_of,
    meta_of,
    name_of,
    object_ref,
    true_condition,
)
from jobs.supervision.status.waiting import (
    create_failures,
    jobset_create_failures,
    recheck,
    waiting_causes,
    waiting_evidence,
)


def derive(
    objects: Sequence[Mapping[str, Any]],
    ctx: Context,
    memory: Mapping[str, Mapping[str, Any]] | None = None,
) -> DerivedStatus:
    """The state and typed cause of one execution from its observed objects (see the module docstring)."""
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(str(obj.get("kind", "")), []).append(obj)
    trainjob = next(iter(by_kind.get("TrainJob", [])), None)
    jobset = next(iter(by_kind.get("JobSet", [])), None)
    jobs = by_kind.get("Job", [])
    nodes = {name_of(n): n for n in by_kind.get("Node", [])}
    workloads = by_kind.get("Workload", [])
    events = sorted(
        (event_view(e) for e in by_kind.get("Event", [])),
        key=lambda e: e.at or datetime.min.replace(tzinfo=UTC),
    )

    attempt = ctx.attempt
    if attempt is None:
        candidates = [o for o in (trainjob, jobset) if o is not None] + [*jobs, *by_kind.get("Pod", [])]
        for obj in candidates:
            if (found := attempt_of(obj, ctx.label_domain)) is not None:
                attempt = found
                break

    # Pods: what is there now, plus what earlier cycles saw that is gone now.
    pods: dict[str, dict[str, Any]] = {}
    for uid, remembered in (memory or {}).items():
        pods[uid] = dict(remembered)
    present = set()
    for raw in by_kind.get("Pod", []):
        pod = condense_pod(raw, ctx.label_domain)
        if pod.get("attempt") is None:
            pod["attempt"] = attempt
        earlier = pods.get(pod["uid"])
        if earlier and earlier.get("disruption") and not pod.get("disruption"):
            pod["disruption"] = earlier["disruption"]
        pods[pod["uid"]] = pod
        present.add(pod["uid"])
    now_iso = iso(ctx.now)
    for uid, pod in pods.items():
        if uid not in present and not pod.get("gone"):
            pod["gone"] = now_iso

    restart_attempt = as_int(as_map((jobset or {}).get("status")).get("restarts")) or 0
    restart_attempt = max([restart_attempt, *(p.get("restart_attempt", 0) for p in pods.values())])
    status = DerivedStatus(
        state=QUEUED, restart_attempt=restart_attempt, pods=pods, cluster=admitted_cluster(workloads)
    )

    pod_events: dict[str, list[EventView]] = {}
    for event in events:
        if event.kind == "Pod":
            pod_events.setdefault(event.name, []).append(event)

    failures = [
        f
        for pod in pods.values()
        if (f := classify_pod(pod, pod_events.get(str(pod.get("name")), []), nodes, ctx.unread_nodes))
        is not None
    ]
    failures.sort(key=lambda f: (f.at or datetime.max.replace(tzinfo=UTC), f.pod.get("rank") or 0))
    # A rank its pod's deletion killed is evidence under whatever ended the attempt, never its cause.
    kills = [f for f in failures if f.cause == KILLED]
    failures = [f for f in failures if f.cause != KILLED]
    current_failures = [f for f in failures if f.pod.get("restart_attempt", 0) == restart_attempt]
    current_kills = [f for f in kills if f.pod.get("restart_attempt", 0) == restart_attempt]
    first = current_failures[0] if current_failures else (failures[0] if failures else None)

    status.identity_findings = identity_findings(pods.values(), warned=ctx.identity_warned)
    status.ranks = sorted(
        (rank_row(p, first.pod.get("uid") if first else None) for p in pods.values()),
        key=lambda r: (
            r["attempt"] or 0,
            r["restart_attempt"],
            r["rank"] if r["rank"] is not None else -1,
            r["pod"],
        ),
    )
    if restart_attempt:
        status.evidence.append(
            evidence_row(
                object_ref("JobSet", jobset) if jobset else "JobSet",
                "status.restarts",
                restart_attempt,
                (true_condition(jobset, "RestartingJobSet") or {}).get("lastTransitionTime")
                if jobset
                else None,
            )
        )

    def fail(
        cause: str, message: str, evidence: list[dict[str, Any]], failure: PodFailure | None = None
    ) -> None:
        status.state = FAILED
        status.cause = cause
        status.message = message
        status.evidence = evidence + status.evidence
        if failure is not None:
            status.rank = failure.pod.get("rank")
            status.exit_code = failure.exit_code

    def fail_from_pods(aggregate: list[dict[str, Any]]) -> None:
        """The chain behind an aggregate failure: the first failed pod is the cause, the others evidence.
        The chain runs through the current restart-attempt's failed Jobs (status-facts §10 precedence 1),
        whose conditions are kept as evidence; a Job whose terminal reason is its deadline makes the failure
        a timeout (precedence 4): its pods' 143s are the kill, not the cause."""
        chain = [e for e in failed_job_conditions(jobs, restart_attempt) if e not in aggregate]
        if any(e["value"].startswith("DeadlineExceeded") for e in chain):
            pods_ev = [e for f in current_failures for e in f.evidence]
            fail(TIMEOUT, "a Job ran past its activeDeadlineSeconds", chain + pods_ev + aggregate)
            return
        killed = [e for f in current_kills for e in f.evidence]
        if first is not None:
            others = [e for f in current_failures if f is not first for e in f.evidence]
            fail(
                first.cause,
                sentence(first, attempt),
                first.evidence + others + killed + chain + aggregate,
                first,
            )
            return
        message_failure = failure_from_job_messages(jobs) or disruption_from_job_messages(
            jobs, pod_events, nodes, ctx.unread_nodes
        )
        if message_failure is not None:
            cause, text, ev, rank, code = message_failure
            fail(cause, text, ev + killed + aggregate)
            status.rank, status.exit_code = rank, code
            return
        raw = (
            raw_conditions("TrainJob", trainjob)
            + raw_conditions("JobSet", jobset)
            + [e for job in jobs for e in raw_conditions("Job", job)]
        )
        if current_kills:
            # Only killed ranks: a deletion stopped them, and nothing observed says whose or why.
            kill = current_kills[0]
            fail(
                UNKNOWN_FAILURE,
                f"{sentence(kill, attempt)}; nothing observed says who deleted it or why",
                killed + raw + aggregate,
            )
            status.rank = kill.pod.get("rank")
            return
        fail(UNKNOWN_FAILURE, "the job failed and nothing observed explains why", raw or aggregate)

    # --- the TrainJob
    if trainjob is None:
        if first is not None:
            fail_from_pods([])
            return status
        status.state = CANCELLED
        status.cause = CANCELLED
        status.message = TRAINJOB_GONE
        status.evidence = [evidence_row("TrainJob", "metadata", "not found")]
        return status
    tj_ref = object_ref("TrainJob", trainjob)
    if meta_of(trainjob).get("deletionTimestamp"):
        status.state = CANCELLED
        status.cause = CANCELLED
        status.message = "the TrainJob is being deleted outside dispatch"
        status.evidence = [
            evidence_row(tj_ref, "metadata.deletionTimestamp", meta_of(trainjob).get("deletionTimestamp"))
        ]
        return status

    complete = true_condition(trainjob, "Complete") or (
        true_condition(jobset, "Completed") if jobset else None
    )
    if complete:
        # Complete wins the state (status-facts §12): a preempted rank that exits 0 on SIGTERM completes its
        # index. A rank that ran twice is still a finding: kept on the status (and the timeline), and said.
        status.state = SUCCEEDED
        status.message = str(complete.get("message") or "completed")
        unexpected = [f for f in status.identity_findings if not f.get("expected")]
        if unexpected:
            status.message += f"; identity finding: {unexpected[0]['why']}"
        # A rank disrupted (preempted, evicted, its node lost, its pod deleted) whose application exited 0 on
        # SIGTERM completed its index: the job reads succeeded, and says that a rank was stopped on the way.
        stopped = disrupted_but_succeeded(pods.values(), pod_events, nodes, ctx.unread_nodes)
        for rank, what, ev in stopped:
            status.evidence.extend(ev)
            status.warnings.append(
                {
                    "kind": "disruption",
                    "object": ev[0]["object"],
                    "message": f"rank {rank} {what} and exited 0 on SIGTERM: its Job counted the index as "
                    "complete, so the job's success may rest on unfinished work",
                }
            )
        if stopped:
            rank, what, _ = stopped[0]
            status.message += f"; but rank {rank} {what} and exited 0"
        return status

    failed = true_condition(trainjob, "Failed")
    if failed:
        reason = str(failed.get("reason", ""))
        ev = [
            evidence_row(
                tj_ref,
                "status.conditions[Failed]",
                f"{reason}: {failed.get('message', '')}",
                failed.get("lastTransitionTime"),
            )
        ]
        if reason == "DeadlineExceeded":
            waiting = waiting_evidence(pods.values(), events)
            fail(TIMEOUT, "the TrainJob ran past its activeDeadlineSeconds", ev + waiting)
            return status
        if reason == "TrainingRuntimeNotSupported":
            fail(CONFIG_ERROR, str(failed.get("message", "")), ev)
            return status
        fail_from_pods(ev)
        return status

    # Kueue: an eviction ends the attempt (status-facts §12). Kueue would resume this same TrainJob, and its
    # ranks would run again under the same identity: dispatch deactivates the Workload (with its mark, so the
    # `Deactivated` that follows reads as its own act), records the cause and stops the TrainJob; A+1, if the
    # recovery policy allows, is a new TrainJob. A Workload a user deactivated is the job cancelled.
    eviction = kueue_eviction(workloads, ctx.label_domain)
    if eviction is not None:
        status.queued_reason = {}
        if eviction.cause == CANCELLED:
            status.state = CANCELLED
            status.cause = CANCELLED
            status.message = eviction.message
            status.evidence = eviction.evidence
            return status
        fail(eviction.cause, eviction.message, eviction.evidence)
        status.stop = True
        status.deactivate = eviction.act
        return status

    if jobset is not None and true_condition(jobset, "Failed"):
        js_failed = true_condition(jobset, "Failed") or {}
        fail_from_pods(
            [
                evidence_row(
                    object_ref("JobSet", jobset),
                    "status.conditions[Failed]",
                    f"{js_failed.get('reason')}: {js_failed.get('message')}",
                )
            ]
        )
        return status

    # A Job of the current restart attempt failed (FailureTarget is written first, Failed follows once its
    # pods are gone): the TrainJob will fail with it, since the rules allow no restarts.
    for job in jobs:
        job_attempt = as_int(labels_of(job).get(RESTART_ATTEMPT)) or 0
        if job_attempt != restart_attempt:
            continue
        cond = true_condition(job, "Failed") or true_condition(job, "FailureTarget")
        if cond:
            if str(cond.get("reason")) == "DeadlineExceeded":
                fail(
                    TIMEOUT,
                    "a Job ran past its activeDeadlineSeconds",
                    [
                        evidence_row(
                            object_ref("Job", job),
                            f"status.conditions[{cond.get('type')}]",
                            "DeadlineExceeded",
                        )
                    ],
                )
                return status
            fail_from_pods(
                [
                    evidence_row(
                        object_ref("Job", job),
                        f"status.conditions[{cond.get('type')}]",
                        f"{cond.get('reason')}: {cond.get('message')}",
                        cond.get("lastTransitionTime"),
                    )
                ]
            )
            return status

    # A Workload Kueue will never run: the attempt ends, and dispatch stops the TrainJob.
    dead_end, look_again = kueue_dead_end(workloads, ctx.now, ctx.thresholds.inadmissible_after)
    if dead_end is not None:
        status.queued_reason = {}
        fail(dead_end.cause, dead_end.message, dead_end.evidence)
        status.stop = True
        return status
    if look_again is not None and (status.recheck_at is None or look_again < status.recheck_at):
        status.recheck_at = look_again

    suspended = true_condition(trainjob, "Suspended")
    if suspended or as_map(trainjob.get("spec")).get("suspend") is True:
        status.state = QUEUED
        since = (suspended or {}).get("lastTransitionTime")
        status.queued_reason = kueue_queued_reason(workloads) or {
            "reason": "awaiting-admission",
            "message": "the TrainJob is suspended, waiting for admission",
        }
        status.queued_reason.setdefault("since", since)
        if not workloads and not labels_of(trainjob).get(KUEUE_QUEUE_LABEL):
            # No Kueue queue manages it (dispatch sets the label for a job's queue_name): somebody suspended
            # it by hand, and nothing will resume it. Reversible, so not cancelled; named, so not a mystery.
            status.queued_reason = {
                "reason": "suspended",
                "message": "the TrainJob was suspended outside dispatch (spec.suspend: true) and no Kueue "
                "queue manages it: it waits until spec.suspend is set back to false, or the job is cancelled",
                "since": since,
            }
        return status

    if jobset is None:
        creation = [
            e for e in events if e.reason == "TrainJobResourcesCreationFailed" and e.name == name_of(trainjob)
        ]
        unanswered = [e for e in creation if TRANSIENT_API_ERROR.search(e.message)]
        creation = [e for e in creation if e not in unanswered]  # the API server's outage, retried
        if unanswered and not creation:
            status.queued_reason = {
                "reason": "awaiting-jobset",
                "message": "the Trainer has not built the JobSet yet: the API server did not answer it "
                f"({unanswered[-1].message}); it retries",
                "since": meta_of(trainjob).get("creationTimestamp"),
            }
            return status
        if creation:
            latest = creation[-1]
            ev = [evidence_row(tj_ref, "event[TrainJobResourcesCreationFailed]", latest.message, latest.at)]
            if RUNTIME_NOT_FOUND.search(latest.message):
                fail(
                    RUNTIME_MISSING,
                    "the TrainJob's runtime copy is gone; the Trainer cannot build its JobSet",
                    ev,
                )
                status.stop = True
                return status
            since = creation[0].at
            if since and (ctx.now - since).total_seconds() >= ctx.thresholds.resources_failed_after:
                fail(CONFIG_ERROR, latest.message, ev)
                status.stop = True
                return status
            if since:
                recheck(status, since, ctx.thresholds.resources_failed_after)
        status.queued_reason = {
            "reason": "awaiting-jobset",
            "message": "the Trainer has not built the JobSet yet",
            "since": meta_of(trainjob).get("creationTimestamp"),
        }
        return status

    live = [
        p
        for p in pods.values()
        if not p.get("gone") and not p.get("deleting") and p.get("restart_attempt", 0) == restart_attempt
    ]

    # The identity promise: a rerun nothing else explains stops the execution.
    unexpected = [
        f
        for f in status.identity_findings
        if not f.get("expected") and f["restart_attempt"] == restart_attempt
    ]
    if unexpected:
        finding = unexpected[0]
        identity_ev = [
            evidence_row(f"Pod {meta_of(trainjob).get('namespace')}/{name}", "identity", finding["why"])
            for name in finding["pods"]
        ]
        # §10 precedence 7: when a preemption, a lost node or an eviction caused the rerun, that is the
        # cause and the identity evidence is attached.
        disrupted = [
            f
            for f in current_failures
            if f.cause in (PREEMPTED, NODE_LOST, EVICTED) and f.pod.get("name") in finding["pods"]
        ]
        if disrupted:
            fail(disrupted[0].cause, sentence(disrupted[0], attempt), disrupted[0].evidence + identity_ev)
            status.rank = finding["rank"]
            status.stop = True
            return status
        fail(
            IDENTITY_VIOLATION,
            f"rank {finding['rank']} ran twice under one identity: {finding['why']}",
            identity_ev,
        )
        status.rank = finding["rank"]
        status.stop = True
        return status

    # Under dispatch's rules (backoffLimit 0, no podFailurePolicy Ignore, no per-index retries, no JobSet
    # restarts) a rank pod that ended Failed fails its Job, and the JobSet and TrainJob with it: read it now,
    # not after the Job controller writes it (it batches pod updates for a second, longer when busy). With the
    # plan's allowRankRestart warning the Job may replace the pod: then its condition decides.
    if not ctx.identity_warned and any(f.pod.get("phase") == "Failed" for f in current_failures):
        fail_from_pods([])
        return status

    running = [p for p in live if p.get("phase") == "Running"]
    if running:
        status.state = RUNNING
        status.message = f"{len(running)} of {len(live)} pods running"
        waiting_causes(status, live, events, ctx, running=True)
    elif live and all(p.get("phase") == "Succeeded" for p in live):
        status.state = RUNNING
        status.message = "all pods succeeded; the TrainJob is completing"
    else:
        status.state = QUEUED
        waiting_causes(status, live, events, ctx, running=False)
        if not status.queued_reason:
            status.queued_reason = {
                "reason": "awaiting-pods",
                "message": "the JobSet's pods are being created",
                "since": meta_of(jobset).get("creationTimestamp"),
            }
        note = pods_ready_note(workloads)
        if note:
            status.queued_reason = {
                **status.queued_reason,
                "kueue": "awaiting-pods-ready",
                "message": f"{status.queued_reason.get('message', '')}; {note}".strip("; "),
            }
    if status.state in (RUNNING, QUEUED):
        jobset_create_failures(status, events, jobset, jobs, restart_attempt, ctx)
    if status.state in (RUNNING, QUEUED):
        create_failures(status, events, jobs, pods, restart_attempt, ctx, meta_of(trainjob).get("namespace"))
    if status.state == QUEUED and (ctx.ran or ran(pods.values())):
        # A job that ran never reads `queued` again unless Kueue requeued it (a suspended TrainJob, above):
        # its pods ended or are going (the Job reports the failure a moment later), or are being replaced.
        status.state = RUNNING
        status.message = f"0 of {len(live)} pods running"
        if current_failures:
            status.message += (
                f"; {sentence(current_failures[0], attempt)}, waiting for its Job to report the failure"
            )
    return status
