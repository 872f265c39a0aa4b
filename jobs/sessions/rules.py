"""Pure decisions for sessions: which runtime can serve one, which pod is the trainer pod, what an observed
pod means, how a command is run, and the objects a session is made of."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from django.conf import settings

from cluster import exec as pods
from cluster.logs import EventRow
from jobs.evidence import reporter_accepted
from jobs.models import Session, SessionState
from jobs.plan import LAUNCHER, build_train_job, build_training_runtime
from jobs.spec import JobSpec, RuntimeRef
from jobs.waits import Thresholds, parse_time
from runtimes.models import AllowListEntry
from runtimes.reasons import (
    NO_NODE_CONTAINER,
    NO_TRAINER_JOB,
    NODE_CONTAINER,
    RUNTIME_CHANGED_SINCE_REVIEW,
    RUNTIME_NOT_ALLOWED,
    RUNTIME_NOT_FOUND,
    TRAINER_ANCESTOR_LABEL,
    TRAINER_ANCESTOR_STEP,
    AllowListMiss,
    Reason,
    Review,
    SiteRules,
)
from runtimes.rules import check_runtime, find_trainer_job

# What keeps the trainer pod alive when the caller gives no command (the SDK's INTERACTIVE_COMMAND). It goes
# in as command ["sleep"] and args ["infinity"]: a TrainJob's command leaves the runtime container's args in
# place, and `sleep infinity /home/mpiuser/pi` (an MPI launcher's args) exits 1 at once.
KEEP_ALIVE_COMMAND: Final = ("sleep", "infinity")
# The pod-template label that marks the pods of a session's other replicated jobs (an MPI runtime's nodes,
# whose daemons the session's commands reach): `<label domain>/session-role: peer`. The local plane's KWOK
# keeps them running as their daemons would (scripts/k8s/kwok-stages.yaml).
SESSION_ROLE_LABEL: Final = "session-role"
SESSION_PEER: Final = "peer"


SHELL: Final = ("sh", "-c")


PURPOSE: Final = "sessions"


# The rules that make a session unusable; the job-only rules (identity, restarts, MPI) do not apply.
SESSION_CODES: Final = frozenset(
    {RUNTIME_NOT_ALLOWED, RUNTIME_CHANGED_SINCE_REVIEW, RUNTIME_NOT_FOUND, NO_TRAINER_JOB, NO_NODE_CONTAINER}
)


WAIT_MAX_SECONDS: Final = 300


AUDIT_OBJECT: Final = "session"


EXEC_ACTION: Final = "session.exec"


PHASE_RUNNING: Final = "Running"


FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})


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
    runtime: Mapping[str, Any] | None, *, miss: AllowListMiss | None, ref: str, review: Review | None = None
) -> tuple[list[Reason], str]:
    """Whether a runtime can serve a session: (every reason it cannot, the replicated job whose pod is the
    trainer pod). The rule checker judges; only the rules that make a session unusable count here. The
    trainer pod's job is the one labelled as the trainer ancestor, else (no job has the label) the MPI
    launcher; its pod needs the container `node`, where commands run. `review`: what the allow-list entry
    recorded, as for jobs: a runtime whose spec is no longer the reviewed one serves no session either
    (runtime-changed-since-review). Pure."""
    verdict = check_runtime(runtime, allow_listed=miss if miss is not None else True, ref=ref, review=review)
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


# The runtime annotation (under the site's label domain) naming further containers of the trainer pod that
# commands may run in, comma-separated; the platform reviews it with the runtime when it allow-lists it.
EXEC_CONTAINERS_ANNOTATION: Final = "exec-containers"


def _replicated_job(runtime: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    spec = runtime.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None
    jobset = template.get("spec") if isinstance(template, Mapping) else None
    jobs = jobset.get("replicatedJobs") if isinstance(jobset, Mapping) else None
    for job in jobs if isinstance(jobs, list) else []:
        if isinstance(job, Mapping) and job.get("name") == name:
            return job
    return {}


def exec_containers(runtime: Mapping[str, Any], trainer_job: str, label_domain: str) -> list[str]:
    """The containers of the trainer pod commands may run in: `node`, and those the runtime's
    `<label domain>/exec-containers` annotation names that the trainer pod has. Pure."""
    metadata = runtime.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    raw = (annotations or {}).get(f"{label_domain}/{EXEC_CONTAINERS_ANNOTATION}", "")
    containers = _pod_spec(_replicated_job(runtime, trainer_job)).get("containers")
    present = (
        {c.get("name") for c in containers if isinstance(c, Mapping)}
        if isinstance(containers, list)
        else set()
    )
    named = [n.strip() for n in str(raw).split(",") if n.strip()]
    return [NODE_CONTAINER, *dict.fromkeys(n for n in named if n in present and n != NODE_CONTAINER)]


def container_problem(session: Session, container: str) -> str | None:
    """Why a command may not run in this container of the session's trainer pod, else None. Pure."""
    allowed = list(session.exec_containers or [session.container])
    if container in allowed:
        return None
    names = ", ".join(allowed)
    return (
        f"container {container!r} is not one commands may run in: the trainer container and the containers "
        f"its runtime marks exec-able ({names}); a runtime marks one with the annotation "
        f"<label domain>/{EXEC_CONTAINERS_ANNOTATION}"
    )


def failed_grace_over(session: Session, now: datetime, grace_seconds: int) -> bool:
    """Has a failed session been failed for `grace_seconds` (its last state change was the failure)? Pure."""
    failed_for = timedelta(seconds=grace_seconds)
    return session.state == SessionState.FAILED and now >= session.updated_at + failed_for


def lifetime_over(session: Session, now: datetime, max_seconds: int) -> bool:
    """Has the session reached the site's maximum session lifetime (counted from its open)? Pure."""
    return now >= session.created_at + timedelta(seconds=max_seconds)


def trainer_pod_problem(
    session: Session, pod: pods.PodInfo | None, replacement: pods.PodInfo | None
) -> str | None:
    """Whether the session's recorded trainer pod (by name and UID) can run commands, else why not: gone,
    finished, being deleted, re-created under the same name by someone else, or replaced by the Job (then the
    replacement is named: dispatch does not move a session to another pod, since what ran in the old one is
    gone). Pure."""
    close = "close the session and open a new one"
    if pod is not None and session.pod_uid and pod.uid != session.pod_uid:
        return (
            f"trainer pod {session.pod} was re-created under the same name (uid {pod.uid}, the session's was "
            f"{session.pod_uid}): dispatch runs commands only in the pod the session started on; {close}"
        )
    if pod is not None and not pod.deleting and pod.phase == PHASE_RUNNING:
        return None
    if replacement is not None and replacement.name != session.pod:
        return (
            f"trainer pod {session.pod} was replaced by {replacement.name} ({replacement.phase}): what ran "
            f"in {session.pod} is gone, and dispatch does not move a session to another pod; {close}"
        )
    if pod is None or pod.deleting:
        return f"trainer pod {session.pod} is gone: the session cannot run commands; {close}"
    return f"trainer pod {session.pod} is {pod.phase}: the session cannot run commands; {close}"


def trainer_pod_claims(pod_list: Sequence[pods.PodInfo], replicated_job: str) -> list[pods.PodInfo]:
    """The pods at the trainer pod's place: of the trainer's replicated job, not being deleted, at the first
    place (job index, then completion index) any such pod holds, by name. The Job controller makes one pod per
    place; a second one in the owner chain was made by somebody who may create pods in the namespace and
    copied the labels and the ownerReference (the admission guard refuses that at the door). Never a pod of
    another replicated job: an MPI launcher's pod appears only after the node pods are ready, and until then
    there is no trainer pod. A negative index is no place a Job gives. Pure."""
    mine = [
        p
        for p in pod_list
        if p.replicated_job == replicated_job
        and not p.deleting
        and p.job_index >= 0
        and p.completion_index >= 0
    ]
    first = min(((p.job_index, p.completion_index) for p in mine), default=None)
    return sorted((p for p in mine if (p.job_index, p.completion_index) == first), key=lambda p: p.name)


def pick_trainer_pod(pod_list: Sequence[pods.PodInfo], replicated_job: str) -> pods.PodInfo | None:
    """The trainer pod: the one pod at the trainer pod's place (trainer_pod_claims). None when there is none,
    and when more than one claims it: dispatch does not guess which one runs the owner's commands. Pure."""
    claims = trainer_pod_claims(pod_list, replicated_job)
    return claims[0] if len(claims) == 1 else None


def claims_problem(claims: Sequence[pods.PodInfo], session: Session) -> str | None:
    """Why no pod is the session's trainer pod when more than one claims its place, else None. Pure."""
    if len(claims) < 2:
        return None
    first = claims[0]
    names = ", ".join(f"{p.name} (uid {p.uid})" for p in claims)
    return (
        f"{len(claims)} pods claim the trainer pod's place (replicated job {first.replicated_job!r}, job "
        f"index {first.job_index}, completion index {first.completion_index}) in the owner chain of TrainJob "
        f"{session.namespace}/{session.name}: {names}. The Job controller makes one pod per place; the "
        f"others were made by someone who may create pods in namespace {session.namespace}, and dispatch "
        "does not guess which one would run your commands"
    )


def _owners(obj: Mapping[str, Any], kind: str, name: str) -> frozenset[str]:
    """The UIDs of the owners of this kind and name the object names."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return frozenset(
        str(r.get("uid")) for r in refs if r.get("kind") == kind and r.get("name") == name and r.get("uid")
    )


@dataclass(frozen=True)
class Chain:
    """The session's owner chain as the cluster shows it now: TrainJob (the UID the open recorded) -> JobSet
    -> Job -> pod. `jobsets` and `jobs` map each listed object's UID to the UIDs of its owners under the
    session's name (a TrainJob's JobSet, and that JobSet's Jobs, all carry the TrainJob's name)."""

    trainjob_uid: str
    jobsets: Mapping[str, frozenset[str]]
    jobs: Mapping[str, frozenset[str]]

    @classmethod
    def of(
        cls,
        *,
        name: str,
        trainjob_uid: str,
        jobsets: Sequence[Mapping[str, Any]],
        jobs: Sequence[Mapping[str, Any]],
    ) -> Chain:
        def uid(obj: Mapping[str, Any]) -> str:
            return str((obj.get("metadata") or {}).get("uid") or "")

        return cls(
            trainjob_uid=trainjob_uid,
            jobsets={uid(s): _owners(s, "TrainJob", name) for s in jobsets},
            jobs={uid(j): _owners(j, "JobSet", name) for j in jobs},
        )


@dataclass(frozen=True)
class Placement:
    """Where MultiKueue placed the session's TrainJob, as the manager's Workloads it controls show it:
    `cluster`, the worker of their status.clusterName ("" while none is named: not admitted yet, or
    evicted), and `workloads`, their names (the worker's copy of the TrainJob names one:
    jobs.objects.is_worker_copy)."""

    cluster: str
    workloads: tuple[str, ...]


def placement_of(workloads: Sequence[Mapping[str, Any]], trainjob_uid: str) -> Placement:
    """The Placement read from `workloads`: only those whose controller is the TrainJob of `trainjob_uid`
    (the session's on the manager) count. Pure."""
    names: list[str] = []
    cluster = ""
    for wl in workloads:
        meta = wl.get("metadata") or {}
        refs = meta.get("ownerReferences") or ()
        if not any(r.get("controller") and r.get("uid") == trainjob_uid for r in refs if trainjob_uid):
            continue
        names.append(str(meta.get("name") or ""))
        admitted = (wl.get("status") or {}).get("clusterName")
        if isinstance(admitted, str) and admitted:
            cluster = admitted
    return Placement(cluster=cluster, workloads=tuple(n for n in names if n))


def chained_pods(pod_list: Sequence[pods.PodInfo], chain: Chain) -> list[pods.PodInfo]:
    """The pods of the session's TrainJob: each one's controller is a Job owned by a JobSet owned by the
    TrainJob the open recorded, every link present. Anyone who can create a pod in the namespace can copy the
    session's labels; commands never run in such a pod. No pod at all while no TrainJob UID is known. Pure."""
    if not chain.trainjob_uid:
        return []
    jobsets = {u for u, owners in chain.jobsets.items() if chain.trainjob_uid in owners}
    jobs = {u for u, owners in chain.jobs.items() if owners & jobsets}
    return [p for p in pod_list if p.owner_kind == "Job" and p.owner_uid in jobs]


def leftover_pods(pod_list: Sequence[pods.PodInfo], chain: Chain) -> list[pods.PodInfo]:
    """While closing, the labelled pods that are the session's or on their way out with its objects: the pod's
    controller is a Job, and every link of its chain that still exists leads to the recorded TrainJob. A link
    to an object already gone is one the garbage collector is taking down (it deletes a dependent whose
    owners are all gone), so such a pod is waited for. A pod with no controlling Job, or whose Job or JobSet
    is somebody else's, is not the session's and never holds the close open. A Job or JobSet missing from
    the chain is taken as gone: the caller reads by name the Job of every pod it did not list. Pure."""

    def jobset_leads_here(uid: str) -> bool:
        owners = chain.jobsets.get(uid)
        # A session opened before dispatch recorded TrainJob UIDs, its TrainJob gone: its JobSet is the one
        # under its name.
        return owners is None or not chain.trainjob_uid or chain.trainjob_uid in owners

    def job_leads_here(uid: str) -> bool:
        owners = chain.jobs.get(uid)
        return owners is None or any(jobset_leads_here(u) for u in owners)

    return [p for p in pod_list if p.owner_kind == "Job" and p.owner_uid and job_leads_here(p.owner_uid)]


@dataclass(frozen=True)
class StartDecision:
    state: str  # starting (keep waiting), running or failed
    pod: str = ""
    message: str = ""
    pod_uid: str = ""


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
        if at is None or at < late or not reporter_accepted(event.reason, event.reporter):
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
    session: Session,
    pod: pods.PodInfo | None,
    *,
    expired: bool,
    failure: str | None = None,
    claims: Sequence[pods.PodInfo] = (),
) -> StartDecision:
    """What the observed trainer pod (or, without one, a creation failure) means for a starting session.
    More than one pod claiming the trainer pod's place (`claims`) fails it at once, naming them. Pure (reads
    the row, writes nothing)."""
    forged = claims_problem(claims, session)
    if forged is not None:
        return StartDecision(SessionState.FAILED, "", f"{forged}; {_delete_hint(session)}")
    if pod is not None and pod.phase == PHASE_RUNNING:
        return StartDecision(SessionState.RUNNING, pod.name, f"trainer pod {pod.name} is running", pod.uid)
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
        + (f": Kueue had not admitted it from LocalQueue {session.queue}" if session.queue else "")
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
    queue_name: str | None = None  # the Kueue LocalQueue; None: the namespace's default queue, if any


def session_spec(request: SessionRequest) -> JobSpec:
    """The request as the JobSpec the plan's builders take: the keep-alive command unless one is given."""
    return JobSpec(
        runtime=request.runtime,
        namespace=request.namespace,
        image=request.image,
        command=request.command if request.command else KEEP_ALIVE_COMMAND[:1],
        args=() if request.command else KEEP_ALIVE_COMMAND[1:],
        env=tuple(request.env.items()),
        num_nodes=request.num_nodes,
        queue_name=request.queue_name,
    )


def session_objects(
    *, session: Session, spec: JobSpec, runtime: Mapping[str, Any], label_domain: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The TrainingRuntime copy and the TrainJob, built as a job's (attempt 1 of "job" <session id>), then
    named after the session and marked as a session's. A session whose namespace queues through Kueue
    (session.queue: its queue_name, else the namespace's default queue) carries the queue label as a job
    does, so Kueue admits it against the same quota. Pure."""
    training_runtime = build_training_runtime(
        spec=spec, runtime=runtime, rules=SiteRules(), job_id=session.id, attempt=1, label_domain=label_domain
    )
    train_job, _ = build_train_job(
        spec=spec, job_id=session.id, attempt=1, label_domain=label_domain, queue_name=session.queue or None
    )
    marks = {f"{label_domain}/session": session.id}
    for obj in (training_runtime, train_job):
        obj["metadata"]["name"] = session.name
        obj["metadata"]["labels"].update(marks)
    for job in training_runtime["spec"]["template"]["spec"].get("replicatedJobs") or ():
        template = job.get("template") or {}
        if (template.get("metadata") or {}).get("labels", {}).get(
            TRAINER_ANCESTOR_LABEL
        ) == TRAINER_ANCESTOR_STEP:
            continue  # the trainer's pods run the keep-alive (or the caller's command)
        pod_template = (template.get("spec") or {}).get("template")
        if isinstance(pod_template, dict):
            labels = pod_template.setdefault("metadata", {}).setdefault("labels", {})
            labels[f"{label_domain}/{SESSION_ROLE_LABEL}"] = SESSION_PEER
    train_job["spec"]["runtimeRef"]["name"] = session.name
    return training_runtime, train_job


def _timeout(request: SessionRequest) -> int:
    return int(request.timeout_seconds or settings.SESSION_OPEN_TIMEOUT_SECONDS)


@dataclass(frozen=True)
class ExecResult:
    stdout: str
    stderr: str
    returncode: int | None
    truncated: bool
    pod: str
    container: str
