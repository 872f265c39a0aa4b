"""REST: plan, submit, list, read and cancel jobs. Views validate, call one service, render."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster.errors import ClusterError
from dispatch_site import roles
from dispatch_site.api import CreatedCursorPagination, DetailSerializer
from jobs import recovery, selectors, versions
from jobs.models import Execution, Job, JobEvent, JobState
from jobs.serializers import JobSpecSerializer, job_spec_parse
from jobs.spec import JobSpec
from jobs.submission import cancel, errors, planning, submit
from runtimes.api import CapabilitySerializer, ReasonSerializer
from runtimes.models import SiteSettings
from runtimes.selectors import site_settings

IDEMPOTENCY_HEADER = "Idempotency-Key"


def _spec_from(request: Request, site: SiteSettings) -> JobSpec:
    return job_spec_parse(data=request.data, label_domain=site.label_domain)


def _cluster_unavailable(exc: ClusterError) -> Response:
    return Response(
        {"detail": f"the cluster could not be read, nothing was recorded: {exc}"},
        status=status.HTTP_503_SERVICE_UNAVAILABLE,
    )


def _execution_data(execution: Execution, *, detail: bool = False) -> dict[str, Any]:
    data = {
        "attempt": execution.attempt,
        "trainjob_name": execution.trainjob_name,
        "state": execution.state,
        "cause": execution.cause,
        "message": execution.message,
        "rank": execution.rank,
        "exit_code": execution.exit_code,
        "restart_attempt": execution.restart_attempt,
        "created_at": execution.created_at,
        "submitted_at": execution.submitted_at,
        "started_at": execution.started_at,
        "finished_at": execution.finished_at,
        "gpu_hours": execution.gpu_hours,
        "queue_wait_seconds": execution.queue_wait_seconds,
        "cluster": execution.cluster,
    }
    if detail:
        data["evidence"] = execution.evidence
        data["queued_reason"] = execution.queued_reason
        data["identity_findings"] = execution.identity_findings
        data["supervision_warnings"] = execution.supervision_warnings
        data["ranks"] = execution.ranks
        data["observed_at"] = execution.observed_at
    return data


def _event_data(event: JobEvent) -> dict[str, Any]:
    return {
        "at": event.at,
        "attempt": event.attempt,
        "kind": event.kind,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "cause": event.cause,
        "message": event.message,
        "details": event.details,
    }


def job_data(job: Job, *, detail: bool = False, executions: list[Execution] | None = None) -> dict[str, Any]:
    """The job as the API shows it. `executions`: the job's executions when the caller has them (a job just
    submitted: its first), so they are not read again."""
    runtime = {"kind": job.runtime_kind, "name": job.runtime_name}
    if job.runtime_namespace:
        runtime["namespace"] = job.runtime_namespace
    data = {
        "id": job.id,
        "display_name": job.display_name,
        "owner": job.owner.username,
        "namespace": job.namespace,
        "runtime": runtime,
        "state": job.state,
        "cause": job.cause,
        "message": job.message,
        "evidence": job.evidence,
        "reasons": job.reasons,
        "identity_warnings": job.identity_warnings,
        "identity_findings": job.identity_findings,
        "supervision_warnings": job.supervision_warnings,
        "failing_rank": job.failing_rank,
        "exit_code": job.exit_code,
        "queued_reason": job.queued_reason,
        "last_known_state": job.last_known_state,
        "unknown_since": job.unknown_since,
        "current_attempt": job.current_attempt,
        "executions": [
            _execution_data(e, detail=detail)
            for e in (job.executions.all() if executions is None else executions)
        ],
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "state_changed_at": job.state_changed_at,
        "status_url": f"/api/v1/jobs/{job.id}",
    }
    if detail:
        data["spec"] = job.spec
        data["plan"] = job.plan
        data["recovery_policy"] = job.recovery_policy
        data["timeline"] = [_event_data(e) for e in job.events.all()]
    return data


# The serializers below document the shape (OpenAPI); responses are built by job_data, because DRF's
# per-field machinery cost more than the rest of a submission (measured with make bench).
class EvidenceSerializer(serializers.Serializer):
    object = serializers.CharField(help_text="the object, e.g. 'Pod team-a/j...-1-node-0-1-abcde'")
    field = serializers.CharField(
        help_text="the field that proves it, e.g. status.conditions[DisruptionTarget]"
    )
    value = serializers.JSONField()
    at = serializers.CharField(allow_null=True, required=False)


class QueuedReasonSerializer(serializers.Serializer):
    """Why a job waits; {} when it does not (so no key is required)."""

    reason = serializers.CharField(
        required=False,
        help_text="awaiting-quota, inadmissible, awaiting-admission-checks, awaiting-admission, suspended, "
        "awaiting-jobset, awaiting-pods, unschedulable, image-pull, "
        "config-error, pods-not-created, retry-backoff",
    )
    message = serializers.CharField(required=False)
    since = serializers.CharField(allow_null=True, required=False)
    local_queue = serializers.CharField(required=False, help_text="Kueue: the job's LocalQueue")
    cluster_queue = serializers.CharField(required=False, help_text="Kueue: its ClusterQueue, once known")
    workload = serializers.CharField(required=False, help_text="Kueue: the attempt's Workload")
    position = serializers.IntegerField(
        required=False, help_text="Kueue: place in the LocalQueue, 1 = admitted next (the visibility API)"
    )
    position_in_cluster_queue = serializers.IntegerField(required=False)


class IdentityFindingSerializer(serializers.Serializer):
    rank = serializers.IntegerField()
    attempt = serializers.IntegerField()
    restart_attempt = serializers.IntegerField()
    pods = serializers.ListField(child=serializers.CharField())
    why = serializers.CharField()
    expected = serializers.BooleanField(help_text="the plan's allowRankRestart identity warning foresaw it")


class SupervisionWarningSerializer(serializers.Serializer):
    """Beside the status: an object carrying the job's labels outside its TrainJob's owner chain (ignored), a
    read that failed (the status was derived without it), a rank disrupted on the way to a success (it
    exited 0 on SIGTERM, so its Job counted it complete), or a Kueue act the API server refused (a Workload
    that could not be deactivated)."""

    kind = serializers.CharField(help_text="stranger, read, disruption or kueue")
    object = serializers.CharField(help_text="e.g. 'Pod team-a/x' or 'Events in team-a'")
    message = serializers.CharField()


class RankSerializer(serializers.Serializer):
    rank = serializers.IntegerField(allow_null=True)
    attempt = serializers.IntegerField(allow_null=True)
    restart_attempt = serializers.IntegerField()
    pod = serializers.CharField()
    phase = serializers.CharField()
    exit_code = serializers.IntegerField(allow_null=True)
    restarts = serializers.IntegerField()
    node = serializers.CharField()
    reason = serializers.CharField()
    first_failure = serializers.BooleanField()


class ExecutionSerializer(serializers.ModelSerializer):
    evidence = EvidenceSerializer(many=True, required=False, help_text="detail only")
    queued_reason = QueuedReasonSerializer(required=False, help_text="detail only; {} when not waiting")
    identity_findings = IdentityFindingSerializer(many=True, required=False, help_text="detail only")
    supervision_warnings = SupervisionWarningSerializer(many=True, required=False, help_text="detail only")
    ranks = RankSerializer(many=True, required=False, help_text="detail only: rank x restart attempt")
    gpu_hours = serializers.FloatField(
        read_only=True, allow_null=True, help_text="the attempt's GPU-hours, once it ended (jobs.usage)"
    )
    queue_wait_seconds = serializers.FloatField(
        read_only=True, allow_null=True, help_text="TrainJob created -> all ranks running; null: never ran"
    )
    cluster = serializers.CharField(
        read_only=True,
        help_text="the MultiKueue worker cluster the attempt was admitted to; empty: where it was submitted",
    )

    class Meta:
        model = Execution
        fields = [
            "attempt",
            "trainjob_name",
            "state",
            "cause",
            "message",
            "rank",
            "exit_code",
            "restart_attempt",
            "created_at",
            "submitted_at",
            "started_at",
            "finished_at",
            "evidence",
            "queued_reason",
            "identity_findings",
            "supervision_warnings",
            "ranks",
            "observed_at",
            "gpu_hours",
            "queue_wait_seconds",
            "cluster",
        ]


class TimelineEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "attempt", "kind", "from_state", "to_state", "cause", "message", "details"]


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    runtime = serializers.SerializerMethodField()
    status_url = serializers.SerializerMethodField()
    executions = ExecutionSerializer(many=True, read_only=True)
    evidence = EvidenceSerializer(many=True)
    queued_reason = QueuedReasonSerializer()
    identity_findings = IdentityFindingSerializer(many=True)
    supervision_warnings = SupervisionWarningSerializer(many=True)

    class Meta:
        model = Job
        fields = [
            "id",
            "display_name",
            "owner",
            "namespace",
            "runtime",
            "state",
            "cause",
            "message",
            "evidence",
            "reasons",
            "identity_warnings",
            "identity_findings",
            "supervision_warnings",
            "failing_rank",
            "exit_code",
            "queued_reason",
            "last_known_state",
            "unknown_since",
            "current_attempt",
            "executions",
            "created_at",
            "updated_at",
            "state_changed_at",
            "status_url",
        ]

    def get_runtime(self, job: Job) -> dict[str, Any]:
        data = {"kind": job.runtime_kind, "name": job.runtime_name}
        if job.runtime_namespace:
            data["namespace"] = job.runtime_namespace
        return data

    def get_status_url(self, job: Job) -> str:
        return f"/api/v1/jobs/{job.id}"

    def to_representation(self, instance: Job) -> dict[str, Any]:
        return job_data(instance)


class JobDetailSerializer(JobSerializer):
    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "spec", "plan", "recovery_policy", "timeline"]

    timeline = TimelineEntrySerializer(many=True, source="events")

    def to_representation(self, instance: Job) -> dict[str, Any]:
        return job_data(instance, detail=True)


# inline: "source" is a reserved attribute name on DRF fields, so it cannot be a class attribute here.
ImagePlacementSerializer = inline_serializer(
    name="ImagePlacement",
    fields={
        "replicated_job": serializers.CharField(),
        "container": serializers.CharField(),
        "image": serializers.CharField(allow_null=True),
        "source": serializers.ChoiceField(choices=["job", "runtime"], help_text="who names the image"),
    },
    many=True,
)


class PlanNamesSerializer(serializers.Serializer):
    train_job = serializers.CharField()
    training_runtime = serializers.CharField()
    longest_pod_name = serializers.CharField(allow_null=True)


class QueueQuotaSerializer(serializers.Serializer):
    flavor = serializers.CharField()
    resource = serializers.CharField()
    quota = serializers.CharField(help_text="the flavor's nominal quota of the resource")
    reserved = serializers.CharField(help_text="status.flavorsReservation: held by reserving workloads")
    usage = serializers.CharField(help_text="status.flavorsUsage: used by admitted workloads")
    free = serializers.CharField(help_text="quota minus reserved")
    requested = serializers.CharField(allow_null=True, help_text="what this job asks; null: none of it")


# inline, like ImagePlacement: "source" is a reserved attribute name on DRF fields.
QueuePlanSerializer = inline_serializer(
    name="QueuePlan",
    fields={
        "local_queue": serializers.CharField(allow_null=True),
        "source": serializers.ChoiceField(
            choices=["job", "namespace-default"], allow_null=True, help_text="who named the LocalQueue"
        ),
        "cluster_queue": serializers.CharField(allow_null=True),
        "priority_class": serializers.CharField(allow_null=True),
        "priority": serializers.IntegerField(allow_null=True, help_text="the WorkloadPriorityClass's value"),
        "requests": serializers.DictField(
            child=serializers.CharField(), help_text="the whole job, per resource"
        ),
        "quota": QueueQuotaSerializer(
            many=True, help_text="the ClusterQueue's quota per flavor and resource"
        ),
        "fits_now": serializers.BooleanField(
            allow_null=True, help_text="the requests fit the ClusterQueue's free quota now"
        ),
        "fit_message": serializers.CharField(),
        "pending_workloads": serializers.IntegerField(
            allow_null=True, help_text="workloads pending in the ClusterQueue"
        ),
        "workers": serializers.ListField(
            child=serializers.CharField(),
            required=False,
            help_text="MultiKueue: the worker clusters the job may land on (the MultiKueueConfigs of the "
            "ClusterQueue's admission checks); empty for a queue on this cluster",
        ),
    },
    allow_null=True,
    help_text="Kueue (jobs.queueing.QueuePlan): the LocalQueue, ClusterQueue and quota; null when no queue "
    "applies",
)


class PlanSerializer(serializers.Serializer):
    """The plan's shape, for the OpenAPI schema (jobs.plan.Plan.to_dict builds it)."""

    refused = serializers.BooleanField()
    reasons = ReasonSerializer(many=True)
    capabilities = CapabilitySerializer(many=True)
    identity_warnings = serializers.ListField(child=serializers.CharField())
    warnings = serializers.ListField(child=serializers.CharField())
    objects = serializers.JSONField(
        allow_null=True, help_text="training_runtime and train_job, as start creates them"
    )
    images = ImagePlacementSerializer
    names = PlanNamesSerializer()
    queue = QueuePlanSerializer
    recovery_policy = serializers.JSONField(
        help_text="what the supervisor does after a failure: {retry: {cause: n}, "
        "backoff_seconds: {cause: s}, budgets: {infrastructure: n, user: n}}"
    )


class PlanApi(APIView):
    @extend_schema(
        request=JobSpecSerializer,
        responses={200: PlanSerializer, 403: DetailSerializer},
        summary="What start would do: verdict, reasons, objects, images (403 for an ungranted namespace)",
    )
    def post(self, request: Request) -> Response:
        site = site_settings(max_age=planning.PLAN_RUNTIME_MAX_AGE)
        spec = _spec_from(request, site)
        # Like start: nothing is read from a namespace the caller is not granted.
        if not roles.may_submit_to(request.user, spec.namespace):
            return Response(
                {"detail": f"namespace {spec.namespace!r} is not granted to you"},
                status=status.HTTP_403_FORBIDDEN,
            )
        try:
            plan, _ = planning.job_plan(
                user=request.user,
                spec=spec,
                runtime_max_age=planning.PLAN_RUNTIME_MAX_AGE,
                site=site,
                namespace_granted=True,
            )
        except ClusterError as exc:
            return _cluster_unavailable(exc)
        # The recovery policy that would apply: the site's default with this job's overrides (jobs.recovery).
        policy = recovery.resolve(site.recovery_policy, spec.recovery_policy)
        return Response({**plan.to_dict(), "recovery_policy": policy})


class JobListCreateApi(ListAPIView):
    serializer_class = JobSerializer
    pagination_class = CreatedCursorPagination

    def get_queryset(self) -> Any:
        params = self.request.query_params
        state = params.get("state", "")
        if state and state not in JobState.values:
            raise ValidationError({"state": [f"not one of {', '.join(JobState.values)}"]})
        return selectors.jobs_filtered(
            self.request.user,
            state=state,
            runtime=params.get("runtime", ""),
            namespace=params.get("namespace", ""),
            owner=params.get("owner", ""),
        ).prefetch_related("executions")

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "state", str, required=False, enum=["", *JobState.values], description="empty: any state"
            ),
            *(OpenApiParameter(n, str, required=False) for n in ("runtime", "namespace", "owner")),
        ],
        summary="Jobs you may see, newest first (cursor pagination)",
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=JobSpecSerializer,
        parameters=[OpenApiParameter(IDEMPOTENCY_HEADER, str, OpenApiParameter.HEADER, required=False)],
        responses={202: JobSerializer, 409: DetailSerializer, 422: JobSerializer},
        summary="Submit a job: refused (422, every reason) or accepted (202) and started by a worker",
    )
    def post(self, request: Request) -> Response:
        owner = request.user
        assert isinstance(owner, User)  # IsAuthenticated ran
        key = request.headers.get(IDEMPOTENCY_HEADER, "").strip() or None
        if key is not None and len(key) > 255:
            raise ValidationError({IDEMPOTENCY_HEADER: ["at most 255 characters"]})
        site = site_settings(max_age=planning.PLAN_RUNTIME_MAX_AGE)
        spec = _spec_from(request, site)
        try:
            submission = submit.job_submit(owner=owner, spec=spec, idempotency_key=key, site=site)
        except roles.NamespaceNotGranted as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
        except errors.IdempotencyConflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        except ClusterError as exc:
            return _cluster_unavailable(exc)
        job = submission.job
        code = (
            status.HTTP_422_UNPROCESSABLE_ENTITY
            if job.state == JobState.REFUSED
            else status.HTTP_202_ACCEPTED
        )
        headers = {"Location": f"/api/v1/jobs/{job.id}"}
        if submission.replayed:
            headers["Idempotent-Replayed"] = "true"
        return Response(job_data(job, executions=submission.executions), status=code, headers=headers)


class JobDetailApi(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("If-None-Match", str, OpenApiParameter.HEADER, required=False)],
        responses={200: JobDetailSerializer, 304: None},
        summary="One job with its plan and executions (ETag; If-None-Match answers 304 when unchanged)",
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = selectors.job_for(request.user, job_id)
        if job is None:
            raise Http404("no such job")
        tag = versions.etag(versions.job_fingerprint(job))  # If-None-Match: 304 when nothing changed
        headers = {"ETag": tag, "Cache-Control": "private, no-cache"}
        if versions.matches(request.headers.get("If-None-Match", ""), tag):
            return Response(status=status.HTTP_304_NOT_MODIFIED, headers=headers)
        return Response(JobDetailSerializer(job).data, headers=headers)


class JobCancelApi(APIView):
    @extend_schema(
        request=None,
        responses={200: JobSerializer, 409: DetailSerializer},
        summary="Cancel: delete the TrainJob; state cancelled",
    )
    def post(self, request: Request, job_id: str) -> Response:
        job = selectors.job_for(request.user, job_id)
        if job is None:
            raise Http404("no such job")
        if not selectors.may_cancel(request.user, job):
            return Response({"detail": "only the owner, on-call or platform may cancel"}, status=403)
        try:
            job = cancel.job_cancel(actor=request.user, job=job)
        except errors.JobNotCancellable as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(JobSerializer(job).data, status=status.HTTP_202_ACCEPTED)
