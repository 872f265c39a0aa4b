"""What a cycle reads by list calls: a namespace's supervised objects (read_namespace: every cycle of the
beat's, and the reads the watch does not cover) and what the MultiKueue workers hold (issue 35).

Under MultiKueue a TrainJob's JobSet, Jobs, pods and their Events exist only on the worker its Workload was
admitted to (Workload.status.clusterName, kept as Execution.cluster); the TrainJob and the Workload stay on
the manager. In the beat's cycle each (worker, namespace) that has a supervised execution is read by the same
list calls as a namespace here, through dispatch's own credentials for that worker (cluster.where.on_cluster),
and kept apart: a worker that cannot be read makes only its own executions unknown, with the worker named.
The supervisor process watches the workers instead (jobs.supervision.worker_watch) and records their health
with record_worker_reads as well."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.utils import timezone

from cluster import gateway, kueue
from cluster.errors import ClusterError
from cluster.where import on_cluster
from jobs.evidence import from_its_reporter
from jobs.models import Execution, WorkerRead
from jobs.naming import trainjob_name_prefix
from jobs.supervision.grouping import EVENT, JOB, JOBSET, POD, TRAINJOB, WORKLOAD, ObjectSource, StaticIndex

LABELLED = {
    TRAINJOB: gateway.TRAINJOBS,
    JOBSET: gateway.JOBSETS,
    JOB: gateway.JOBS,
    POD: gateway.PODS,
}


def read_namespace(
    namespace: str, domains: Sequence[str], *, workloads: bool = True
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """One namespace's supervised objects by list calls: each labelled kind per label domain, the Events
    about dispatch's objects (every Event of the namespace is read; only those are kept) and, with
    `workloads`, Kueue's Workloads (a MultiKueue worker's are not read: the manager's is the job's). A failed
    read is named, and the others still count."""
    objects: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    for kind, resource in LABELLED.items():
        seen: set[str] = set()
        for domain in domains:
            try:
                listed = gateway.list_objects(resource, namespace, label_selector=f"{domain}/job")
            except ClusterError as exc:
                errors[kind] = str(exc)
                break
            for item in listed.items:
                uid = str((item.get("metadata") or {}).get("uid") or "")
                if uid not in seen:
                    seen.add(uid)
                    objects.append(item)
    try:
        events = gateway.list_objects(gateway.EVENTS, namespace).items
    except ClusterError as exc:
        errors[EVENT] = str(exc)
    else:
        objects.extend(e for e in events if is_dispatch_event(e))
    # Kueue's Workloads: one more list per namespace (none for a while once the group is found not served).
    # They carry no dispatch label; grouping counts one only when the job's TrainJob owns it.
    if not workloads:
        return objects, errors
    try:
        found = kueue.list_workloads(namespace)
    except ClusterError as exc:
        errors[WORKLOAD] = str(exc)
    else:
        objects.extend(found or ())
    return objects, errors


def is_dispatch_event(event: Mapping[str, Any]) -> bool:
    """An Event about an object named like one of dispatch's (a TrainJob name, or a child's that starts
    with one), and, when its reason is evidence, from the controller that writes it (jobs.evidence): the rest
    of a namespace's Events are not kept."""
    ref = event.get("involvedObject") or event.get("regarding") or {}
    return trainjob_name_prefix(str(ref.get("name", ""))) is not None and from_its_reporter(event)


# What a worker must answer for its executions to be judged (the TrainJob copy, JobSet, Jobs and pods).
WORKER_REQUIRED = (TRAINJOB, JOBSET, JOB, POD)


def read_workers(
    executions: Sequence[Execution], *, domain_of: Callable[[Execution], str]
) -> tuple[dict[str, ObjectSource], dict[tuple[str, str], dict[str, str]]]:
    """Per worker, an index of what its namespaces hold for the executions admitted there (read_namespace
    inside on_cluster(worker)); and per (worker, namespace), the reads that failed (kind -> message naming
    the worker). Nothing is read for a cluster with no MultiKueue execution."""
    wanted: dict[tuple[str, str], set[str]] = {}
    for execution in executions:
        if execution.cluster:
            wanted.setdefault((execution.cluster, execution.job.namespace), set()).add(domain_of(execution))
    objects: dict[str, list[dict[str, Any]]] = {}
    errors: dict[tuple[str, str], dict[str, str]] = {}
    for (worker, namespace), domains in sorted(wanted.items()):
        try:
            with on_cluster(worker):
                found, failed = read_namespace(namespace, sorted(domains), workloads=False)
        except ClusterError as exc:  # no credentials for it: every read failed
            found, failed = [], dict.fromkeys(WORKER_REQUIRED, str(exc))
        objects.setdefault(worker, []).extend(found)
        if failed:
            errors[(worker, namespace)] = failed
    record_worker_reads({worker for worker, _ in wanted}, errors)
    domains = {d for wanted_domains in wanted.values() for d in wanted_domains}
    return {worker: StaticIndex(found, domains) for worker, found in objects.items()}, errors


def record_worker_reads(workers: set[str], errors: Mapping[tuple[str, str], Mapping[str, str]]) -> None:
    """Keep how the reads of each worker went (jobs.models.WorkerRead, the overview's worker health and
    /metrics): answered, or failed with the first required read's error. One upsert per outcome."""
    now = timezone.now()
    failed: dict[str, str] = {}
    for (worker, _), kinds in sorted(errors.items()):
        required = [kinds[kind] for kind in WORKER_REQUIRED if kind in kinds]
        if required and worker not in failed:
            failed[worker] = required[0]
    answered = sorted(workers - set(failed))
    if answered:
        WorkerRead.objects.bulk_create(
            [WorkerRead(name=w, ok_at=now) for w in answered],
            update_conflicts=True,
            unique_fields=["name"],
            update_fields=["ok_at"],
        )
    if failed:
        WorkerRead.objects.bulk_create(
            [WorkerRead(name=w, failed_at=now, error=e[:2000]) for w, e in sorted(failed.items())],
            update_conflicts=True,
            unique_fields=["name"],
            update_fields=["failed_at", "error"],
        )


def worker_failures(execution: Execution, errors: Mapping[tuple[str, str], Mapping[str, str]]) -> list[str]:
    """The required reads that failed on the execution's worker ([] for one on this cluster)."""
    failed = errors.get((execution.cluster, execution.job.namespace), {}) if execution.cluster else {}
    return [failed[kind] for kind in WORKER_REQUIRED if kind in failed]
