"""Interactive sessions: a TrainJob kept alive, and commands run in its trainer pod through pods/exec.

spec/interactive-sessions.md, DESIGN.md "Interactive sessions". The session row is the source of truth;
state changes are compare-and-set, so the watcher task and a request waiting on the same session (or a task
delivered twice) never fight. Pure functions decide (which runtime can serve a session, which pod is the
trainer pod, what an observed pod means); the services orchestrate.

The TrainJob is built like a job's (jobs.plan: a TrainingRuntime copy and the TrainJob on it), named after
the session, labelled with the session's id where a job's objects carry the job id, so the same adoption
and ownership code applies and nothing of another session (or job) is ever touched.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from cluster import exec as pods
from cluster import gateway
from cluster.errors import ClusterError, NotFound, Rejected
from cluster.logs import EventRow, events_for
from dispatch_site import roles
from dispatch_site.audit import audit_record
from dispatch_site.models import AuditEvent
from jobs.models import SESSION_NAME_HOLDERS, Session, SessionState
from jobs.plan import (
    LAUNCHER,
    build_train_job,
    build_training_runtime,
    start_reasons,
)
from jobs.services import (
    TRAINING_RUNTIME,
    TRAINJOB,
    NamespaceNotGranted,
    create_or_adopt,
    create_trainjob_on_copy,
    is_ours,
    own_copy,
)
from jobs.spec import JobSpec, RuntimeRef
from jobs.status import Thresholds, parse_time
from runtimes.models import AllowListEntry, SiteSettings, runtime_ref
from runtimes.rules import (
    NO_NODE_CONTAINER,
    NO_TRAINER_JOB,
    NODE_CONTAINER,
    RUNTIME_NOT_ALLOWED,
    RUNTIME_NOT_FOUND,
    AllowListMiss,
    Reason,
    SiteRules,
    check_runtime,
    find_trainer_job,
    not_allowed_message,
)
from runtimes.selectors import allow_list_entry, get_runtime

logger = logging.getLogger(__name__)

# What keeps the trainer pod alive when the caller gives no command (the SDK's INTERACTIVE_COMMAND).
KEEP_ALIVE_COMMAND: Final = ("sleep", "infinity")
SHELL: Final = ("sh", "-c")
PURPOSE: Final = "sessions"
# The rules that make a session unusable; the job-only rules (identity, restarts, MPI) do not apply.
SESSION_CODES: Final = frozenset({RUNTIME_NOT_ALLOWED, RUNTIME_NOT_FOUND, NO_TRAINER_JOB, NO_NODE_CONTAINER})
WAIT_MAX_SECONDS: Final = 300
AUDIT_OBJECT: Final = "session"
EXEC_ACTION: Final = "session.exec"
POLL_SECONDS: Final = 0.25
PHASE_RUNNING: Final = "Running"
FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})


# ---------------------------------------------------------------- errors the API turns into answers


class SessionRefused(Exception):
    """422: the runtime cannot serve a session; every reason."""

    def __init__(self, reasons: Sequence[Reason]) -> None:
        self.reasons = tuple(reasons)
        super().__init__("refused: " + ", ".join(r.code for r in self.reasons))


class SessionNameTaken(Exception):
    """409: another session that is not closed holds the TrainJob name in the namespace."""


class SessionCreateFailed(Exception):
    """The cluster refused the objects (422) or could not be reached (503); the session is failed."""

    def __init__(self, session: Session, message: str, *, transient: bool) -> None:
        self.session = session
        self.transient = transient
        super().__init__(message)


class NotSessionOwner(Exception):
    """403: only the owner runs commands in a session."""


class SessionNotRunning(Exception):
    """409: the session is not running (its state says why); or its trainer pod is gone."""

    def __init__(self, session: Session, message: str) -> None:
        self.session = session
        super().__init__(message)


class ExecRefused(Exception):
    """400: the API server refused the exec for the request's own reason (e.g. no such container)."""


class ExecTimedOut(Exception):
    """504: the command was still running when its timeout ended."""

    def __init__(self, message: str, result: ExecResult) -> None:
        self.result = result
        super().__init__(message)


# ---------------------------------------------------------------- pure decisions


def allow_list_miss(entry: AllowListEntry | None, *, list_empty: bool) -> AllowListMiss | None:
    """None when the entry allows sessions, else why not (for the runtime-not-allowed message)."""
    if entry is not None and entry.for_sessions:
        return None
    listed_for = tuple(entry.purposes) if entry is not None else ()
    return AllowListMiss(purpose=PURPOSE, list_empty=list_empty and entry is None, listed_for=listed_for)


def _pod_spec(job: Mapping[str, Any]) -> Mapping[str, Any]:
    template = job.get("template")
    spec = template.get("spec") if isinstance(template, Mapping) else None
    pod = spec.get("template") if isinstance(spec, Mapping) else None
    pod_spec = pod.get("spec") if isinstance(pod, Mapping) else None
    return pod_spec if isinstance(pod_spec, Mapping) else {}


def _launcher(runtime: Mapping[str, Any]) -> tuple[int, Mapping[str, Any]] | None:
    spec = runtime.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None
    jobset = template.get("spec") if isinstance(template, Mapping) else None
    jobs = jobset.get("replicatedJobs") if isinstance(jobset, Mapping) else None
    for index, job in enumerate(jobs if isinstance(jobs, list) else []):
        if isinstance(job, Mapping) and job.get("name") == LAUNCHER:
            return index, job
    return None


def session_runtime_check(
    runtime: Mapping[str, Any] | None, *, miss: AllowListMiss | None, ref: str
) -> tuple[list[Reason], str]:
    """Whether a runtime can serve a session: (every reason it cannot, the replicated job whose pod is the
    trainer pod). The rule checker judges; only the rules that make a session unusable count here. The
    trainer pod's job is the one labelled as the trainer ancestor, else (no job has the label) the MPI
    launcher; its pod needs the container `node`, where commands run. Pure."""
    verdict = check_runtime(runtime, allow_listed=miss if miss is not None else True, ref=ref)
    reasons = [r for r in verdict.reasons if r.code in SESSION_CODES]
    if runtime is None:
        return reasons, ""
    found = find_trainer_job(runtime)
    if found is not None:
        return reasons, str(found[1].get("name", ""))
    launcher = _launcher(runtime)
    if launcher is None:
        return reasons, ""
    # No job carries the trainer label: the launcher serves, so no-trainer-job does not refuse.
    reasons = [r for r in reasons if r.code != NO_TRAINER_JOB]
    index, job = launcher
    containers = _pod_spec(job).get("containers")
    names = (
        [c.get("name") for c in containers if isinstance(c, Mapping)] if isinstance(containers, list) else []
    )
    if NODE_CONTAINER not in names:
        path = f"spec.template.spec.replicatedJobs[{index}].template.spec.template.spec.containers"
        found_names = ", ".join(repr(n) for n in names) or "none"
        reasons.append(
            Reason(
                NO_NODE_CONTAINER,
                f'{path} has no container named "node" (found {found_names}); no replicated job carries the '
                f"trainer label, so the launcher's pod is the trainer pod, and commands run in its container "
                '"node"',
                path,
            )
        )
    return reasons, LAUNCHER


def pick_trainer_pod(pod_list: Sequence[pods.PodInfo], replicated_job: str) -> pods.PodInfo | None:
    """The trainer pod: the first pod (job index, then completion index) of the trainer's replicated job
    that is not being deleted. Never a pod of another replicated job: an MPI launcher's pod appears only
    after the node pods are ready, and until then there is no trainer pod. Pure."""
    mine = [p for p in pod_list if p.replicated_job == replicated_job and not p.deleting]
    return min(mine, key=lambda p: (p.job_index, p.completion_index, p.name), default=None)


@dataclass(frozen=True)
class StartDecision:
    state: str  # starting (keep waiting), running or failed
    pod: str = ""
    message: str = ""


def _delete_hint(session: Session) -> str:
    return (
        f"TrainJob {session.namespace}/{session.name} was created and still exists: delete it by closing the "
        f"session (DELETE /api/v1/sessions/{session.id}, or Close on its page)"
    )


# A creation failure still reported this long after the session's TrainJob was created is not the Trainer's
# cache lag on the new runtime copy (milliseconds): the session fails at once instead of waiting out its
# timeout. One threshold with the supervisor's (jobs.status).
CREATION_FAILED_AFTER: Final = Thresholds().resources_failed_after


def creation_failure(
    events: Sequence[EventRow], trainjob: str, created_at: datetime, now: datetime
) -> str | None:
    """Why the session's objects cannot be made, from the namespace's Events: the Trainer cannot build the
    JobSet (TrainJobResourcesCreationFailed on the TrainJob), or a Job cannot create its pods (FailedCreate,
    e.g. an admission rule or a LimitRange; an exceeded quota is waited for, it may free up). Only a failure
    reported CREATION_FAILED_AFTER seconds after the TrainJob was created, and only once that long has
    passed, counts. Pure."""
    if (now - created_at).total_seconds() < CREATION_FAILED_AFTER:
        return None
    late = created_at + timedelta(seconds=CREATION_FAILED_AFTER / 3)
    for event in events:  # newest first
        at = parse_time(event.at)
        if at is None or at < late:
            continue
        kind, _, name = event.object.partition(" ")
        if kind == "TrainJob" and name == trainjob and event.reason == "TrainJobResourcesCreationFailed":
            return f"the Trainer cannot build the TrainJob's JobSet: {event.message}"
        if (
            kind == "Job"
            and name.startswith(f"{trainjob}-")
            and event.reason == "FailedCreate"
            and "exceeded quota" not in event.message
        ):
            return f"Job {name} cannot create its pods: {event.message}"
    return None


def decide_start(
    session: Session, pod: pods.PodInfo | None, *, expired: bool, failure: str | None = None
) -> StartDecision:
    """What the observed trainer pod (or, without one, a creation failure) means for a starting session.
    Pure (reads the row, writes nothing)."""
    if pod is not None and pod.phase == PHASE_RUNNING:
        return StartDecision(SessionState.RUNNING, pod.name, f"trainer pod {pod.name} is running")
    if pod is not None and pod.phase in FINISHED_PHASES:
        return StartDecision(
            SessionState.FAILED,
            pod.name,
            f"trainer pod {pod.name} has already {pod.phase.lower()}: the TrainJob's command ended, so no "
            f"command can run in it (a session's command must keep the pod running, like the default "
            f"{shlex.join(KEEP_ALIVE_COMMAND)}); {_delete_hint(session)}",
        )
    if pod is None and failure:
        return StartDecision(SessionState.FAILED, "", f"{failure}; {_delete_hint(session)}")
    if not expired:
        return StartDecision(SessionState.STARTING)
    seen = (
        f"trainer pod {pod.name} is {pod.phase}"
        if pod is not None
        else f"no pod of replicated job {session.trainer_replicated_job!r} exists yet"
    )
    return StartDecision(
        SessionState.FAILED,
        pod.name if pod is not None else "",
        f"the trainer pod was not running within {session.timeout_seconds}s ({seen}); "
        + _delete_hint(session),
    )


def command_argv(command: str | Sequence[str]) -> list[str]:
    """A string runs with `sh -c`; a list runs as it is (like kubectl exec). Pure."""
    if isinstance(command, str):
        return [*SHELL, command]
    return list(command)


# ---------------------------------------------------------------- open


@dataclass(frozen=True)
class SessionRequest:
    runtime: RuntimeRef
    namespace: str
    image: str
    num_nodes: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] | None = None
    timeout_seconds: int | None = None
    name: str | None = None


def session_spec(request: SessionRequest) -> JobSpec:
    """The request as the JobSpec the plan's builders take: the keep-alive command unless one is given."""
    return JobSpec(
        runtime=request.runtime,
        namespace=request.namespace,
        image=request.image,
        command=request.command if request.command else KEEP_ALIVE_COMMAND,
        env=tuple(request.env.items()),
        num_nodes=request.num_nodes,
    )


def session_objects(
    *, session: Session, spec: JobSpec, runtime: Mapping[str, Any], label_domain: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The TrainingRuntime copy and the TrainJob, built as a job's (attempt 1 of "job" <session id>), then
    named after the session and marked as a session's. Pure."""
    training_runtime = build_training_runtime(
        spec=spec, runtime=runtime, rules=SiteRules(), job_id=session.id, attempt=1, label_domain=label_domain
    )
    train_job, _ = build_train_job(spec=spec, job_id=session.id, attempt=1, label_domain=label_domain)
    marks = {f"{label_domain}/session": session.id}
    for obj in (training_runtime, train_job):
        obj["metadata"]["name"] = session.name
        obj["metadata"]["labels"].update(marks)
    train_job["spec"]["runtimeRef"]["name"] = session.name
    return training_runtime, train_job


def _timeout(request: SessionRequest) -> int:
    return int(request.timeout_seconds or settings.SESSION_OPEN_TIMEOUT_SECONDS)


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
    reasons, trainer_job = session_runtime_check(body, miss=miss, ref=ref_text)
    site = SiteSettings.load()
    spec = session_spec(request)
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
    try:
        with transaction.atomic():
            session.save(force_insert=True)
            audit_record(
                actor=owner,
                action="session.open",
                object_type="session",
                object_id=session.id,
                details={"runtime": ref.source, "namespace": session.namespace, "trainjob": session.name},
            )
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
        session=session, spec=spec, runtime=body, label_domain=site.label_domain
    )
    try:
        made_copy = create_or_adopt(TRAINING_RUNTIME, copy, site.label_domain, session.id)
        made_job = create_trainjob_on_copy(train_job, site.label_domain, session.id)
        own_copy(made_copy, made_job)
    except ClusterError as exc:
        message = f"could not create the session's objects: {exc.target}: {exc.message}"
        try:
            _delete_objects(session, site.label_domain)
        except ClusterError as cleanup:
            message += f" (what was created could not be deleted yet: {cleanup}; closing the session does)"
        _set_state(session, {SessionState.STARTING}, SessionState.FAILED, message=message)
        session.refresh_from_db()
        raise SessionCreateFailed(session, message, transient=exc.transient) from None
    transaction.on_commit(lambda: _enqueue("session_watch", session.pk), robust=True)
    return session


def _refused(owner: User, ref_text: str, namespace: str, reasons: list[Reason]) -> SessionRefused:
    audit_record(
        actor=owner,
        action="session.refuse",
        object_type="runtime",
        object_id=ref_text[:200],
        details={"namespace": namespace, "codes": [r.code for r in reasons]},
    )
    return SessionRefused(reasons)


def _enqueue(task: str, session_id: str) -> None:
    from jobs import tasks

    getattr(tasks, task).delay(session_id)


def _set_state(session: Session, old: set[str] | frozenset[str], new: str, **fields: Any) -> bool:
    """Compare-and-set; False when another worker or request moved the session first."""
    return (
        Session.objects.filter(pk=session.pk, state__in=old).update(
            state=new, updated_at=timezone.now(), **fields
        )
        == 1
    )


# ---------------------------------------------------------------- starting -> running / failed


def _pods_of(session: Session, label_domain: str) -> list[pods.PodInfo]:
    selector = f"{pods.JOBSET_NAME_LABEL}={session.name},{label_domain}/job={session.id}"
    return pods.list_pods(session.namespace, selector)


def session_observe(*, session_id: str) -> Session | None:
    """One look at a starting session's trainer pod; moves it to running or failed when that is decided.
    A cluster that cannot be read decides nothing (the next look tries again)."""
    session = Session.objects.filter(pk=session_id).first()
    if session is None or session.state != SessionState.STARTING:
        return session
    expired = timezone.now() >= session.created_at + timedelta(seconds=session.timeout_seconds)
    try:
        pod = pick_trainer_pod(
            _pods_of(session, SiteSettings.load().label_domain), session.trainer_replicated_job
        )
    except ClusterError as exc:
        logger.warning("session %s: cannot read its pods: %s", session.id, exc)
        if not expired:
            return session
        pod = None
    failure = None
    if pod is None and not expired:
        failure = _creation_failure(session)
    decision = decide_start(session, pod, expired=expired, failure=failure)
    if decision.state == SessionState.STARTING:
        return session
    fields: dict[str, Any] = {"pod": decision.pod, "message": decision.message}
    if decision.state == SessionState.RUNNING:
        fields["started_at"] = timezone.now()
    _set_state(session, {SessionState.STARTING}, decision.state, **fields)
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


# ---------------------------------------------------------------- exec


@dataclass(frozen=True)
class ExecResult:
    stdout: str
    stderr: str
    returncode: int | None
    truncated: bool
    pod: str
    container: str


def _pod_gone(session: Session, detail: str) -> SessionNotRunning:
    message = (
        f"trainer pod {session.pod} {detail}: the session cannot run commands; close it and open a new one"
    )
    _set_state(session, {SessionState.RUNNING}, SessionState.FAILED, message=message)
    session.refresh_from_db()
    return SessionNotRunning(session, message)


def session_exec(
    *,
    actor: User,
    session: Session,
    command: str | Sequence[str],
    container: str | None = None,
    timeout_seconds: float | None = None,
) -> ExecResult:
    """Run one command in the session's trainer pod and record it (history and audit log).
    NotSessionOwner, SessionNotRunning, ExecRefused, ExecTimedOut; ClusterError when unreachable."""
    if session.owner_id != actor.pk:
        raise NotSessionOwner(
            f"only {session.owner.get_username()}, who opened session {session.id}, runs commands in it"
        )
    if session.state != SessionState.RUNNING:
        reason = f": {session.message}" if session.message else ""
        raise SessionNotRunning(session, f"session {session.id} is {session.state}{reason}")
    container = container or session.container
    timeout = float(timeout_seconds or settings.SESSION_EXEC_TIMEOUT_SECONDS)
    started = time.monotonic()
    output: pods.ExecOutput | None = None
    error = ""
    try:
        output = pods.exec_in_pod(
            session.namespace,
            session.pod,
            container,
            command_argv(command),
            timeout=timeout,
            max_bytes=settings.SESSION_EXEC_MAX_OUTPUT_BYTES,
        )
    except pods.ExecTimeout as exc:
        output, error = exc.output, exc.message
    except NotFound as exc:
        error = exc.message
    except Rejected as exc:
        error = exc.message
    except ClusterError as exc:
        error = exc.message
        _record_exec(actor, session, command, container, None, error, started)
        raise
    _record_exec(actor, session, command, container, output, error, started)
    if output is None:
        pod = None
        try:
            pod = pods.get_pod(session.namespace, session.pod)
        except ClusterError:
            pod = None
        if pod is None or pod.deleting:
            raise _pod_gone(session, "is gone")
        if pod.phase != PHASE_RUNNING:
            raise _pod_gone(session, f"is {pod.phase}")
        raise ExecRefused(error)
    result = ExecResult(
        stdout=output.stdout,
        stderr=output.stderr,
        returncode=output.returncode,
        truncated=output.truncated,
        pod=session.pod,
        container=container,
    )
    if error:
        raise ExecTimedOut(f"{error}; the output so far is in the answer", result)
    return result


def _record_exec(
    actor: User,
    session: Session,
    command: str | Sequence[str],
    container: str,
    output: pods.ExecOutput | None,
    error: str,
    started: float,
) -> None:
    shown = command if isinstance(command, str) else list(command)
    returncode = output.returncode if output is not None else None
    bytes_out = output.bytes_out if output is not None else 0
    duration_ms = int((time.monotonic() - started) * 1000)
    # The audit log is the session's command history too (one row per command, one write).
    audit_record(
        actor=actor,
        action=EXEC_ACTION,
        object_type=AUDIT_OBJECT,
        object_id=session.id,
        details={
            "pod": session.pod,
            "container": container,
            "command": shown,
            "returncode": returncode,
            "bytes_out": bytes_out,
            "truncated": output.truncated if output is not None else False,
            "duration_ms": duration_ms,
            "error": error,
        },
    )


# ---------------------------------------------------------------- close


def may_close(user: Any, session: Session) -> bool:
    return bool(session.owner_id == user.pk or roles.is_platform(user) or roles.is_oncall(user))


def session_close(*, actor: User, session: Session) -> Session:
    """Close: delete the TrainJob (and its runtime copy); the session is closed once its pods are gone.
    Idempotent: closing a closing or closed session changes nothing."""
    now = timezone.now()
    with transaction.atomic():
        moved = _set_state(
            session,
            SESSION_NAME_HOLDERS - {SessionState.CLOSING},
            SessionState.CLOSING,
            closing_at=now,
            message=f"closed by {actor.get_username()}",
        )
        if moved:
            audit_record(
                actor=actor,
                action="session.close",
                object_type="session",
                object_id=session.id,
                details={"trainjob": f"{session.namespace}/{session.name}"},
            )
            transaction.on_commit(lambda: _enqueue("session_close_watch", session.pk), robust=True)
    current = session_close_observe(session_id=session.pk) if moved else None
    if current is None:
        session.refresh_from_db()
        return session
    return current


def _delete_objects(session: Session, label_domain: str) -> tuple[bool, bool]:
    """Delete the session's TrainJob, and its runtime copy once the TrainJob is gone (the Trainer's webhook
    refuses to let go of a TrainJob whose runtime is gone first; the garbage collector usually takes the
    copy with its owner). Only objects labelled with this session's id are touched. Returns whether the
    TrainJob and the copy were still there."""
    trainjob = gateway.get_namespaced(TRAINJOB, session.namespace, session.name)
    has_job = trainjob is not None and is_ours(trainjob, label_domain, session.id)
    if has_job and trainjob is not None and not (trainjob.get("metadata") or {}).get("deletionTimestamp"):
        gateway.delete_namespaced(TRAINJOB, session.namespace, session.name)
    copy = gateway.get_namespaced(TRAINING_RUNTIME, session.namespace, session.name)
    has_copy = copy is not None and is_ours(copy, label_domain, session.id)
    if has_copy and not has_job:
        gateway.delete_namespaced(TRAINING_RUNTIME, session.namespace, session.name)
    return has_job, has_copy


def session_close_observe(*, session_id: str) -> Session | None:
    """One step of closing: delete what is still there, then closed once the TrainJob, its copy and its
    pods are gone; after the close timeout, closed with a warning naming the pods that outlived it."""
    session = Session.objects.filter(pk=session_id).first()
    if session is None or session.state != SessionState.CLOSING:
        return session
    label_domain = SiteSettings.load().label_domain
    try:
        trainjob, copy = _delete_objects(session, label_domain)
        left = pods.list_pods(session.namespace, f"{label_domain}/job={session.id}")
    except ClusterError as exc:
        logger.warning("session %s: closing: %s", session.id, exc)
        return session
    now = timezone.now()
    if not trainjob and not copy and not left:
        _set_state(session, {SessionState.CLOSING}, SessionState.CLOSED, closed_at=now)
    elif session.closing_at and now >= session.closing_at + timedelta(
        seconds=settings.SESSION_CLOSE_TIMEOUT_SECONDS
    ):
        still = ", ".join(p.name for p in left) or "none"
        warning = (
            f"{len(left)} pod(s) of TrainJob {session.namespace}/{session.name} still existed "
            f"{settings.SESSION_CLOSE_TIMEOUT_SECONDS}s after close ({still}); the TrainJob was deleted, "
            "so the garbage collector removes them"
        )
        _set_state(session, {SessionState.CLOSING}, SessionState.CLOSED, closed_at=now, warning=warning)
    session.refresh_from_db()
    return session


# ---------------------------------------------------------------- reads


def sessions_visible_to(user: Any) -> QuerySet[Session]:
    """Platform and on-call read every session; everybody else reads their own."""
    queryset = Session.objects.select_related("owner")
    if roles.can_read_all_jobs(user):
        return queryset
    return queryset.filter(owner_id=user.pk)


def session_for(user: Any, session_id: str) -> Session | None:
    return sessions_visible_to(user).filter(pk=session_id).first()


def session_for_exec(user: Any, session_id: str) -> Session | None:
    """The session a user asks to run a command in, read with one query on the owner's path (the hot one):
    the owner, or someone who may read every session (and then is refused as not the owner); None when
    the user may not see it. The owner is not joined in: on the owner's path it is the user already."""
    session = Session.objects.filter(pk=session_id).first()
    if session is not None and session.owner_id == user.pk:
        session.owner = user
        return session
    if session is None or roles.can_read_all_jobs(user):
        return session
    return None


def session_history(session: Session) -> QuerySet[AuditEvent]:
    """The commands run in a session, newest first: the audit log's exec rows for it."""
    return AuditEvent.objects.filter(object_type=AUDIT_OBJECT, object_id=session.id, action=EXEC_ACTION)
