"""What the run finds once the submissions and the faults are over: it lets dispatch settle, reads every job
through the API and its pods and TrainJobs from the API server, judges each job against its plan, takes the
identity observer's verdict and reconciles the database with the cluster."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from scripts.chaoslib.common import log
from scripts.chaoslib.context import Context
from scripts.chaoslib.kube import Kube, pod_identity
from scripts.chaoslib.outcomes import TERMINAL, judge_jobs

DOMAIN_LABEL_SUFFIXES: Final = ("/job", "/attempt")


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
    allowed: list[str]  # jobs whose plan answer carried an identity warning
    per_key: Counter[tuple[str, str]]  # TrainJobs not being deleted, per (job, attempt) label
    orphans: list[str]
    lost: list[str]
    stuck: list[str]
    deadlocks: int


def collect(ctx: Context, accepted: dict[str, dict[str, Any]], faults_over: float) -> Findings:
    run, kube, namespace = ctx.run, ctx.kube, ctx.namespace
    settled = settle(accepted, faults_over, ctx.args.settle_seconds)
    log(f"settled after {settled:.0f} s; reading every job through the API")

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
    results, mismatches = judge_jobs(accepted, run.hits, seen, pods, trainjobs_by_job(trainjobs))
    running_after_end = {
        j: [f"{p['name']} ({p['phase']})" for p in pods.get(j, []) if p["phase"] in ("Pending", "Running")]
        for j in accepted
        if seen[j].get("state") in TERMINAL
    }
    running_after_end = {j: v for j, v in running_after_end.items() if v}
    workers_exited = ctx.stack.workers_that_exited()

    # -- the identity observer's verdict (allowed: jobs whose plan answer carried an identity warning)
    ctx.observer.stop()
    allowed = sorted(e["id"] for e in accepted.values() if e.get("identity_warnings"))
    observed = ctx.observer.report(allowed_jobs=allowed, namespaces=[namespace])
    (ctx.run_dir / "observer.json").write_text(json.dumps(observed, indent=1, sort_keys=True))

    per_key, orphans, lost, stuck = reconcile(accepted, trainjobs, run.domains)
    pg_log = ctx.pg.log
    deadlocks = pg_log.read_text(errors="replace").count("deadlock detected") if pg_log.exists() else 0
    return Findings(
        accepted=accepted,
        settled=settled,
        seen=seen,
        results=results,
        mismatches=mismatches,
        running_after_end=running_after_end,
        workers_exited=workers_exited,
        observed=observed,
        allowed=allowed,
        per_key=per_key,
        orphans=orphans,
        lost=lost,
        stuck=stuck,
        deadlocks=deadlocks,
    )


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
) -> tuple[Counter[tuple[str, str]], list[str], list[str], list[str]]:
    """The database against the cluster: (TrainJobs per (job, attempt), orphaned TrainJobs, lost jobs, stuck
    jobs)."""
    from django.db import connections

    from jobs.models import TERMINAL_STATES, Execution, Job

    connections.close_all()
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=list(accepted))}
    executions = list(Execution.objects.filter(job_id__in=list(jobs)))
    per_key: Counter[tuple[str, str]] = Counter()
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
        per_key[key] += 1
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
    return per_key, orphans, lost, stuck
