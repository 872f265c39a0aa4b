"""Interactive sessions: open (a TrainJob kept alive), watch it start, close it.

spec/interactive-sessions.md, DESIGN.md "Interactive sessions". The session row is the source of truth;
state changes are compare-and-set, so the watcher task and a request waiting on the same session (or a task
delivered twice) never fight. The TrainJob is built like a job's (jobs.plan: a TrainingRuntime
copy and the TrainJob on it), named after the session, labelled with the session's id where a job's objects
carry the job id, so the same adoption and ownership code (jobs.objects) applies and nothing of another
session (or job) is ever touched."""

from __future__ import annotations

import logging
import time
from contextlib import suppress
from datetime import timedelta
from typing import Any, Final

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from cluster import exec as pods
from cluster import gateway
from cluster.errors import ClusterError, Conflict
from cluster.logs import events_for
from cluster.where import on_cluster
from dispatch_site import roles
from dispatch_site.audit import audit_record
from dispatch_site.roles import NamespaceNotGranted
from jobs import enqueue
from jobs.kueue_inputs import kueue_inputs
from jobs.models import SESSION_NAME_HOLDERS, SESSION_OPEN_STATES, Session, SessionState
from jobs.objects import (
    TRAINING_RUNTIME,
    TRAINJOB,
    create_or_adopt,
    create_trainjob_on_copy,
    is_ours,
    own_copy,
    runtime_copy_to_workers,
    worker_runtime_copies_delete,
)
from jobs.plan import start_reasons
from jobs.queueing import QUEUE_NOT_FOUND, queue_plan
from jobs.sessions.errors import SessionCreateFailed, SessionLimitReached, SessionNameTaken, SessionRefused
from jobs.sessions.placement import domain_of, session_chain, session_place, session_pods
from jobs.sessions.rules import (
    CREATION_FAILED_AFTER,
    SessionRequest,
    _timeout,
    allow_list_miss,
    creation_failure,
    decide_start,
    exec_containers,
    failed_grace_over,
    leftover_pods,
    lifetime_over,
    pick_trainer_pod,
    session_objects,
    session_runtime_check,
    session_spec,
    trainer_pod_claims,
    trainer_pod_problem,
)
from jobs.stopping import DELETE, GONE_WAITS, WAIT_TRAINER, StopClock, trainjob_stop_step
from runtimes.models import AllowListEntry, SiteSettings, runtime_ref
from runtimes.reasons import NODE_CONTAINER, RUNTIME_NOT_ALLOWED, Reason, not_allowed_message
from runtimes.selectors import allow_list_entry, get_runtime

logger = logging.getLogger(__name__)


POLL_SECONDS: Final = 0.25


def session_open(*, owner: User, request: SessionRequest) -> Session:
    """Check, record, and create the TrainJob; the watcher task (or a waiting request) takes the session
    from starting to running or failed. NamespaceNotGranted, SessionRefused, SessionNameTaken,
    SessionCreateFailed; ClusterError when the runtime cannot be read (nothing recorded)."""
    if not roles.may_submit_to(owner, request.namespace):
        raise NamespaceNotGranted(
            f"namespace {request.namespace!r} is not granted to {owner.get_username()}: dispatch may not "
            "open sessions there for you"
        )
    ref = request.runtime
    kind, runtime_namespace = ref.kind, ref.namespace or ""
    entry = allow_list_entry(kind, runtime_namespace, ref.name)
    miss = allow_list_miss(entry, list_empty=entry is None and not AllowListEntry.objects.exists())
    ref_text = runtime_ref(kind, runtime_namespace, ref.name)
    try:
        found = get_runtime(kind, runtime_namespace, ref.name)  # never one of dispatch's own copies
    except ClusterError:
        if miss is None:
            raise
        # Not allowed whatever the cluster holds: say so now rather than that the cluster is down.
        reason = Reason(RUNTIME_NOT_ALLOWED, not_allowed_message(ref_text, miss), "metadata.name")
        raise _refused(owner, ref_text, request.namespace, [reason]) from None
    body = found.body if found is not None else None
    review = entry.as_review() if entry is not None and miss is None else None
    reasons, trainer_job = session_runtime_check(body, miss=miss, ref=ref_text, review=review)
    site = SiteSettings.load()
    spec = session_spec(request)
    # Through Kueue as a job goes: its queue_name, else the namespace's default queue, judged by the plan's
    # rules (a queue that does not exist, a request its ClusterQueue can never admit).
    queueing = kueue_inputs(spec=spec, site=site)
    _, queue_reasons, _ = queue_plan(spec=spec, runtime=body, kueue=queueing)
    reasons += queue_reasons
    if queueing.workers and set(queueing.workers_without_credentials) >= set(queueing.workers):
        # MultiKueue places it on a worker: dispatch must be able to put its runtime there and read its pods.
        reasons.append(
            Reason(
                QUEUE_NOT_FOUND,
                f"LocalQueue {queueing.choice.queue} sends its workloads to MultiKueue worker clusters "
                f"({', '.join(queueing.workers)}), for none of which dispatch has credentials "
                "(WORKER_KUBECONFIG_DIR): the session could never run there",
                "queue_name",
            )
        )
    session = Session(
        owner=owner,
        namespace=request.namespace,
        runtime_kind=kind,
        runtime_namespace=runtime_namespace,
        runtime_name=ref.name,
        image=request.image,
        num_nodes=request.num_nodes,
        env=dict(request.env),
        command=list(request.command) if request.command else None,
        timeout_seconds=_timeout(request),
        trainer_replicated_job=trainer_job,
        container=NODE_CONTAINER,
        label_domain=site.label_domain,
        queue=queueing.choice.queue or "",
        workers=list(queueing.workers),
    )
    session.name = request.name or session.id
    if body is not None:
        extra, _ = start_reasons(spec=spec, runtime=body, namespace_granted=True, train_job_name=session.name)
        reasons += extra
    if reasons:
        raise _refused(owner, ref_text, request.namespace, reasons)
    if kind == TRAINING_RUNTIME and runtime_namespace == session.namespace and ref.name == session.name:
        raise SessionNameTaken(
            f"TrainJob name {session.name!r} is the name of the TrainingRuntime it would run on: dispatch "
            "names the TrainJob's runtime copy after the TrainJob, so choose another session name"
        )
    assert body is not None
    session.exec_containers = exec_containers(body, trainer_job, site.label_domain)
    open_ids: list[str] = []
    try:
        with transaction.atomic():
            # One user's opens take turns on their user row, so two at once never both fit under the cap.
            list(User.objects.select_for_update().filter(pk=owner.pk).values_list("pk", flat=True))
            open_ids = list(
                Session.objects.filter(owner=owner, state__in=SESSION_OPEN_STATES)
                .order_by("created_at")
                .values_list("id", flat=True)[: site.max_open_sessions_per_user]
            )
            if len(open_ids) >= site.max_open_sessions_per_user:
                raise SessionLimitReached(_limit_message(owner, open_ids))
            session.save(force_insert=True)
            audit_record(
                actor=owner,
                action="session.open",
                object_type="session",
                object_id=session.id,
                details={"runtime": ref.source, "namespace": session.namespace, "trainjob": session.name},
            )
    except SessionLimitReached:
        audit_record(
            actor=owner,
            action="session.refuse",
            object_type="runtime",
            object_id=ref_text[:200],
            details={"namespace": request.namespace, "codes": ["session-limit"], "open": open_ids},
        )
        raise
    except IntegrityError:
        holder = Session.objects.filter(
            namespace=request.namespace, name=session.name, state__in=SESSION_NAME_HOLDERS
        ).first()
        held = f"session {holder.id} ({holder.state})" if holder else "another session"
        raise SessionNameTaken(
            f"TrainJob name {session.name!r} in namespace {request.namespace!r} is held by {held}; close it "
            "first, or choose another name"
        ) from None

    copy, train_job = session_objects(
        session=session, spec=spec, runtime=body, label_domain=session.label_domain
    )
    # The objects are made under the session row's lock: a close that arrives meanwhile waits for them (then
    # deletes them), and one that came first (the row is no longer starting) means nothing is made at all. So
    # a close racing the open never leaves a TrainJob running `sleep infinity` behind.
    with transaction.atomic():
        locked = (
            Session.objects.select_for_update().filter(pk=session.pk, state=SessionState.STARTING).first()
        )
        if locked is None:
            session.refresh_from_db()
            return session
        failure: ClusterError | None = None
        try:
            made_copy = create_or_adopt(TRAINING_RUNTIME, copy, session.label_domain, session.id)
            # MultiKueue copies only the TrainJob: its runtime must be on the worker it picks (as a job's).
            runtime_copy_to_workers(
                runtime=copy, workers=session.workers, label_domain=session.label_domain, owner_id=session.id
            )
            made_job = create_trainjob_on_copy(train_job, session.label_domain, session.id)
            own_copy(made_copy, made_job)
        except ClusterError as exc:
            failure = exc
        else:
            uid = str((made_job.get("metadata") or {}).get("uid", ""))
            Session.objects.filter(pk=session.pk).update(trainjob_uid=uid)
            session.trainjob_uid = uid
    if failure is not None:
        message = f"could not create the session's objects: {failure.target}: {failure.message}"
        try:
            _delete_objects(session)  # stops the TrainJob first; closing the session deletes it
        except ClusterError as cleanup:
            message += f" (what was created could not be deleted yet: {cleanup}; closing the session does)"
        session_set_state(session, {SessionState.STARTING}, SessionState.FAILED, message=message)
        session.refresh_from_db()
        raise SessionCreateFailed(session, message, transient=failure.transient) from None
    transaction.on_commit(enqueue.on_commit_send(enqueue.SESSION_WATCH, session.pk), robust=True)
    return session


def _limit_message(owner: User, held: list[str]) -> str:
    return (
        f"{owner.get_username()} already holds {len(held)} open sessions, the site's limit "
        f"(max_open_sessions_per_user): close one first ({', '.join(held)})"
    )


def _refused(owner: User, ref_text: str, namespace: str, reasons: list[Reason]) -> SessionRefused:
    audit_record(
        actor=owner,
        action="session.refuse",
        object_type="runtime",
        object_id=ref_text[:200],
        details={"namespace": namespace, "codes": [r.code for r in reasons]},
    )
    return SessionRefused(reasons)


def session_set_state(session: Session, old: set[str] | frozenset[str], new: str, **fields: Any) -> bool:
    """Compare-and-set; False when another worker or request moved the session first."""
    return (
        Session.objects.filter(pk=session.pk, state__in=old).update(
            state=new, updated_at=timezone.now(), **fields
        )
        == 1
    )


def session_observe(*, session_id: str) -> Session | None:
    """One look at a starting session's trainer pod; moves it to running or failed when that is decided.
    A cluster that cannot be read decides nothing (the next look tries again)."""
    session = Session.objects.filter(pk=session_id).first()
    if session is None or session.state != SessionState.STARTING:
        return session
    expired = timezone.now() >= session.created_at + timedelta(seconds=session.timeout_seconds)
    try:
        session_place(session=session)  # MultiKueue: the worker its Workload was admitted to, once named
        claims = trainer_pod_claims(session_pods(session), session.trainer_replicated_job)
    except ClusterError as exc:
        # Nothing is decided on a read that failed, not even after the timeout: the next look (the watcher,
        # a waiting request or the sweep) decides on what the cluster shows.
        logger.warning("session %s: cannot read its pods: %s", session.id, exc)
        return session
    pod = claims[0] if len(claims) == 1 else None
    failure = None
    if not claims and not expired:
        failure = _creation_failure(session)
    decision = decide_start(session, pod, expired=expired, failure=failure, claims=claims)
    if decision.state == SessionState.STARTING:
        return session
    fields: dict[str, Any] = {"pod": decision.pod, "message": decision.message}
    if decision.state == SessionState.RUNNING:
        fields["started_at"] = timezone.now()
        fields["pod_uid"] = decision.pod_uid
    session_set_state(session, {SessionState.STARTING}, decision.state, **fields)
    session.refresh_from_db()
    return session


def _creation_failure(session: Session) -> str | None:
    now = timezone.now()
    if (now - session.created_at).total_seconds() < CREATION_FAILED_AFTER:
        return None  # not worth reading the Events yet
    try:
        events = events_for(session.namespace, session.name)
    except ClusterError as exc:
        logger.warning("session %s: cannot read its events: %s", session.id, exc)
        return None
    return creation_failure(events, session.name, session.created_at, now)


def session_wait(*, session: Session, seconds: float, closing: bool = False) -> Session:
    """Observe until the session leaves starting (or closing, with closing=True), at most `seconds`."""
    waiting = SessionState.CLOSING if closing else SessionState.STARTING
    observe = session_close_observe if closing else session_observe
    deadline = time.monotonic() + max(0.0, seconds)
    while True:
        current = observe(session_id=session.pk) or session
        left = deadline - time.monotonic()
        if current.state != waiting or left <= 0:
            return current
        time.sleep(min(POLL_SECONDS, left))


def session_watch(*, session_id: str, budget_seconds: float, closing: bool = False) -> bool:
    """The watcher task's body: observe for at most budget_seconds; True when there is nothing left to
    watch (the task then ends; otherwise it is enqueued again)."""
    session = Session.objects.filter(pk=session_id).first()
    if session is None:
        return True
    current = session_wait(session=session, seconds=budget_seconds, closing=closing)
    return current.state != (SessionState.CLOSING if closing else SessionState.STARTING)


def session_close(*, actor: User | None, session: Session, reason: str = "") -> Session:
    """Close: delete the TrainJob (and its runtime copy); the session is closed once its pods are gone.
    Idempotent: closing a closing or closed session changes nothing. actor None: dispatch itself (the
    sweep), `reason` saying why."""
    now = timezone.now()
    with transaction.atomic():
        moved = session_set_state(
            session,
            SESSION_NAME_HOLDERS - {SessionState.CLOSING},
            SessionState.CLOSING,
            closing_at=now,
            message=f"closed by {actor.get_username()}"
            if actor is not None
            else f"closed by dispatch: {reason}",
        )
        if moved:
            audit_record(
                actor=actor,
                action="session.close",
                object_type="session",
                object_id=session.id,
                details={"trainjob": f"{session.namespace}/{session.name}", "reason": reason},
            )
            transaction.on_commit(
                enqueue.on_commit_send(enqueue.SESSION_CLOSE_WATCH, session.pk), robust=True
            )
    current = session_close_observe(session_id=session.pk) if moved else None
    if current is None:
        session.refresh_from_db()
        return session
    return current


def _stopped_first(session: Session, trainjob: dict[str, Any], *, force: bool = False) -> bool:
    """Whether the session's TrainJob may be deleted now (jobs.stopping.trainjob_stop_step): the Trainer shows
    it stopped; or a stop the cluster accepted STOP_WAIT_SECONDS ago still shows none and the Trainer is shown
    not running (its leader Lease not renewed: nothing rebuilds the JobSet then). Otherwise it asks for the
    stop, records when the cluster first accepted it, and says not yet; while the Trainer runs and has not
    stopped it, the session's message says so. `force`: the close timed out, delete it as it is."""
    if force:
        return True
    stop = StopClock(rows=Session.objects.filter(pk=session.pk), accepted_at=session.stop_accepted_at)
    step = trainjob_stop_step(
        namespace=session.namespace,
        trainjob=trainjob,
        stop=stop,
        label_domain=domain_of(session),
        cause="closed",
    )
    session.stop_accepted_at = stop.accepted_at
    if step.action == WAIT_TRAINER:
        seen = step.look.seen if step.look else ""
        message = (
            f"closing: TrainJob {session.namespace}/{session.name} is not deleted yet: the Trainer is "
            f"running ({seen.split(' was last renewed')[0]}) and has not stopped it"
        )
        Session.objects.filter(pk=session.pk).exclude(message=message).update(message=message)
    return step.action == DELETE


def _delete_objects(session: Session, *, force: bool = False) -> tuple[bool, bool, bool]:
    """Delete the session's TrainJob once it is stopped (_stopped_first), and its runtime copy once the
    TrainJob is gone (the Trainer's webhook refuses to let go of a TrainJob whose runtime is gone first; the
    garbage collector usually takes the copy with its owner). Only objects dispatch made for this session
    are touched: labelled and annotated for it, and, once the open recorded its TrainJob's UID, that TrainJob
    (deleted with the UID as a precondition) and a copy no other TrainJob owns; somebody's TrainJob made
    again under the name, with the labels and annotations copied, is left alone. `force`: delete the
    TrainJob whether stopped or not (the close timed out). On MultiKueue, once the manager's TrainJob is gone,
    the runtime copies on the workers go too, each once MultiKueue removed that worker's TrainJob
    (jobs.objects.worker_runtime_copies_delete; a worker that cannot be reached keeps its copy). Returns
    whether the TrainJob and the copies (or a worker's TrainJob) were still there, and whether this pass
    deleted anything."""
    label_domain = domain_of(session)
    made = session.trainjob_uid
    trainjob = gateway.get_namespaced(TRAINJOB, session.namespace, session.name)
    meta = (trainjob or {}).get("metadata") or {}
    has_job = trainjob is not None and is_ours(trainjob, label_domain, session.id, trainjob_uid=made)
    deleted = False
    if (
        trainjob is not None
        and has_job
        and not meta.get("deletionTimestamp")
        and _stopped_first(session, trainjob, force=force)
    ):
        with suppress(Conflict):  # another object took the name since the read: not ours
            gateway.delete_namespaced(
                TRAINJOB, session.namespace, session.name, uid=str(meta.get("uid") or "")
            )
            deleted = True
    copy = gateway.get_namespaced(TRAINING_RUNTIME, session.namespace, session.name)
    has_copy = copy is not None and is_ours(copy, label_domain, session.id, trainjob_uid=made)
    if has_copy and not has_job:
        gateway.delete_namespaced(TRAINING_RUNTIME, session.namespace, session.name)
        deleted = True
    if session.workers and not has_job:
        on_workers = worker_runtime_copies_delete(
            namespace=session.namespace,
            name=session.name,
            workers=session.workers,
            label_domain=label_domain,
            owner_id=session.id,
            trainjob_uid=made,
        )
        has_copy = has_copy or bool(on_workers)
        deleted = deleted or any(left.startswith(TRAINING_RUNTIME) for left in on_workers)
    return has_job, has_copy, deleted


def session_close_observe(*, session_id: str) -> Session | None:
    """One step of closing: delete what is still there, then closed once the TrainJob, its copy and its
    pods are gone; after the close timeout, closed with a warning naming the pods that outlived it."""
    session = Session.objects.filter(pk=session_id).first()
    if session is None or session.state != SessionState.CLOSING:
        return session
    label_domain = domain_of(session)
    now = timezone.now()
    timed_out = session.closing_at is not None and now >= session.closing_at + timedelta(
        seconds=settings.SESSION_CLOSE_TIMEOUT_SECONDS
    )
    try:
        # Past the close timeout the TrainJob goes stopped or not (the stop's own fallback is shorter).
        trainjob, copy, deleted = _delete_objects(session, force=timed_out)
        for wait in GONE_WAITS:  # what this pass deleted usually goes at once: look again before leaving
            if not deleted or not (trainjob or copy):
                break
            time.sleep(wait)
            trainjob, copy, deleted = _delete_objects(session, force=timed_out)
    except ClusterError as exc:
        logger.warning("session %s: closing: %s", session.id, exc)
        return session
    unread = ""
    try:
        with on_cluster(session.cluster):  # its MultiKueue worker's pods: there only
            labelled = pods.list_pods(session.namespace, f"{label_domain}/job={session.id}")
        left = leftover_pods(labelled, session_chain(session, labelled)) if labelled else []
    except ClusterError as exc:
        logger.warning("session %s: closing: %s", session.id, exc)
        if not ((timed_out or session.worker_lost_at) and session.cluster):
            return session
        # Its worker is lost: MultiKueue's garbage collector, or dispatch's leftovers sweep
        # (jobs.sessions.lost), removes its TrainJob copy there once it is back. A worker Kueue declared lost
        # is not waited for.
        left, unread = [], f"; its worker {session.cluster} could not be read ({exc.message})"
    now = timezone.now()
    if not trainjob and not copy and not left and not unread:
        session_set_state(session, {SessionState.CLOSING}, SessionState.CLOSED, closed_at=now)
    elif unread and not timed_out and not trainjob and not copy:
        why = unread.split(" could not be read ", 1)[-1]
        warning = (
            f"its worker {session.cluster} was lost (Kueue evicted the session's Workload; at close it could "
            f"not be read: {why.removeprefix('(').removesuffix(')')}): its TrainJob copy and pods there are "
            "removed once it answers again"
        )
        session_set_state(
            session, {SessionState.CLOSING}, SessionState.CLOSED, closed_at=now, warning=warning
        )
    elif timed_out:
        still = ", ".join(p.name for p in left) or "none"
        warning = (
            f"{len(left)} pod(s) of TrainJob {session.namespace}/{session.name} still existed "
            f"{settings.SESSION_CLOSE_TIMEOUT_SECONDS}s after close ({still}); the TrainJob was deleted, "
            f"so the garbage collector removes them{unread}"
        )
        session_set_state(
            session, {SessionState.CLOSING}, SessionState.CLOSED, closed_at=now, warning=warning
        )
    session.refresh_from_db()
    return session


# ---------------------------------------------------------------- the sweep


SWEEP_BATCH = 200  # sessions looked at per state per sweep, the longest-waiting first


def session_check_pod(*, session_id: str) -> Session | None:
    """A running session's trainer pod, by name and UID: still running, or the session fails naming what
    happened (gone, finished, re-created under its name by someone else, replaced by the Job). A read that
    fails decides nothing."""
    session = Session.objects.filter(pk=session_id).first()
    if session is None or session.state != SessionState.RUNNING:
        return session
    try:
        problem = pod_problem(session)
    except ClusterError as exc:
        logger.warning("session %s: cannot read its trainer pod: %s", session.id, exc)
        return session
    if problem is not None:
        session_set_state(session, {SessionState.RUNNING}, SessionState.FAILED, message=problem)
        session.refresh_from_db()
    return session


def pod_problem(session: Session) -> str | None:
    """trainer_pod_problem on what the cluster shows now, where the pod runs (ClusterError when it cannot be
    read)."""
    with on_cluster(session.cluster):
        pod = pods.get_pod(session.namespace, session.pod)
    replacement = None
    if (
        pod is None
        or pod.deleting
        or pod.phase != "Running"
        or (session.pod_uid and pod.uid != session.pod_uid)
    ):
        # More than one pod at the trainer pod's place: none is named a replacement (no guess).
        replacement = pick_trainer_pod(session_pods(session), session.trainer_replicated_job)
    return trainer_pod_problem(session, pod, replacement)


def sessions_sweep(*, now: Any = None) -> dict[str, int]:
    """The beat's look at every session that is waiting on something, in case its watcher's message was
    lost: starting sessions are observed (running, failed, or still starting), closing ones are moved on
    (objects deleted, closed once the pods are gone), running ones past the site's maximum lifetime
    (SESSION_MAX_LIFETIME_SECONDS) are closed, and the others' trainer pods are checked; failed ones are
    closed SESSION_FAILED_GRACE_SECONDS after they failed, or at the maximum lifetime if that comes first
    (a failed session's TrainJob may still hold pods, quota and GPUs: the keep-alive of its other pods).
    Every step is the same compare-and-set the watchers and requests use, so a sweep racing them is
    harmless."""
    now = now or timezone.now()
    counts = {"starting": 0, "closing": 0, "expired": 0, "checked": 0, "failed": 0}
    for session_id in _oldest(SessionState.STARTING):
        session_observe(session_id=session_id)
        counts["starting"] += 1
    for session in Session.objects.filter(state=SessionState.RUNNING).order_by("created_at")[:SWEEP_BATCH]:
        if lifetime_over(session, now, settings.SESSION_MAX_LIFETIME_SECONDS):
            session_close(
                actor=None,
                session=session,
                reason=f"it reached the maximum session lifetime ({settings.SESSION_MAX_LIFETIME_SECONDS}s)",
            )
            counts["expired"] += 1
        else:
            session_check_pod(session_id=session.pk)
            counts["checked"] += 1
    grace = settings.SESSION_FAILED_GRACE_SECONDS
    for session in Session.objects.filter(state=SessionState.FAILED).order_by("updated_at")[:SWEEP_BATCH]:
        if failed_grace_over(session, now, grace):
            reason = f"it failed {grace}s ago ({session.message or 'no message'}); its TrainJob is released"
        elif lifetime_over(session, now, settings.SESSION_MAX_LIFETIME_SECONDS):
            reason = f"it reached the maximum session lifetime ({settings.SESSION_MAX_LIFETIME_SECONDS}s)"
        else:
            continue
        session_close(actor=None, session=session, reason=reason)
        counts["failed"] += 1
    for session_id in _oldest(SessionState.CLOSING):
        session_close_observe(session_id=session_id)
        counts["closing"] += 1
    return counts


def _oldest(state: str) -> list[str]:
    return list(
        Session.objects.filter(state=state).order_by("updated_at").values_list("pk", flat=True)[:SWEEP_BATCH]
    )
