"""What a lost MultiKueue worker still runs when it comes back. A worker that cannot be reached when an
attempt ends keeps that attempt's TrainJob copy and pods. Kueue's MultiKueue garbage collector removes a
remote copy whose manager objects are gone once it reaches the worker again, every `gcInterval`; a platform
that turned it off (gcInterval 0) would leave the pods running for ever. So the beat's sweep lists dispatch's
TrainJobs on each worker where an attempt ended recently, and removes the copy of every attempt that ended
(its objects removed on the manager): fenced first in the worker's namespace (the guard there refuses its
pods from then on), then deleted. Only MultiKueue's copies of dispatch's own TrainJobs are touched:
dispatch's labels and body stamp, the job's id, and MultiKueue's prebuilt-workload annotation."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.utils import timezone

from cluster import gateway
from cluster.errors import ClusterError
from cluster.fence import fence_best_effort
from cluster.where import on_cluster
from jobs.models import Execution
from jobs.naming import PREBUILT_WORKLOAD
from jobs.objects import MANAGED_BY, MANAGED_BY_LABEL, TRAINJOB, is_ours

logger = logging.getLogger(__name__)

# How long after an attempt ended its worker is still looked at: a worker lost longer than this keeps the
# copy (its namespace's fence still refuses the pods of any JobSet made again).
LOOK_BACK = timedelta(days=7)


def worker_leftovers_sweep(*, now: Any = None) -> dict[str, int]:
    """One pass over the (worker, namespace) pairs with attempts ended within LOOK_BACK: one list of
    dispatch's TrainJobs each; the copies of ended attempts are fenced and deleted. A worker that cannot be
    read is counted and left for the next pass."""
    now = now or timezone.now()
    counts = {"listed": 0, "deleted": 0, "unreachable": 0}
    pairs = (
        Execution.objects.filter(objects_removed_at__gte=now - LOOK_BACK)
        .exclude(cluster="")
        .values_list("cluster", "job__namespace")
        .distinct()
    )
    for cluster, namespace in sorted(set(pairs)):
        try:
            with on_cluster(cluster):
                listed = gateway.list_objects(
                    gateway.TRAINJOBS, namespace, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}"
                ).items
        except ClusterError as exc:
            logger.info("worker leftovers: %s/%s not read: %s", cluster, namespace, exc)
            counts["unreachable"] += 1
            continue
        counts["listed"] += 1
        copies = {
            str((t.get("metadata") or {}).get("name") or ""): t
            for t in listed
            if ((t.get("metadata") or {}).get("annotations") or {}).get(PREBUILT_WORKLOAD)
        }
        ended = Execution.objects.select_related("job").filter(
            cluster=cluster,
            job__namespace=namespace,
            trainjob_name__in=list(copies),
            objects_removed_at__isnull=False,
        )
        for execution in ended:
            copy = copies[execution.trainjob_name]
            if not is_ours(copy, execution.job.label_domain, execution.job_id):
                continue
            uid = str((copy.get("metadata") or {}).get("uid") or "")
            try:
                with on_cluster(cluster):
                    fence_best_effort(namespace, execution.trainjob_name)
                    deleted = gateway.delete_namespaced(TRAINJOB, namespace, execution.trainjob_name, uid=uid)
            except ClusterError as exc:
                logger.info(
                    "worker leftovers: %s %s/%s: %s", cluster, namespace, execution.trainjob_name, exc
                )
                continue
            if not deleted:  # gone meanwhile (Kueue's collector, or another sweep): nothing done here
                continue
            logger.warning(
                "deleted TrainJob %s/%s on %s: attempt %s of job %s ended while the worker was lost",
                namespace,
                execution.trainjob_name,
                cluster,
                execution.attempt,
                execution.job_id,
            )
            counts["deleted"] += 1
    return counts
