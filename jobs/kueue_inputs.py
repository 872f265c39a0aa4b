"""What a job or a session reads of Kueue to be planned: its queue and priority class, and the Kueue objects
they name (jobs.queueing judges them, purely). Shared by planning a job (jobs.submission.planning) and
opening a session (jobs.sessions.services), so both go through the same queues by the same rules."""

from __future__ import annotations

from typing import Any

from cluster import kueue
from cluster.client import has_credentials
from jobs.queueing import (
    NO_KUEUE,
    KueueInputs,
    admission_check_names,
    choose_queue,
    multikueue_config_name,
    multikueue_workers,
)
from jobs.spec import JobSpec
from runtimes.models import SiteSettings
from runtimes.settings_checks import allowed_priority_classes


def kueue_inputs(*, spec: JobSpec, site: SiteSettings) -> KueueInputs:
    """The job's queue and priority class (its own, else its namespace's defaults) and the Kueue objects they
    name, read afresh (a ClusterQueue's usage is live data). Nothing is read when the job uses no queue and
    no priority class, so a cluster without Kueue plans and starts such jobs as before. ClusterError when
    the cluster cannot be read; Kueue not being installed is a fact of the plan, not an error."""
    choice = choose_queue(spec, site.kueue_default_queues or {})
    if not choice.uses_kueue:
        return NO_KUEUE
    allowed = allowed_priority_classes(spec.namespace, site.kueue_priority_classes or {})
    local_queue = cluster_queue = priority_class = None
    workers: tuple[str, ...] = ()
    try:
        if choice.queue:
            local_queue = kueue.get_local_queue(spec.namespace, choice.queue)
            cq_name = ((local_queue or {}).get("spec") or {}).get("clusterQueue")
            if cq_name:
                cluster_queue = kueue.get_cluster_queue(str(cq_name))
            if cluster_queue is not None:
                workers = _multikueue_workers(cluster_queue)
        if choice.priority_class and choice.priority_class in allowed:
            priority_class = kueue.get_priority_class(choice.priority_class)
    except kueue.KueueNotInstalled:
        return KueueInputs(choice=choice, allowed_classes=allowed, installed=False)
    return KueueInputs(
        choice=choice,
        allowed_classes=allowed,
        local_queue=local_queue,
        cluster_queue=cluster_queue,
        priority_class=priority_class,
        workers=workers,
        workers_without_credentials=tuple(w for w in workers if not has_credentials(w)),
    )


def _multikueue_workers(cluster_queue: dict[str, Any]) -> tuple[str, ...]:
    """The worker clusters a ClusterQueue's MultiKueue admission checks dispatch to (one read per check the
    ClusterQueue names, and one per MultiKueueConfig; none for a ClusterQueue without checks)."""
    workers: list[str] = []
    for name in admission_check_names(cluster_queue):
        config = multikueue_config_name(kueue.get_admission_check(name))
        if config:
            workers += multikueue_workers(kueue.get_multikueue_config(config))
    return tuple(dict.fromkeys(workers))
