"""REST: the change feed (GET /api/v1/events) and webhook endpoints with their deliveries. Views validate,
call one service or selector, render."""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dispatch_site.api import DetailSerializer, StrictSerializer
from jobs import selectors
from jobs.observability import cursors, feed, payloads, webhooks
from jobs.observability.models import WebhookDelivery, WebhookEndpoint

# ---------------------------------------------------------------- the change feed


class EvidenceRowSerializer(serializers.Serializer):
    object = serializers.CharField()
    field = serializers.CharField()
    value = serializers.CharField()
    at = serializers.CharField()


class FeedItemSerializer(serializers.Serializer):
    cursor = serializers.CharField(help_text="this change's place in the feed")
    type = serializers.ChoiceField(choices=payloads.EVENT_TYPES)
    kind = serializers.CharField(help_text="the timeline entry's kind: submitted, transition, retry, ...")
    job = serializers.CharField()
    namespace = serializers.CharField()
    from_state = serializers.CharField(help_text="empty for a submission")
    to_state = serializers.CharField(help_text="empty when the state did not change")
    cause = serializers.CharField()
    attempt = serializers.IntegerField(allow_null=True)
    at = serializers.DateTimeField()
    status_url = serializers.CharField()
    message = serializers.CharField()
    rank = serializers.IntegerField(allow_null=True, help_text="the failing rank, when one failed")
    exit_code = serializers.IntegerField(allow_null=True)
    evidence = EvidenceRowSerializer(many=True, required=False, help_text="the first rows of the evidence")
    reasons = serializers.ListField(child=serializers.CharField(), required=False, help_text="refused: codes")
    findings = serializers.ListField(child=serializers.DictField(), required=False, help_text="identity")
    backoff_seconds = serializers.FloatField(required=False, allow_null=True, help_text="retry")


class FeedPageSerializer(serializers.Serializer):
    events = FeedItemSerializer(many=True)
    cursor = serializers.CharField(help_text="read on with ?after=<cursor>")
    more = serializers.BooleanField(help_text="another page follows at once")


class EventsApi(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "after",
                {"type": "string", "pattern": rf"^({cursors.PATTERN}|now)?$"},
                required=False,
                description="a cursor from an earlier answer to you (opaque); empty: from the beginning; "
                "'now': no events, only the cursor of the newest change",
            ),
            OpenApiParameter(
                "limit", {"type": "integer", "minimum": 1, "maximum": feed.PAGE_MAX}, required=False
            ),
            OpenApiParameter("job", str, required=False, description="only this job's changes"),
        ],
        responses={200: FeedPageSerializer, 422: DetailSerializer},
        summary="Every change of the jobs you may see, oldest first, after a cursor",
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        raw_limit = params.get("limit", str(feed.PAGE))
        if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= feed.PAGE_MAX:
            raise ValidationError({"limit": [f"must be an integer from 1 to {feed.PAGE_MAX}"]})
        raw_after = params.get("after")
        try:
            after = feed.parse_cursor(raw_after, user_id=int(request.user.pk or 0))
        except feed.BadCursor as exc:
            if raw_after and cursors.well_formed(raw_after):  # shaped right, but not a cursor of yours
                return Response({"detail": str(exc)}, status=status.HTTP_422_UNPROCESSABLE_ENTITY)
            raise ValidationError({"after": [str(exc)]}) from None
        changes = feed.visible_changes(request.user, selectors.jobs_visible_to(request.user))
        if params.get("job"):
            changes = changes.filter(job_id=params["job"])
        page = feed.read(changes, after=after, user_id=int(request.user.pk or 0), limit=int(raw_limit))
        return Response({"events": page.items, "cursor": page.cursor, "more": page.more})


# ---------------------------------------------------------------- webhook endpoints


class EndpointSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.CharField()
    description = serializers.CharField()
    owner = serializers.CharField(source="owner.username")
    namespace = serializers.CharField(help_text="empty: the owner's own jobs; a namespace; '*': every job")
    event_types = serializers.ListField(child=serializers.CharField(), help_text="empty: every type")
    active = serializers.BooleanField()
    disabled_at = serializers.DateTimeField(allow_null=True)
    disabled_reason = serializers.CharField(help_text="why it was disabled, when it was")
    secret_rotating_until = serializers.DateTimeField(
        source="previous_secret_until", allow_null=True, help_text="the previous secret still signs until"
    )
    created_at = serializers.DateTimeField()
    deliveries_url = serializers.SerializerMethodField()

    def get_deliveries_url(self, endpoint: WebhookEndpoint) -> str:
        return f"/api/v1/webhooks/{endpoint.pk}/deliveries"


class NewEndpointSerializer(EndpointSerializer):
    secret = serializers.CharField(help_text="the signing secret (whsec_...): shown this once")


URL_SHAPE = r"://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[!-~]*)?$"  # an ASCII host, a port, a printable path


@extend_schema_field({"type": "string", "pattern": "^https" + URL_SHAPE, "maxLength": 2000})
class EndpointUrlField(serializers.CharField):
    """An https:// URL (http:// only where WEBHOOK_ALLOW_HTTP says so): webhooks.url_problem says what else is
    refused, and why."""

    def __init__(self, **kwargs: Any) -> None:
        shape = RegexValidator("^https?" + URL_SHAPE, "an https:// URL: an ASCII host name, a port, a path")
        super().__init__(max_length=2000, validators=[shape], **kwargs)


NAMESPACE_OR_ALL = RegexValidator(
    r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)?$", "a namespace name (a DNS label), '*' for every job, or empty"
)


class EndpointInputSerializer(StrictSerializer):
    url = EndpointUrlField()
    description = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    namespace = serializers.CharField(
        max_length=63, required=False, allow_blank=True, default="", validators=[NAMESPACE_OR_ALL]
    )
    event_types = serializers.ListField(
        child=serializers.ChoiceField(choices=payloads.EVENT_TYPES), required=False, default=list
    )


class EndpointUpdateSerializer(StrictSerializer):
    url = EndpointUrlField(required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    event_types = serializers.ListField(
        child=serializers.ChoiceField(choices=payloads.EVENT_TYPES), required=False
    )
    active = serializers.BooleanField(required=False, help_text="true enables it again (sends what waited)")


def _input_error(exc: webhooks.WebhookInputError) -> ValidationError:
    return ValidationError({exc.field: [str(exc)]})


def _endpoint_for(request: Request, endpoint_id: str) -> WebhookEndpoint:
    # ASCII digits only: "²".isdigit() is true and int() refuses it; past 18 digits no bigint id matches.
    if not (endpoint_id.isascii() and endpoint_id.isdigit() and len(endpoint_id) < 19):
        raise Http404("no such webhook")
    endpoint = webhooks.endpoints_of(request.user).filter(pk=int(endpoint_id)).first()
    if endpoint is None:
        raise Http404("no such webhook")
    return endpoint


class WebhookListCreateApi(APIView):
    @extend_schema(
        operation_id="webhooks_list",
        responses=EndpointSerializer(many=True),
        summary="Your webhook endpoints (platform: everybody's)",
    )
    def get(self, request: Request) -> Response:
        return Response(EndpointSerializer(webhooks.endpoints_of(request.user)[:500], many=True).data)

    @extend_schema(
        operation_id="webhooks_create",
        request=EndpointInputSerializer,
        responses={201: NewEndpointSerializer, 403: DetailSerializer, 409: DetailSerializer},
        summary="Subscribe an HTTPS endpoint to job events (the secret is in this answer only); 409 when you "
        "already have WEBHOOK_ENDPOINTS_PER_USER endpoints",
    )
    def post(self, request: Request) -> Response:
        serializer = EndpointInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            endpoint, secret = webhooks.endpoint_create(
                owner=request.user,
                url=data["url"],
                namespace=data["namespace"],
                description=data["description"],
                event_types=data["event_types"],
            )
        except webhooks.WebhookInputError as exc:
            raise _input_error(exc) from None
        except webhooks.NotAllowed as exc:
            raise PermissionDenied(str(exc)) from None
        except webhooks.TooManyEndpoints as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        body = NewEndpointSerializer(endpoint).to_representation(endpoint) | {"secret": secret}
        return Response(
            body, status=status.HTTP_201_CREATED, headers={"Location": f"/api/v1/webhooks/{endpoint.pk}"}
        )


class WebhookDetailApi(APIView):
    @extend_schema(operation_id="webhooks_retrieve", responses=EndpointSerializer, summary="One endpoint")
    def get(self, request: Request, endpoint_id: str) -> Response:
        return Response(EndpointSerializer(_endpoint_for(request, endpoint_id)).data)

    @extend_schema(
        operation_id="webhooks_update",
        request=EndpointUpdateSerializer,
        responses=EndpointSerializer,
        summary="Change an endpoint; active: true enables a disabled one again",
    )
    def patch(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint_for(request, endpoint_id)
        serializer = EndpointUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            endpoint = webhooks.endpoint_update(
                actor=request.user, endpoint=endpoint, **serializer.validated_data
            )
        except webhooks.WebhookInputError as exc:
            raise _input_error(exc) from None
        return Response(EndpointSerializer(endpoint).data)

    @extend_schema(operation_id="webhooks_destroy", responses={204: None}, summary="Delete an endpoint")
    def delete(self, request: Request, endpoint_id: str) -> Response:
        webhooks.endpoint_delete(actor=request.user, endpoint=_endpoint_for(request, endpoint_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class SecretSerializer(serializers.Serializer):
    secret = serializers.CharField(help_text="the new secret: shown this once")
    previous_secret_valid_until = serializers.DateTimeField(
        allow_null=True, help_text="null: the previous secret was revoked at once"
    )


class RotateSecretSerializer(StrictSerializer):
    revoke_previous = serializers.BooleanField(
        required=False,
        default=False,
        help_text="the old secret stops signing at once (a leaked secret); default: it signs beside the new "
        "one until the grace period ends",
    )


class WebhookRotateSecretApi(APIView):
    @extend_schema(
        request=RotateSecretSerializer,
        responses=SecretSerializer,
        summary="A new signing secret; the old one also signs until the grace period ends, unless revoked",
    )
    def post(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint_for(request, endpoint_id)
        body = RotateSecretSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        secret = webhooks.endpoint_rotate_secret(
            actor=request.user, endpoint=endpoint, revoke_previous=body.validated_data["revoke_previous"]
        )
        endpoint.refresh_from_db()
        return Response({"secret": secret, "previous_secret_valid_until": endpoint.previous_secret_until})


class AttemptSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    at = serializers.DateTimeField()
    status_code = serializers.IntegerField(allow_null=True, help_text="null: no answer")
    latency_ms = serializers.IntegerField()
    error = serializers.CharField()


class SealedCursorField(serializers.CharField):
    """A feed position as its reader gets it: sealed for the user in the serializer's context
    (jobs.observability.cursors), never the platform-wide number."""

    def to_representation(self, value: Any) -> str:
        return cursors.seal(int(value), int(self.context["user_id"]))


class DeliverySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    msg_id = serializers.CharField(help_text="the webhook-id header, the same on every attempt")
    event_type = serializers.CharField()
    job = serializers.CharField(source="job_id")
    cursor = SealedCursorField(source="seq", help_text="read older ones with ?before=<cursor>")
    state = serializers.CharField()
    attempts = serializers.IntegerField()
    next_attempt_at = serializers.DateTimeField(help_text="pending: when it is tried next")
    last_status = serializers.IntegerField(allow_null=True)
    last_latency_ms = serializers.IntegerField(allow_null=True)
    last_error = serializers.CharField()
    created_at = serializers.DateTimeField()
    delivered_at = serializers.DateTimeField(allow_null=True)
    attempt_log = AttemptSerializer(many=True)
    payload = serializers.JSONField()


class WebhookDeliveriesApi(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("state", str, required=False, enum=["", "pending", "delivered", "failed"]),
            OpenApiParameter(
                "before",
                {"type": "string", "pattern": f"^{cursors.PATTERN}$"},
                required=False,
                description="deliveries older than this cursor (a delivery's, from an earlier answer to you)",
            ),
        ],
        responses={200: DeliverySerializer(many=True), 422: DetailSerializer},
        summary="An endpoint's deliveries, newest first (100 a page), each attempt with status and latency",
    )
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint_for(request, endpoint_id)
        deliveries = WebhookDelivery.objects.filter(endpoint=endpoint).prefetch_related("attempt_log")
        state = request.query_params.get("state", "")
        if state:
            if state not in ("pending", "delivered", "failed"):
                raise ValidationError({"state": ["one of pending, delivered, failed"]})
            deliveries = deliveries.filter(state=state)
        before = request.query_params.get("before", "")
        if before:
            try:
                deliveries = deliveries.filter(seq__lt=cursors.unseal(before, int(request.user.pk or 0)))
            except cursors.BadCursor:
                if cursors.well_formed(before):  # shaped right, but not a cursor handed to you
                    return Response(
                        {"detail": f"{before!r} is not a cursor of this list handed to you"},
                        status=status.HTTP_422_UNPROCESSABLE_ENTITY,
                    )
                raise ValidationError({"before": ["a cursor from this list"]}) from None
        rows: list[Any] = list(deliveries.order_by("-seq")[:100])
        return Response(DeliverySerializer(rows, many=True, context={"user_id": request.user.pk}).data)
