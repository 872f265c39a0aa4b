"""GET /api/v1/jobs/{id}/logs?attempt=&rank=&container=&tail=&follow= : one rank's log, as text.

The pod is found by the job's labels (one list call), never by guessing its name, and counts only when
supervision found it in the attempt's owner chain (jobs.logtail.chain_pods: a pod with copied labels is never
the rank's): the rank is the pod's completion index, and of a rank's pods in one attempt (a JobSet restart
makes another) the newest JobSet restart answers unless ?restart_attempt= names one. Two pods in the chain at
one rank's place (one forged with the Job's ownerReference copied) answer neither: 404 naming both
(jobs.logtail.rank_pod). A rank with no pod is 404
naming the ranks and attempts that have pods, so the caller's next request is the right one, unless its log
was kept when dispatch deleted its failed attempt's TrainJob (jobs.logtail): then the kept lines answer, with
X-Dispatch-Kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.http import Http404, HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster import logs as cluster_logs
from cluster.errors import ClusterError, NotFound, Rejected
from cluster.where import on_cluster
from dispatch_site.api import DetailSerializer, StrictSerializer
from dispatch_site.audit import audit_record_unless_recent
from dispatch_site.longrequests import released_after, take_slot
from jobs import selectors
from jobs.logtail import chain_pods, claims_message, kept_log, pod_selector, rank_pod
from jobs.models import Job

MAX_TAIL = 10_000
DEFAULT_TAIL = 1_000
LOG_PAGE_TAIL = 40  # the job page shows the failing rank's last lines
MAX_BYTES = 1024 * 1024  # the API's cap on one answer
PAGE_BYTES = 16 * 1024  # the job page's cap
FOLLOW_SECONDS = 300.0


class LogNotFound(Exception):
    def __init__(self, detail: str, **exists: Any) -> None:
        self.detail = detail
        self.exists = exists
        super().__init__(detail)


@dataclass(frozen=True)
class RankLog:
    text: str
    truncated: bool
    pod: str
    container: str
    kept_at: str = ""  # the log was kept when the TrainJob was deleted (jobs.logtail), at this time


def _find_pod(
    job: Job, *, attempt: int, rank: int, container: str, restart_attempt: int | None = None
) -> cluster_logs.PodInfo:
    attempts = sorted(job.executions.values_list("attempt", flat=True))
    if attempt not in attempts:
        if not attempts:
            raise LogNotFound(
                f"job {job.id} has no attempts (it is {job.state}): no pod ever ran", attempts=[]
            )
        raise LogNotFound(f"job {job.id} has no attempt {attempt}", attempts=attempts)
    execution = job.executions.get(attempt=attempt)
    pods = chain_pods(cluster_logs.list_pods(job.namespace, pod_selector(job, attempt)), execution)
    found = rank_pod(pods, rank=rank, restart_attempt=restart_attempt, replaced=bool(job.identity_warnings))
    if found.claims:
        raise LogNotFound(
            claims_message(found, job=job, attempt=attempt, rank=rank),
            attempts=attempts,
            pods=[p.name for p in found.claims],
        )
    pod = found.pod
    if pod is None:
        ranks = sorted({p.rank for p in pods if p.rank is not None})
        which = f" in JobSet restart {restart_attempt}" if restart_attempt is not None else ""
        raise LogNotFound(
            f"attempt {attempt} of job {job.id} has no pod for rank {rank}{which}"
            + (f"; ranks with pods: {', '.join(map(str, ranks))}" if ranks else "; it has no pods now"),
            attempts=attempts,
            ranks=ranks,
        )
    if container not in pod.containers and container not in pod.init_containers:
        raise LogNotFound(
            f"pod {pod.name} has no container {container!r}",
            containers=[*pod.containers, *pod.init_containers],
        )
    return pod


def attempt_cluster(job: Job, attempt: int) -> str:
    """Where the attempt's pods run: the MultiKueue worker its Workload was admitted to, "" here."""
    return job.executions.filter(attempt=attempt).values_list("cluster", flat=True).first() or ""


def read_rank_log(
    job: Job,
    *,
    attempt: int,
    rank: int,
    container: str,
    tail: int,
    restart_attempt: int | None = None,
    limit_bytes: int = PAGE_BYTES,
) -> RankLog:
    try:
        with on_cluster(attempt_cluster(job, attempt)):
            pod = _find_pod(
                job, attempt=attempt, rank=rank, container=container, restart_attempt=restart_attempt
            )
            log = cluster_logs.read_log(
                job.namespace, pod.name, container, tail_lines=tail, limit_bytes=limit_bytes
            )
    except (LogNotFound, NotFound, Rejected) as exc:
        # No pod (its TrainJob was deleted), the pod went between the list and the read, or its container
        # never started (no log yet): the log kept at the delete, if any.
        kept = kept_log(job, attempt=attempt, rank=rank, container=container, tail=tail)
        if kept is not None:
            return RankLog(kept.text, kept.truncated, kept.pod, container, kept_at=kept.captured_at)
        if isinstance(exc, LogNotFound):
            raise
        raise LogNotFound(
            f"no log for rank {rank} of attempt {attempt} ({pod.name}): {exc.message}"
        ) from None
    return RankLog(text=log.text, truncated=log.truncated, pod=pod.name, container=container)


class LogQuerySerializer(StrictSerializer):
    attempt = serializers.IntegerField(min_value=1, required=False, help_text="default: the current attempt")
    rank = serializers.IntegerField(min_value=0, required=False, help_text="default: the failing rank, or 0")
    restart_attempt = serializers.IntegerField(min_value=0, required=False)
    container = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", required=False, default="node"
    )
    tail = serializers.IntegerField(min_value=1, max_value=MAX_TAIL, required=False, default=DEFAULT_TAIL)
    follow = serializers.BooleanField(required=False, default=False)


AUDIT_WINDOW = timedelta(minutes=10)


def log_read_record(*, user: Any, job: Job, attempt: int, rank: int, container: str, via: str) -> None:
    """The audit log's row for a log read (logs can hold what their job printed: who read whose is kept),
    once per reader, job, attempt, rank and container in AUDIT_WINDOW: a page reloading it is one read."""
    audit_record_unless_recent(
        actor=user,
        action="log.read",
        object_type="job",
        object_id=job.pk,
        details={"attempt": attempt, "rank": rank, "container": container, "via": via, "owner": job.owner_id},
        within=AUDIT_WINDOW,
    )


def _headers(response: HttpResponse | StreamingHttpResponse, pod: cluster_logs.PodInfo, attempt: int) -> None:
    response["X-Dispatch-Pod"] = pod.name
    response["X-Dispatch-Attempt"] = str(attempt)
    response["X-Dispatch-Rank"] = str(pod.rank)
    response["X-Dispatch-Restart-Attempt"] = str(pod.restart_attempt)


class JobLogsApi(APIView):
    @extend_schema(
        parameters=[LogQuerySerializer],
        responses={
            (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="the log, capped at 1 MiB"),
            404: OpenApiResponse(
                DetailSerializer, description="no such job, attempt, rank pod or container: says what exists"
            ),
            503: OpenApiResponse(DetailSerializer, description="the cluster could not be read"),
        },
        summary="One rank's log (text); follow=true streams while the pod runs",
    )
    def get(self, request: Request, job_id: str) -> Any:
        job = selectors.job_for(request.user, job_id)
        if job is None:
            raise Http404("no such job")
        query = LogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        attempt = params.get("attempt") or job.current_attempt
        rank = params.get("rank")
        if rank is None:
            rank = job.failing_rank if job.failing_rank is not None else 0
        container = params["container"]
        try:
            with on_cluster(attempt_cluster(job, attempt)):  # a MultiKueue job's pods are on its worker
                return self._read(
                    request, job, attempt=attempt, rank=rank, container=container, params=params
                )
        except (LogNotFound, NotFound, Rejected) as exc:
            kept = kept_log(job, attempt=attempt, rank=rank, container=container, tail=params["tail"])
            if kept is not None:
                response = HttpResponse(kept.text, content_type="text/plain; charset=utf-8")
                response["X-Dispatch-Truncated"] = "true" if kept.truncated else "false"
                response["X-Dispatch-Pod"] = kept.pod
                response["X-Dispatch-Attempt"] = str(attempt)
                response["X-Dispatch-Rank"] = str(rank)
                response["X-Dispatch-Kept"] = kept.captured_at
                log_read_record(
                    user=request.user, job=job, attempt=attempt, rank=rank, container=container, via="api"
                )
                return response
            if isinstance(exc, LogNotFound):
                return Response({"detail": exc.detail, **exc.exists}, status=status.HTTP_404_NOT_FOUND)
            return Response(
                {"detail": f"no log for rank {rank} of attempt {attempt}: {exc.message}"},
                status=status.HTTP_404_NOT_FOUND,
            )
        except ClusterError as exc:
            return Response(
                {"detail": f"Kubernetes is unavailable, the log could not be read: {exc}"},
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
            )

    def _read(
        self, request: Request, job: Job, *, attempt: int, rank: int, container: str, params: dict[str, Any]
    ) -> Any:
        """Find the rank's pod and read (or follow) its log, on the cluster the call path is on."""
        pod = _find_pod(
            job,
            attempt=attempt,
            rank=rank,
            container=container,
            restart_attempt=params.get("restart_attempt"),
        )
        if params["follow"] and pod.phase in ("Pending", "Running"):
            slot = take_slot(request.user)  # 429 / 503 with Retry-After: long requests are capped
            try:
                # The request is made here, on this cluster; the stream is read after the view returns.
                chunks = cluster_logs.follow_log(
                    job.namespace,
                    pod.name,
                    container,
                    tail_lines=params["tail"],
                    limit_bytes=MAX_BYTES,
                    max_seconds=FOLLOW_SECONDS,
                )
            except BaseException:
                slot.release()
                raise
            streaming = StreamingHttpResponse(
                released_after(chunks, slot), content_type="text/plain; charset=utf-8"
            )
            streaming["X-Accel-Buffering"] = "no"
            _headers(streaming, pod, attempt)
            log_read_record(
                user=request.user, job=job, attempt=attempt, rank=rank, container=container, via="api"
            )
            return streaming
        log = cluster_logs.read_log(
            job.namespace, pod.name, container, tail_lines=params["tail"], limit_bytes=MAX_BYTES
        )
        response = HttpResponse(log.text, content_type="text/plain; charset=utf-8")
        response["X-Dispatch-Truncated"] = "true" if log.truncated else "false"
        _headers(response, pod, attempt)
        log_read_record(
            user=request.user, job=job, attempt=attempt, rank=rank, container=container, via="api"
        )
        return response
