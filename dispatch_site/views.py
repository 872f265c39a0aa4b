"""Who am I, the audit log (API and page), API tokens (API and page), and the throttled login page."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.core.validators import RegexValidator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dispatch_site import roles, selectors, services
from dispatch_site.api import CreatedCursorPagination, DetailSerializer, StrictSerializer
from dispatch_site.audit import audit_record
from dispatch_site.models import ApiToken, AuditEvent
from dispatch_site.permissions import IsPlatform
from dispatch_site.schema import NOT_BLANK
from dispatch_site.throttles import LoginFailures


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


class AuditCursorPagination(CreatedCursorPagination):
    page_size = 100
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


class LoginView(auth_views.LoginView):
    """Django's login page. Each attempt takes its place on the failure counters before the password is
    checked, in one atomic step (dispatch_site.throttles.LoginFailures); a login whose username or address
    failed too often answers 429 + Retry-After without checking the password, except from an address the user
    logged in from before (a stranger cannot lock the user out). Every login, every failure and every lockout
    that begins is in the audit log, with the client's address."""

    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        self.failures = LoginFailures(request)
        wait = self.failures.take()
        if wait is not None:
            context = self.get_context_data(form=self.get_form_class()(request), throttled_for=wait)
            response = self.render_to_response(context, status=429)
            response["Retry-After"] = str(wait)
            return response
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: Any) -> HttpResponse:
        filled = self.failures.failed()
        username = str(self.request.POST.get("username", ""))[:150]
        where = {"address": self.failures.client_address}
        audit_record(
            actor=None,
            actor_name="anonymous",
            action="login.fail",
            object_type="user",
            object_id=username,
            details=where,
        )
        if filled:
            audit_record(
                actor=None,
                actor_name="anonymous",
                action="login.lockout",
                object_type="user",
                object_id=username,
                details={
                    **where,
                    "counters": filled,
                    "rates": {name: settings.THROTTLE_RATES.get(_RATE_OF[name]) for name in filled},
                },
            )
        return super().form_invalid(form)

    def form_valid(self, form: Any) -> HttpResponse:
        self.failures.succeeded()
        user = form.get_user()
        audit_record(
            actor=user,
            action="login",
            object_type="user",
            object_id=user.get_username(),
            details={"address": self.failures.client_address},
        )
        return super().form_valid(form)


# Which rate each login counter is counted at (dispatch_site.throttles.LoginFailures).
_RATE_OF = {"pair": "login-user", "username": "login-user", "address": "login-address"}


# ---------------------------------------------------------------- API tokens


class TokenSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    user = serializers.CharField(source="user.username")
    created_at = serializers.DateTimeField(source="created")
    expires_at = serializers.DateTimeField(source="expiry", allow_null=True)
    last_used_at = serializers.DateTimeField(allow_null=True)
    url = serializers.SerializerMethodField()

    def get_url(self, token: ApiToken) -> str:
        return f"/api/v1/tokens/{token.pk}"


class NewTokenSerializer(TokenSerializer):
    token = serializers.CharField(help_text="the token itself: shown this once, stored only as a digest")


class TokenInputSerializer(StrictSerializer):
    # Surrounding whitespace is trimmed, so the name needs a character that is not (the schema says so too).
    name = serializers.CharField(max_length=100, validators=[RegexValidator(NOT_BLANK, "must not be blank")])
    expires_in_days = serializers.IntegerField(
        min_value=1,
        max_value=services.MAX_TOKEN_TTL_DAYS,
        required=False,
        help_text="default API_TOKEN_TTL_DAYS",
    )


class TokenQuerySerializer(serializers.Serializer):
    # Checked for every caller, though only the platform role's list is filtered by it: a query the schema
    # refuses (a NUL, a name longer than a username) is a 400 whoever sends it.
    owner = serializers.CharField(
        required=False,
        default="",
        allow_blank=True,
        max_length=150,
        help_text="platform role: whose tokens (a username; empty: everybody's)",
    )


class TokenListCreateApi(APIView):
    @extend_schema(
        operation_id="tokens_list",
        parameters=[TokenQuerySerializer],
        responses=TokenSerializer(many=True),
        summary="Your API tokens (the platform role: everybody's), never the tokens themselves",
    )
    def get(self, request: Request) -> Response:
        query = TokenQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        tokens = selectors.tokens_visible_to(request.user, owner=query.validated_data["owner"])
        return Response(TokenSerializer(tokens, many=True).data)

    @extend_schema(
        operation_id="tokens_create",
        request=TokenInputSerializer,
        responses={201: NewTokenSerializer, 403: DetailSerializer},
        summary="Create an API token for yourself; the response holds the token, shown only this once. Needs "
        "a password login (the dashboard) or, with a token, the platform role; a token created with a token "
        "expires no later than it and is revoked with it",
    )
    def post(self, request: Request) -> Response:
        serializer = TokenInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = request.user
        assert isinstance(user, User)  # IsAuthenticated ran
        try:
            row, token = services.token_create(
                user=user,
                name=serializer.validated_data["name"],
                ttl_days=serializer.validated_data.get("expires_in_days"),
                actor=user,
                created_by=request.auth if isinstance(request.auth, ApiToken) else None,
            )
        except services.TokenNotAllowed as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
        data = dict(TokenSerializer(row).data) | {"token": token}
        return Response(data, status=status.HTTP_201_CREATED)


class TokenRevokeApi(APIView):
    @extend_schema(
        operation_id="tokens_revoke",
        parameters=[OpenApiParameter("token_id", int, OpenApiParameter.PATH)],
        responses={204: None},
        summary="Revoke an API token (yours; the platform role: anybody's)",
    )
    def delete(self, request: Request, token_id: str) -> Response:
        # The route takes any text, so a malformed id is this JSON 404 rather than Django's HTML page.
        if not (token_id.isascii() and token_id.isdigit() and len(token_id) < 19):
            raise Http404("no such token")
        token = selectors.token_for(request.user, int(token_id))
        if token is None:
            raise Http404("no such token")
        services.token_revoke(actor=request.user, token=token)
        return Response(status=status.HTTP_204_NO_CONTENT)


@login_required
def tokens_page(request: HttpRequest) -> HttpResponse:
    """My API tokens: name, created, expires, last used; create one (shown once) or revoke one."""
    new_token = ""
    form = None
    if request.method == "POST":
        fields = ("name", "expires_in_days")
        form = TokenInputSerializer(
            data={f: request.POST[f] for f in fields if request.POST.get(f, "") != ""}
        )
    if form is not None and form.is_valid():
        user = request.user
        assert isinstance(user, User)
        row, new_token = services.token_create(
            user=user,
            name=form.validated_data["name"],
            ttl_days=form.validated_data.get("expires_in_days"),
            actor=user,
        )
        messages.success(request, f"Token {row.name!r} created. Copy it now: it is not shown again.")
    context = {
        "nav": "tokens",
        "tokens": selectors.tokens_visible_to(request.user).filter(user_id=request.user.pk),
        "new_token": new_token,
        "errors": form.errors if form is not None and not new_token else {},
        "default_days": settings.API_TOKEN_TTL_DAYS,
        "max_days": services.MAX_TOKEN_TTL_DAYS,
    }
    return render(request, "dashboard/tokens.html", context, status=400 if context["errors"] else 200)


@login_required
@require_POST
def token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    token = selectors.token_for(request.user, token_id)
    if token is None:
        raise Http404("No such token.")
    name = token.name
    services.token_revoke(actor=request.user, token=token)
    messages.success(request, f"Token {name!r} revoked.")
    return redirect("dashboard:tokens")
