"""A failed attempt's failing-rank log, kept before its TrainJob is deleted.

Every terminal failure deletes the attempt's TrainJob (its pods go with it, so the GPUs are free at once), and
with the pods goes the one log an on-call engineer reads first. Right before that delete, the failing rank's
last lines are read and stored on the execution; the job page and `GET /api/v1/jobs/{id}/logs` serve them once
the pod is gone, saying so. Best effort: a log that cannot be read is not kept, and the delete goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from cluster import logs as cluster_logs
from cluster.errors import ClusterError
from cluster.where import on_cluster
from jobs.models import Execution, Job

logger = logging.getLogger(__name__)

KEPT_LINES = 1_000
KEPT_BYTES = 256 * 1024
CONTAINER = "node"  # the trainer container of every rank pod


@dataclass(frozen=True)
class KeptLog:
    text: str
    truncated: bool
    pod: str
    container: str
    captured_at: str


@dataclass(frozen=True)
class RankPod:
    """The rank's pod, or (pod None) every pod that claims the rank's place when more than one does."""

    pod: cluster_logs.PodInfo | None
    claims: tuple[cluster_logs.PodInfo, ...] = ()


def rank_pod(
    pods: list[cluster_logs.PodInfo], *, rank: int, restart_attempt: int | None, replaced: bool = False
) -> RankPod:
    """The rank's pod (pure): of the given JobSet restart, else the newest one, the newest pod of the rank.
    The Job controller makes one pod per rank and JobSet restart (a job whose plan did not warn that ranks
    restart: `replaced` False; supervision fails such a job identity-violation when it sees two). When more
    than one pod holds that place (same JobSet restart, replicated job, job index and rank), one was made by
    someone who may create pods in the namespace, with the labels and the Job's ownerReference copied:
    dispatch does not guess which one is the rank's, and names them all."""
    mine = [p for p in pods if p.rank == rank]
    if restart_attempt is not None:
        mine = [p for p in mine if p.restart_attempt == restart_attempt]
    newest = max(mine, key=lambda p: (p.restart_attempt, p.created), default=None)
    if newest is None or replaced:
        return RankPod(newest)
    claims = tuple(
        sorted(
            (
                p
                for p in mine
                if (p.restart_attempt, p.replicated_job, p.job_index)
                == (newest.restart_attempt, newest.replicated_job, newest.job_index)
            ),
            key=lambda p: (p.created, p.name),
        )
    )
    return RankPod(newest) if len(claims) == 1 else RankPod(None, claims)


def claims_message(found: RankPod, *, job: Job, attempt: int, rank: int) -> str:
    """What a log request or the kept log says when more than one pod claims the rank (pure)."""
    names = ", ".join(f"{p.name} (uid {p.uid})" for p in found.claims)
    first = found.claims[0]
    return (
        f"{len(found.claims)} pods claim rank {rank} of attempt {attempt} of job {job.id} (JobSet restart "
        f"{first.restart_attempt}, replicated job {first.replicated_job!r}): {names}. The Job controller "
        f"makes one; the others were made by someone who may create pods in namespace {job.namespace}, and "
        "dispatch does not guess which log is the rank's"
    )


def chain_pods(pods: list[cluster_logs.PodInfo], execution: Execution) -> list[cluster_logs.PodInfo]:
    """Of the pods listed by the job's labels, those supervision found in the attempt's owner chain (TrainJob
    -> JobSet -> Job -> pod, by UID: Execution.pods_seen). Anyone who can create a pod in the namespace can
    copy the labels; such a pod's log is never shown or kept as the rank's (pure)."""
    seen = execution.pods_seen or {}
    return [p for p in pods if p.uid and p.uid in seen]


def pod_selector(job: Job, attempt: int) -> str:
    """The label selector of one attempt's pods, in the label domain stored with the job."""
    return f"{job.label_domain}/job={job.id},{job.label_domain}/attempt={attempt}"


def execution_log_keep(*, job: Job, execution: Execution) -> bool:
    """Read and store the failing rank's last lines (once per execution); whether a log is kept now. A rank
    whose pod is already gone is recorded as such ({"rank", "missing"}, no text), so the delete's later
    passes do not list the pods again; a read that failed is tried again on the next pass."""
    if execution.rank is None or execution.log_tail:
        return "text" in (execution.log_tail or {})
    try:
        with on_cluster(execution.cluster):  # a MultiKueue attempt's pods are on its worker
            return _keep(job, execution)
    except ClusterError as exc:
        logger.info("the log of %s/%s rank %s was not kept: %s", job.namespace, job.id, execution.rank, exc)
        return False


def _keep(job: Job, execution: Execution) -> bool:
    """execution_log_keep's reads and write, on the cluster the call path is on."""
    assert execution.rank is not None
    pods = chain_pods(cluster_logs.list_pods(job.namespace, pod_selector(job, execution.attempt)), execution)
    found = rank_pod(pods, rank=execution.rank, restart_attempt=None, replaced=bool(job.identity_warnings))
    pod = found.pod
    if pod is None or CONTAINER not in pod.containers:
        why = (
            claims_message(found, job=job, attempt=execution.attempt, rank=execution.rank)
            if found.claims
            else "no pod of the rank was left to read"
        )
        missing = {"rank": execution.rank, "missing": why}
        Execution.objects.filter(pk=execution.pk, log_tail={}).update(log_tail=missing)
        execution.log_tail = missing
        return False
    log = cluster_logs.read_log(
        job.namespace, pod.name, CONTAINER, tail_lines=KEPT_LINES, limit_bytes=KEPT_BYTES
    )
    kept: dict[str, Any] = {
        "rank": execution.rank,
        "pod": pod.name,
        "container": CONTAINER,
        "text": log.text,
        "truncated": log.truncated,
        "captured_at": timezone.now().isoformat(),
    }
    Execution.objects.filter(pk=execution.pk, log_tail={}).update(log_tail=kept)
    execution.log_tail = kept
    return True


def kept_log(job: Job, *, attempt: int, rank: int, container: str, tail: int) -> KeptLog | None:
    """The log kept for this attempt's rank, its last `tail` lines; None when none was kept."""
    kept = Execution.objects.filter(job=job, attempt=attempt).values_list("log_tail", flat=True).first()
    if not kept or kept.get("rank") != rank or kept.get("container") != container:
        return None
    lines = str(kept.get("text", "")).splitlines(keepends=True)
    return KeptLog(
        text="".join(lines[-tail:]),
        truncated=bool(kept.get("truncated")) or len(lines) > tail,
        pod=str(kept.get("pod", "")),
        container=container,
        captured_at=str(kept.get("captured_at", "")),
    )
