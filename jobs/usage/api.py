"""REST: GET /api/v1/usage, JSON or CSV (?format=csv, for chargeback spreadsheets). The view validates its
query, calls one selector and renders."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.usage import selectors

DEFAULT_DAYS: Final = 30
FIGURES: Final = (
    "gpu_hours",
    "gpu_hours_lost",
    "cpu_hours",
    "jobs",
    "attempts",
    "queue_wait_p50_seconds",
    "queue_wait_p95_seconds",
)


class UsageQuerySerializer(serializers.Serializer):
    group_by = serializers.ChoiceField(choices=selectors.GROUPS, default="namespace")
    since = serializers.DateField(
        required=False, help_text=f"first day (UTC); default {DEFAULT_DAYS - 1} days before until"
    )
    until = serializers.DateField(required=False, help_text="last day (UTC), included; default today")
    step = serializers.ChoiceField(
        choices=["", *selectors.STEPS], default="", help_text="a row per day or week"
    )
    namespace = serializers.CharField(required=False, default="", max_length=63)
    owner = serializers.CharField(required=False, default="", max_length=150)
    queue = serializers.CharField(required=False, default="", max_length=253)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        until = attrs.get("until") or datetime.now(UTC).date()
        since = attrs.get("since") or until - min(timedelta(days=DEFAULT_DAYS - 1), until - date.min)
        if since > until:
            raise ValidationError({"since": ["after until"]})
        return attrs | {"since": since, "until": until}


class UsageRowSerializer(serializers.Serializer):
    namespace = serializers.CharField(required=False, help_text="the group's key (group_by=namespace)")
    owner = serializers.CharField(required=False)
    queue = serializers.CharField(required=False, help_text="Kueue LocalQueue; empty without Kueue")
    runtime = serializers.CharField(required=False, help_text="kind/name or kind/namespace/name")
    cause = serializers.CharField(required=False, help_text="the attempt's cause, or succeeded")
    period = serializers.DateField(required=False, help_text="the day, or the week's Monday (with step)")
    gpu_hours = serializers.FloatField()
    gpu_hours_lost = serializers.FloatField(
        help_text="of attempts that failed, or were cancelled after running"
    )
    cpu_hours = serializers.FloatField()
    jobs = serializers.IntegerField(help_text="jobs whose first attempt ended in the period")
    attempts = serializers.IntegerField()
    queue_wait_p50_seconds = serializers.FloatField(allow_null=True)
    queue_wait_p95_seconds = serializers.FloatField(allow_null=True)


class UsageSerializer(serializers.Serializer):
    group_by = serializers.ChoiceField(choices=selectors.GROUPS)
    since = serializers.DateField()
    until = serializers.DateField()
    step = serializers.CharField()
    results = UsageRowSerializer(many=True)


class UsageCsvRenderer(BaseRenderer):
    """?format=csv: the rows as a spreadsheet (a header, one line per row). Errors stay JSON."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        if not (isinstance(data, dict) and "results" in data):  # an answer that is not the rows
            for name, value in (data or {}).items():
                writer.writerow([name, value])
            return out.getvalue().encode()
        keys = [data["group_by"], *(["period"] if data.get("step") else []), *FIGURES]
        writer.writerow(keys)
        for row in data["results"]:
            writer.writerow(["" if row.get(k) is None else row.get(k) for k in keys])
        return out.getvalue().encode()


class UsageApi(APIView):
    renderer_classes = [JSONRenderer, UsageCsvRenderer]
    serializer_class = UsageSerializer  # for the schema: a plain APIView's answer is not guessed

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        if not force and request.query_params.get("format", "json") not in ("json", "csv"):
            raise ValidationError({"format": ["json or csv"]})  # DRF: 404, or an empty one ignored
        return super().perform_content_negotiation(request, force)

    @extend_schema(
        parameters=[UsageQuerySerializer],
        responses={
            (200, "application/json"): UsageSerializer,
            (200, "text/csv"): OpenApiResponse(
                OpenApiTypes.STR, description="?format=csv: a header line, then a line per row"
            ),
        },
        summary="GPU-hours, lost GPU-hours, CPU-hours, jobs, attempts and queue waits per group, from the "
        "daily rollup of ended attempts",
    )
    def handle_exception(self, exc: Exception) -> Response:
        """An error is JSON whatever format was asked for (a spreadsheet has no place for it)."""
        response = super().handle_exception(exc)
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response

    def get(self, request: Request) -> Response:
        params = {k: v for k, v in request.query_params.items() if k != "format"}
        query = UsageQuerySerializer(data=params)
        query.is_valid(raise_exception=True)
        q = selectors.UsageQuery(**query.validated_data)
        rows = selectors.usage_rows(request.user, q)
        body = {"group_by": q.group_by, "since": q.since, "until": q.until, "step": q.step, "results": rows}
        return Response(UsageSerializer(body).data)
