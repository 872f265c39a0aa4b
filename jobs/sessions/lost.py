"""A session whose MultiKueue worker is lost (issue 35), as a job's attempt is (cause `cluster-lost`): once
Kueue evicts its Workload for the lost worker (jobs.sessions.loss.worker_loss), dispatch deactivates that
Workload with its mark (MultiKueue then never places the session's TrainJob on another worker), fails the
session naming the worker and closes it at once (jobs.sessions.services.session_close: the manager's
TrainJob and runtime copies go; nothing on the lost worker is waited for). When the worker answers again,
the leftovers sweep removes what it still holds of such sessions: MultiKueue's copy of the TrainJob (and so
its pods), then the runtime copy dispatch put there. Every step is idempotent or compare-and-set, so a
sweep delivered twice, or racing a close, is harmless."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any, Final

from django.utils import timezone

from cluster import gateway, kueue
from cluster.errors import ClusterError
from cluster.where import MANAGER, on_cluster
from jobs.models import Session, SessionState
from jobs.naming import PREBUILT_WORKLOAD, WORKLOAD_JOB_UID_LABEL, kueue_mark_key
from jobs.objects import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    TRAINING_RUNTIME,
    TRAINJOB,
    is_ours,
    worker_runtime_copies_delete,
)
from jobs.sessions.loss import loss_mark, worker_loss
from jobs.sessions.placement import domain_of
from jobs.sessions.services import session_close, session_set_state

logger = logging.getLogger(__name__)

# The sessions whose worker is looked at: on a MultiKueue worker, not closed.
WATCHED: Final = frozenset(
    {SessionState.STARTING, SessionState.RUNNING, SessionState.FAILED, SessionState.CLOSING}
)
# How long after a session's worker was lost that worker is still looked at for its leftovers (as for jobs,
# jobs.submission.leftovers.LOOK_BACK).
LOOK_BACK: Final = timedelta(days=7)
BATCH: Final = 200


def session_worker_lost(*, session_id: str) -> Session | None:
    """One look at the manager's Workloads of a session placed on a MultiKueue worker: when they say the
    worker is lost, the Workload is deactivated (with dispatch's mark), the session records when its worker
    was lost, a starting or running one fails naming the worker, and it is closed (its TrainJob released).
    A read or a deactivation that fails is left for the next look (the failure is still written: the user
    is told; the close deactivates the Workload too)."""
    session = Session.objects.filter(pk=session_id).first()
    if session is None or session.state not in WATCHED or not session.cluster or not session.trainjob_uid:
        return session
    label_domain = domain_of(session)
    try:
        with on_cluster(MANAGER):
            workloads = gateway.list_objects(
                gateway.WORKLOADS,
                session.namespace,
                label_selector=f"{WORKLOAD_JOB_UID_LABEL}={session.trainjob_uid}",
            ).items
    except ClusterError as exc:
        logger.warning("session %s: cannot read its Workload: %s", session.id, exc)
        return session
    loss = worker_loss(
        workloads, trainjob_uid=session.trainjob_uid, label_domain=label_domain, worker=session.cluster
    )
    if loss is None:
        return session
    now = timezone.now()
    if loss.workload is not None:
        mark = loss_mark(loss, worker=session.cluster, now=now)
        try:
            with on_cluster(MANAGER):
                outcome = kueue.deactivate_workload(
                    namespace=loss.workload["namespace"],
                    name=loss.workload["name"],
                    uid=loss.workload["uid"],
                    annotations={kueue_mark_key(label_domain): json.dumps(mark, sort_keys=True)},
                )
            logger.info(
                "session %s: Workload %s %s (worker lost)", session.id, loss.workload["name"], outcome
            )
        except ClusterError as exc:
            logger.warning("session %s: could not deactivate its Workload: %s", session.id, exc)
    Session.objects.filter(pk=session.pk, worker_lost_at__isnull=True).update(worker_lost_at=now)
    if session_set_state(
        session, {SessionState.STARTING, SessionState.RUNNING}, SessionState.FAILED, message=loss.message
    ):
        logger.warning("session %s failed: %s", session.id, loss.message)
    session.refresh_from_db()
    if session.state == SessionState.FAILED:
        return session_close(actor=None, session=session, reason=session.message)
    return session


def sessions_worker_lost_sweep() -> dict[str, int]:
    """The beat's look at every session on a MultiKueue worker that is not closed and not yet known lost."""
    counts = {"looked": 0, "lost": 0}
    ids = list(
        Session.objects.filter(state__in=WATCHED, worker_lost_at__isnull=True)
        .exclude(cluster="")
        .exclude(trainjob_uid="")
        .order_by("updated_at")
        .values_list("pk", flat=True)[:BATCH]
    )
    for session_id in ids:
        counts["looked"] += 1
        found = session_worker_lost(session_id=session_id)
        if found is not None and found.worker_lost_at is not None:
            counts["lost"] += 1
    return counts


def session_leftovers_sweep(*, now: Any = None) -> dict[str, int]:
    """One pass over the (worker, namespace) pairs where a session's worker was lost within LOOK_BACK and
    the session is closing or closed (its manager TrainJob deleted, or being deleted): one list of
    dispatch's TrainJobs each; MultiKueue's copy of such a session's TrainJob is deleted under its UID (its
    pods go with it), and once no copy is left the session's runtime copy on that worker too. A worker that
    cannot be read is counted and left for the next pass."""
    now = now or timezone.now()
    counts = {"listed": 0, "deleted": 0, "unreachable": 0}
    lost = list(
        Session.objects.filter(
            worker_lost_at__gte=now - LOOK_BACK, state__in=(SessionState.CLOSING, SessionState.CLOSED)
        ).exclude(cluster="")
    )
    pairs: dict[tuple[str, str], list[Session]] = {}
    for session in lost:
        pairs.setdefault((session.cluster, session.namespace), []).append(session)
    for (cluster, namespace), sessions in sorted(pairs.items(), key=lambda pair: pair[0]):
        try:
            with on_cluster(cluster):
                listed = gateway.list_objects(
                    gateway.TRAINJOBS, namespace, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}"
                ).items
        except ClusterError as exc:
            logger.info("session leftovers: %s/%s not read: %s", cluster, namespace, exc)
            counts["unreachable"] += 1
            continue
        counts["listed"] += 1
        copies = {
            str((t.get("metadata") or {}).get("name") or ""): t
            for t in listed
            if ((t.get("metadata") or {}).get("annotations") or {}).get(PREBUILT_WORKLOAD)
        }
        for session in sessions:
            counts["deleted"] += _leftovers_delete(session, cluster, copies.get(session.name))
    return counts


def _leftovers_delete(session: Session, cluster: str, copy: dict[str, Any] | None) -> int:
    """Delete the session's TrainJob copy on its lost worker (when it is the session's), else its runtime
    copy there; how many objects this pass deleted."""
    label_domain = domain_of(session)
    try:
        if copy is not None and is_ours(copy, label_domain, session.id):
            uid = str((copy.get("metadata") or {}).get("uid") or "")
            with on_cluster(cluster):
                deleted = gateway.delete_namespaced(TRAINJOB, session.namespace, session.name, uid=uid)
            if deleted:
                logger.warning(
                    "deleted TrainJob %s/%s on %s: session %s ended while its worker was lost",
                    session.namespace,
                    session.name,
                    cluster,
                    session.id,
                )
            return 1 if deleted else 0
        left = worker_runtime_copies_delete(
            namespace=session.namespace,
            name=session.name,
            workers=[cluster],
            label_domain=label_domain,
            owner_id=session.id,
            trainjob_uid=session.trainjob_uid,
        )
    except ClusterError as exc:
        logger.info("session leftovers: %s %s/%s: %s", cluster, session.namespace, session.name, exc)
        return 0
    return sum(1 for what in left if what.startswith(TRAINING_RUNTIME))  # deleted now, or going
