"""Where a session's objects are (issue 35). On a queue of this cluster, everything is on the manager (the
cluster of dispatch's own KUBECONFIG). On a MultiKueue queue the session's TrainJob is the manager's, and
Kueue copies it to one worker cluster, named in its Workload's status.clusterName: the JobSet, Jobs and pods
(and so every command) are there only, read with dispatch's own credentials for that worker
(cluster.where.on_cluster). The worker is recorded as the session's `cluster` once the manager's Workload
names it, and kept (an eviction clears clusterName).

The session's owner chain (jobs.sessions.rules.Chain) starts at the TrainJob that owns its JobSet where the
pods run: on the manager the TrainJob its open made (by the UID it recorded); on a worker, MultiKueue's copy
of it, recognised as jobs.objects.is_worker_copy says (dispatch's labels, and MultiKueue's prebuilt-workload
annotation naming a manager Workload that the session's TrainJob controls)."""

from __future__ import annotations

from cluster import gateway
from cluster.where import MANAGER, on_cluster
from jobs.models import Session
from jobs.naming import WORKLOAD_JOB_UID_LABEL
from jobs.objects import TRAINJOB, is_ours, is_worker_copy
from jobs.sessions.rules import Placement, placement_of
from runtimes.models import SiteSettings


def domain_of(session: Session) -> str:
    """The label domain the session's objects carry (the site's current one for rows older than the field)."""
    return session.label_domain or SiteSettings.load().label_domain


def trainjob_uid(session: Session) -> str:
    """The UID of the session's TrainJob on the manager: the one its open recorded, else (a session opened
    before dispatch recorded it) the TrainJob under its name when dispatch made it for this session."""
    if session.trainjob_uid:
        return session.trainjob_uid
    with on_cluster(MANAGER):
        trainjob = gateway.get_namespaced(TRAINJOB, session.namespace, session.name)
    if trainjob is None or not is_ours(trainjob, domain_of(session), session.id):
        return ""
    return str((trainjob.get("metadata") or {}).get("uid") or "")


def placement(session: Session) -> Placement:
    """The manager's Workloads of the session's TrainJob (one list, by Kueue's job-uid label): the worker
    they name and their names. Nothing is read for a session without MultiKueue workers."""
    uid = session.trainjob_uid
    if not session.workers or not uid:
        return Placement(cluster="", workloads=())
    with on_cluster(MANAGER):
        workloads = gateway.list_objects(
            gateway.WORKLOADS, session.namespace, label_selector=f"{WORKLOAD_JOB_UID_LABEL}={uid}"
        ).items
    return placement_of(workloads, uid)


def session_place(*, session: Session) -> str:
    """Record the worker the session's Workload was admitted to, when the manager names one now (a new one
    replaces the recorded: Kueue placed it again); the cluster its pods are on ("": the manager).
    ClusterError when the manager cannot be read."""
    if not session.workers:
        return MANAGER
    found = placement(session).cluster
    if found and found != session.cluster:
        Session.objects.filter(pk=session.pk).update(cluster=found)
        session.cluster = found
    return session.cluster


def waiting_for_a_worker(session: Session) -> bool:
    """On a MultiKueue queue and no worker named yet: it has no pods anywhere."""
    return bool(session.workers) and not session.cluster


def root_uid(session: Session) -> str:
    """The UID of the TrainJob that owns the session's JobSet where its pods run: on the manager the session's
    TrainJob; on its worker, MultiKueue's copy of it there ("" while there is none: not copied yet, or gone).
    ClusterError when a cluster cannot be read."""
    if not session.workers:
        return trainjob_uid(session)
    if not session.cluster:
        return ""
    workloads = placement(session).workloads
    with on_cluster(session.cluster):
        copy = gateway.get_namespaced(TRAINJOB, session.namespace, session.name)
    if copy is None or not is_worker_copy(copy, domain_of(session), session.id, workloads):
        return ""
    return str((copy.get("metadata") or {}).get("uid") or "")
