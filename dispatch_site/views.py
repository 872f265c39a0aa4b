"""Who am I, and the audit log (API and page)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dispatch_site import roles
from dispatch_site.models import AuditEvent
from dispatch_site.permissions import IsPlatform


class MeApi(APIView):
    class OutputSerializer(serializers.Serializer):
        username = serializers.CharField()
        roles = serializers.ListField(child=serializers.CharField())
        namespaces = serializers.ListField(child=serializers.CharField())

    @extend_schema(responses=OutputSerializer, summary="The authenticated user, their roles and namespaces")
    def get(self, request: Request) -> Response:
        user = request.user
        granted = sorted(roles.granted_namespaces(user))
        user_roles = [
            r
            for r, yes in ((roles.PLATFORM, roles.is_platform(user)), (roles.ONCALL, roles.is_oncall(user)))
            if yes
        ]
        data: dict[str, Any] = {
            "username": user.get_username(),
            "roles": user_roles or [roles.USER],
            "namespaces": granted,
        }
        return Response(self.OutputSerializer(data).data)


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor_name", "action", "object_type", "object_id", "details"]


class AuditCursorPagination(CursorPagination):
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 500
    ordering = ("-at", "-id")


class AuditListApi(ListAPIView):
    """The audit log, newest first; filter with ?action=, ?object_type=, ?object_id=, ?actor=."""

    permission_classes = [IsPlatform]
    serializer_class = AuditEventSerializer
    pagination_class = AuditCursorPagination

    def get_queryset(self) -> Any:
        queryset = AuditEvent.objects.all()
        params = self.request.query_params
        for param, field in (
            ("action", "action"),
            ("object_type", "object_type"),
            ("object_id", "object_id"),
            ("actor", "actor_name"),
        ):
            if params.get(param):
                queryset = queryset.filter(**{field: params[param]})
        return queryset


@login_required
def audit_page(request: HttpRequest) -> HttpResponse:
    if not roles.is_platform(request.user):
        raise PermissionDenied("Only the platform role reads the audit log.")
    events = AuditEvent.objects.all()
    if request.GET.get("object_id"):
        events = events.filter(object_id=request.GET["object_id"])
    page = Paginator(events, 100).get_page(request.GET.get("page"))
    return render(request, "dashboard/audit.html", {"page": page})
