"""What the run finds once the submissions and the faults are over: it lets dispatch settle, keeps the
identity observer watching OBSERVE_AFTER_SETTLE seconds more, reads every job through the API and its pods and
TrainJobs from the API server, judges each job against its plan, takes the observer's readings (its verdict,
attempts overlapping, TrainJob UIDs, its coverage, its gaps and errors) and reconciles the database with the
cluster."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Final

from scripts.chaoslib.common import log
from scripts.chaoslib.context import Context
from scripts.chaoslib.faults_kueue import kueue_wave_hits
from scripts.chaoslib.kube import Kube, pod_identity
from scripts.chaoslib.outcomes import TERMINAL, judge_jobs
from scripts.chaoslib.plan import policy_differences
from scripts.identity_verdict import ranks_seen

DOMAIN_LABEL_SUFFIXES: Final = ("/job", "/attempt")
OBSERVE_AFTER_SETTLE: Final = 60.0  # what a broken build does right after it looks settled is seen too
RANKS: Final = 2  # every planned job's num_nodes (plan.job_body)
# The final states whose last attempt ran every rank: the observer must have seen each of them run.
RAN_TO_THE_END: Final = (("succeeded", ""), ("failed", "app-error"))


@dataclass
class Findings:
    accepted: dict[str, dict[str, Any]]  # job id -> the run's entry of every accepted job
    settled: float  # seconds from the end of the faults until nothing was outstanding (or the settle time)
    seen: dict[str, dict[str, Any]]  # job id -> the job as the API showed it
    results: list[dict[str, Any]]
    mismatches: list[dict[str, Any]]
    running_after_end: dict[str, list[str]]
    workers_exited: list[dict[str, Any]]
    observed: dict[str, Any]  # the identity observer's report
    coverage: dict[str, Any]  # the final attempts whose ranks the observer had to see run, and what it missed
    unexpected_plans: list[dict[str, Any]]  # plan answers (and stored policies) the harness did not expect
    orphans: list[str]
    lost: list[str]
    stuck: list[str]
    deadlocks: int
    fence_refusals: list[str]  # "<Job>: <message>" for each pod of an ended attempt the guard's fence refused


def collect(ctx: Context, accepted: dict[str, dict[str, Any]], faults_over: float) -> Findings:
    run, kube, namespace = ctx.run, ctx.kube, ctx.namespace
    settled = settle(accepted, faults_over, ctx.args.settle_seconds)
    log(f"settled after {settled:.0f} s; the observer watches {ctx.args.observe_after:.0f} s more")
    time.sleep(ctx.args.observe_after)
    log("reading every job through the API")

    # -- every job as the API shows it, and its pods as the API server lists them
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 120
    for job_id in accepted:
        response = ctx.client.call("GET", f"/api/v1/jobs/{job_id}", ctx.token, deadline)
        seen[job_id] = (
            response.json()
            if response is not None and response.status_code == 200
            else {"state": None, "message": "could not be read"}
        )
    pods = pods_by_job(kube, namespace)
    for _ in range(10):  # the garbage collector's last deletes
        if not any(accepted[j].get("cancel") == "accepted" and pods.get(j) for j in seen):
            break
        time.sleep(2)
        pods = pods_by_job(kube, namespace)

    trainjobs: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs"
    )["items"]
    kueue_wave_hits(ctx)  # every Kueue eviction of the wave's Workloads, watched until now
    outage = any(f["fault"] == "kill-apiserver" for f in run.faults)
    results, mismatches = judge_jobs(
        accepted,
        run.hits,
        seen,
        pods,
        trainjobs_by_job(trainjobs),
        plane_outage=outage,
        unseen=run.unseen,
    )
    running_after_end = {
        j: [f"{p['name']} ({p['phase']})" for p in pods.get(j, []) if p["phase"] in ("Pending", "Running")]
        for j in accepted
        if seen[j].get("state") in TERMINAL
    }
    running_after_end = {j: v for j, v in running_after_end.items() if v}
    workers_exited = ctx.stack.workers_that_exited()

    # -- the identity observer: its verdict, overlaps, TrainJob UIDs, and whether it saw what it had to
    ctx.observer.stop()
    observed = ctx.observer.report(namespaces=[namespace])
    (ctx.run_dir / "observer.json").write_text(json.dumps(observed, indent=1, sort_keys=True))
    coverage = observer_coverage(observed["records"], namespace, seen)
    unexpected_plans = [
        {"job": job_id, "index": e["index"], "problems": problems}
        for job_id, e in accepted.items()
        if (problems := [*e.get("unexpected_plan", []), *stored_policy_problems(e, seen[job_id])])
    ]
    unexpected_plans += [
        {"job": None, "index": e["index"], "problems": e["unexpected_plan"]}
        for e in run.jobs.values()
        if not e.get("id") and e.get("unexpected_plan")
    ]

    orphans, lost, stuck = reconcile(accepted, trainjobs, run.domains)
    pg_log = ctx.pg.log
    deadlocks = pg_log.read_text(errors="replace").count("deadlock detected") if pg_log.exists() else 0
    return Findings(
        fence_refusals=fence_refusals(kube, namespace),
        accepted=accepted,
        settled=settled,
        seen=seen,
        results=results,
        mismatches=mismatches,
        running_after_end=running_after_end,
        workers_exited=workers_exited,
        observed=observed,
        coverage=coverage,
        unexpected_plans=unexpected_plans,
        orphans=orphans,
        lost=lost,
        stuck=stuck,
        deadlocks=deadlocks,
    )


FENCED: Final = "fenced by dispatch"  # deploy/guard/fence.yaml's refusal message


def fence_refusals(kube: Kube, namespace: str) -> list[str]:
    """The pods of ended attempts the admission guard's fence refused (deploy/guard/fence.yaml), from the Job
    controller's FailedCreate Events: a controller acting on a stale cache tried to run an ended attempt's
    ranks again. Not a figure (nothing dispatch controls makes a controller stale); it says when the fence
    held a violation off."""
    try:
        events = kube.core.list_namespaced_event(
            namespace, field_selector="reason=FailedCreate", _request_timeout=30
        ).items
    except Exception as exc:  # a reading for the report, never a reason to lose the run's figures
        return [f"(could not list Events: {exc})"]
    return [
        f"Job {e.involved_object.name} x{e.count or 1}: {e.message}"
        for e in events
        if FENCED in (e.message or "")
    ]


def observer_coverage(
    records: list[dict[str, Any]], namespace: str, seen: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The final attempts the observer must have seen every rank of run (jobs that ended succeeded, or failed
    with an app error: every rank ran), and those it did not."""
    wanted = {
        (namespace, job_id, str(job.get("current_attempt"))): RANKS
        for job_id, job in seen.items()
        if (job.get("state"), job.get("cause") or "") in RAN_TO_THE_END
    }
    counted = ranks_seen(records, wanted)
    missing = [
        {"job": job_id, "attempt": attempt, "ranks_seen": counted[(ns, job_id, attempt)], "ranks": ranks}
        for (ns, job_id, attempt), ranks in sorted(wanted.items())
        if counted[(ns, job_id, attempt)] < ranks
    ]
    return {"wanted": len(wanted), "covered": len(wanted) - len(missing), "missing": missing}


def stored_policy_problems(entry: dict[str, Any], job: dict[str, Any]) -> list[str]:
    """The recovery policy stored with the accepted job (GET /api/v1/jobs/<id>) against the harness's."""
    if "recovery_policy" not in job:
        return []
    return [
        f"stored recovery policy {d}" for d in policy_differences(entry["policy"], job["recovery_policy"])
    ]


def settle(accepted: dict[str, dict[str, Any]], faults_over: float, settle_seconds: float) -> float:
    """Until every accepted job is terminal and no delete is outstanding, or the settle time ran out: the
    seconds it took."""
    from django.db import connections

    from jobs.models import TERMINAL_STATES, Execution, Job

    def outstanding() -> tuple[int, int]:
        connections.close_all()
        try:
            active = Job.objects.filter(pk__in=list(accepted)).exclude(state__in=TERMINAL_STATES).count()
            deletes = Execution.objects.filter(
                job_id__in=list(accepted),
                delete_requested_at__isnull=False,
                objects_removed_at__isnull=True,
            ).count()
        except Exception as exc:
            log(f"settle: database not answering: {exc}")
            return 1, 1
        return active, deletes

    while time.monotonic() < faults_over + settle_seconds:
        active, deletes = outstanding()
        if not active and not deletes:
            break
        time.sleep(5)
    return time.monotonic() - faults_over


def pods_by_job(kube: Kube, namespace: str) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for pod in kube.pods(namespace):
        who = pod_identity(pod)
        if who["job_controlled"] and who["job"]:
            grouped.setdefault(who["job"], []).append(who)
    return grouped


def trainjobs_by_job(trainjobs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    trainjobs_of: dict[str, list[dict[str, Any]]] = {}
    for tj in trainjobs:
        conditions = (tj.get("status") or {}).get("conditions") or []
        trainjobs_of.setdefault(tj["metadata"]["name"].rsplit("-", 1)[0], []).append(
            {
                "name": tj["metadata"]["name"],
                "deleting": bool(tj["metadata"].get("deletionTimestamp")),
                "conditions": [f"{c.get('type')}={c.get('status')}" for c in conditions],
                "labels": {
                    k: v
                    for k, v in (tj["metadata"].get("labels") or {}).items()
                    if k.endswith(DOMAIN_LABEL_SUFFIXES)
                },
            }
        )
    return trainjobs_of


def reconcile(
    accepted: dict[str, dict[str, Any]], trainjobs: list[dict[str, Any]], domains: list[str]
) -> tuple[list[str], list[str], list[str]]:
    """The database against the cluster at the end: (orphaned TrainJobs, lost jobs, stuck jobs). (TrainJobs
    made twice for one (job, attempt) are the observer's: it watched every UID for the whole run.)"""
    from django.db import connections

    from jobs.models import TERMINAL_STATES, Execution, Job

    connections.close_all()
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=list(accepted))}
    executions = list(Execution.objects.filter(job_id__in=list(jobs)))
    orphans = []
    for tj in trainjobs:
        meta = tj["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels") or {}
        key = ("", "")
        for domain in domains:
            if f"{domain}/job" in labels:
                key = (labels[f"{domain}/job"], labels.get(f"{domain}/attempt", ""))
        conditions = (tj.get("status") or {}).get("conditions") or []
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
        )
        job = jobs.get(key[0])
        behind = job is not None and job.state not in TERMINAL_STATES and str(job.current_attempt) == key[1]
        if not finished and not behind:
            orphans.append(meta["name"])
    submitted = {e.job_id for e in executions if e.submitted_at is not None}
    lost = [
        job_id
        for job_id in accepted
        if job_id not in jobs
        or (jobs[job_id].state in ("failed", "unknown") and not jobs[job_id].cause)
        or (job_id not in submitted and jobs[job_id].state not in ("cancelled", "refused", "failed"))
    ]
    stuck = [j.pk for j in jobs.values() if j.state not in TERMINAL_STATES]
    return orphans, lost, stuck
