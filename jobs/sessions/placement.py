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

from collections.abc import Sequence

from cluster import exec as pods
from cluster import gateway
from cluster.where import MANAGER, on_cluster
from jobs.models import Session
from jobs.naming import WORKLOAD_JOB_UID_LABEL
from jobs.objects import TRAINJOB, is_ours, is_worker_copy
from jobs.sessions.rules import Chain, Placement, chained_pods, placement_of
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


def session_pods(session: Session) -> list[pods.PodInfo]:
    """The session's pods: those carrying its labels that are in its TrainJob's owner chain, where they run
    (its MultiKueue worker: none while no worker is named)."""
    if waiting_for_a_worker(session):
        return []
    selector = f"{pods.JOBSET_NAME_LABEL}={session.name},{domain_of(session)}/job={session.id}"
    with on_cluster(session.cluster):
        labelled = pods.list_pods(session.namespace, selector)
    if not labelled:
        return []
    return chained_pods(labelled, session_chain(session))


def session_chain(session: Session, labelled: Sequence[pods.PodInfo] = ()) -> Chain:
    """The session's TrainJob -> JobSet -> Job links as the cluster shows them now: its JobSet (by name) and
    the Jobs carrying its JobSet's label, plus, read by name, the Job of every labelled pod not among them
    (a Job without the label is somebody else's, or gone). The JobSet and Jobs are read where the pods run
    (its MultiKueue worker), the TrainJob they lead to is root_uid's."""
    namespace, name = session.namespace, session.name
    root = root_uid(session)
    with on_cluster(session.cluster):
        jobsets = gateway.list_objects(
            gateway.JOBSETS, namespace, field_selector=f"metadata.name={name}"
        ).items
        jobs = gateway.list_objects(
            gateway.JOBS, namespace, label_selector=f"{pods.JOBSET_NAME_LABEL}={name}"
        ).items
        listed = {str(j["metadata"].get("uid")) for j in jobs}
        for owner in sorted(
            {p.owner_name for p in labelled if p.owner_kind == "Job" and p.owner_uid not in listed}
        ):
            jobs += gateway.list_objects(
                gateway.JOBS, namespace, field_selector=f"metadata.name={owner}"
            ).items
    return Chain.of(name=name, trainjob_uid=root, jobsets=jobsets, jobs=jobs)
