"""REST for interactive sessions: open (optionally waiting until running), list, read, execute, close.

Views validate, call one service in jobs.sessions, and render with the serializers below, which are also
what the OpenAPI schema shows (one definition per response shape).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import Throttled, ValidationError
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster.errors import ClusterError
from dispatch_site.api import CreatedCursorPagination, StrictSerializer
from dispatch_site.fields import Dns1123LabelField, StrictIntegerField, problem_validator
from dispatch_site.longrequests import ServerBusy, long_request
from dispatch_site.names import dns1123_label_problem
from dispatch_site.roles import NamespaceNotGranted
from dispatch_site.schema import FIELD_ERRORS, NOT_BLANK
from jobs.models import Session, SessionState
from jobs.naming import JOB_ID_PREFIX, JOB_ID_RANDOM_CHARS, trainjob_name_prefix
from jobs.serializers import EnvField, ImageField, JobSpecSerializer, QueueNameField, RuntimeRefSerializer
from jobs.sessions import errors, execute, rules, selectors, services
from jobs.spec import ARGS_MAX_ITEMS, NUM_NODES_MAX, RuntimeRef
from runtimes.api import ReasonSerializer

COMMAND_MAX_CHARS = 100_000


def _name_problem(value: str) -> str | None:
    problem = dns1123_label_problem(value)
    if problem:
        return problem
    if not value[0].isalpha():
        return "must start with a letter (a TrainJob name is an RFC 1035 label)"
    if trainjob_name_prefix(value) is not None:
        return (
            "must not have the shape of a job's TrainJob name (<job id>-<attempt>, alone or followed by "
            "'-'): that name, and the names of its JobSet's children, belong to a job's attempt"
        )
    return None


# An RFC 1035 label that does not start with a job's TrainJob name "<job id>-<attempt>" (then '-' or the end).
SESSION_NAME_PATTERN = (
    rf"^(?!{JOB_ID_PREFIX}[a-z2-7]{{{JOB_ID_RANDOM_CHARS}}}-[0-9]+(-|$))[a-z]([-a-z0-9]{{0,61}}[a-z0-9])?$"
)


@extend_schema_field({"type": "string", "pattern": SESSION_NAME_PATTERN, "maxLength": 63})
class TrainJobNameField(serializers.CharField):
    """A TrainJob name (an RFC 1035 label: _name_problem), its pattern in the schema."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=63, validators=[problem_validator(_name_problem)], **kwargs)


# ---------------------------------------------------------------- requests


class SessionOpenSerializer(StrictSerializer):
    """POST /api/v1/sessions. `command` replaces the keep-alive `sleep infinity` (then it must keep the
    trainer pod running itself); `name` names the TrainJob (default: the session id)."""

    runtime = RuntimeRefSerializer()
    namespace = Dns1123LabelField()
    name = TrainJobNameField(required=False)
    image = ImageField()
    num_nodes = StrictIntegerField(required=False, min_value=1, max_value=NUM_NODES_MAX)
    env = EnvField(required=False)
    command = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        required=False,
        min_length=1,
        max_length=ARGS_MAX_ITEMS,
    )
    timeout_seconds = StrictIntegerField(
        required=False,
        min_value=1,
        max_value=settings.SESSION_OPEN_TIMEOUT_MAX_SECONDS,
        help_text="how long the trainer pod may take to run (default "
        f"{settings.SESSION_OPEN_TIMEOUT_SECONDS}), including its wait for Kueue's admission",
    )
    queue_name = QueueNameField(
        required=False,
        help_text="the Kueue LocalQueue in the session's namespace; absent: the namespace's default queue, "
        "if the site sets one (sessions are admitted against the same quota as jobs)",
    )

    # The job request's own checks: env names the TrainJob accepts, and a
    # TrainingRuntime only from the session's namespace.
    validate_env = JobSpecSerializer.validate_env
    validate = JobSpecSerializer.validate

    def to_request(self) -> rules.SessionRequest:
        data: dict[str, Any] = self.validated_data
        runtime = data["runtime"]
        return rules.SessionRequest(
            runtime=RuntimeRef(
                kind=runtime["kind"], name=runtime["name"], namespace=runtime.get("namespace")
            ),
            namespace=data["namespace"],
            image=data["image"],
            num_nodes=data.get("num_nodes"),
            env=dict(data.get("env", {})),
            command=tuple(data["command"]) if data.get("command") else None,
            timeout_seconds=data.get("timeout_seconds"),
            name=data.get("name"),
            queue_name=data.get("queue_name"),
        )


@extend_schema_field(
    {
        "oneOf": [
            # Not only whitespace; the list's first item (the program) not empty.
            {
                "type": "string",
                "minLength": 1,
                "maxLength": COMMAND_MAX_CHARS,
                "pattern": NOT_BLANK,
                "description": "runs with sh -c",
            },
            {
                "type": "array",
                "items": {"type": "string"},
                "prefixItems": [{"type": "string", "minLength": 1}],
                "minItems": 1,
                "description": "runs as it is",
            },
        ]
    }
)
class CommandField(serializers.Field):
    """A command: a non-empty string (run with `sh -c`) or a non-empty list of strings (run directly)."""

    default_error_messages = {
        "invalid": "must be a string (run with sh -c) or a list of strings (run directly)",
        "empty": "must not be empty",
        "too_long": f"must be at most {COMMAND_MAX_CHARS} characters in all",
        "nul": "must not contain NUL characters",
    }

    def to_internal_value(self, data: Any) -> str | list[str]:
        if isinstance(data, str):
            value: str | list[str] = data
            if not data.strip():
                self.fail("empty")
        elif isinstance(data, list) and all(isinstance(item, str) for item in data):
            value = list(data)
            if not data or not data[0]:
                self.fail("empty")
        else:
            self.fail("invalid")
        parts = [value] if isinstance(value, str) else value
        if any("\x00" in part for part in parts):
            self.fail("nul")
        if sum(len(part) for part in parts) > COMMAND_MAX_CHARS:
            self.fail("too_long")
        return value

    def to_representation(self, value: Any) -> Any:
        return value


class SessionExecRequestSerializer(StrictSerializer):
    command = CommandField()
    container = Dns1123LabelField(required=False, help_text="default: node")
    timeout_seconds = StrictIntegerField(
        required=False,
        min_value=1,
        max_value=settings.SESSION_EXEC_TIMEOUT_MAX_SECONDS,
        help_text=f"how long the command may run (default {settings.SESSION_EXEC_TIMEOUT_SECONDS})",
    )


# ---------------------------------------------------------------- responses


class SessionRuntimeSerializer(serializers.Serializer):
    kind = serializers.CharField()
    name = serializers.CharField()
    namespace = serializers.CharField(required=False)


class SessionSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    runtime = serializers.SerializerMethodField()
    trainjob_name = serializers.CharField(source="name")
    cluster = serializers.CharField(
        read_only=True,
        help_text="the MultiKueue worker cluster the session's TrainJob was admitted to, where its pods run "
        "and its commands execute; empty: this cluster (or not admitted to a worker yet)",
    )
    status_url = serializers.SerializerMethodField()

    class Meta:
        model = Session
        fields = [
            "id",
            "name",
            "trainjob_name",
            "owner",
            "namespace",
            "runtime",
            "image",
            "num_nodes",
            "command",
            "timeout_seconds",
            "queue",
            "cluster",
            "state",
            "message",
            "warning",
            "pod",
            "container",
            "created_at",
            "updated_at",
            "started_at",
            "closed_at",
            "status_url",
        ]

    @extend_schema_field(SessionRuntimeSerializer)
    def get_runtime(self, session: Session) -> dict[str, str]:
        data = {"kind": session.runtime_kind, "name": session.runtime_name}
        if session.runtime_namespace:
            data["namespace"] = session.runtime_namespace
        return data

    def get_status_url(self, session: Session) -> str:
        return f"/api/v1/sessions/{session.id}"


class SessionErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
    state = serializers.ChoiceField(
        choices=SessionState.choices, required=False, help_text="the session's state"
    )


class SessionRefusedSerializer(serializers.Serializer):
    detail = serializers.CharField()
    reasons = ReasonSerializer(many=True)


class SessionFailedSerializer(serializers.Serializer):
    detail = serializers.CharField()
    session = SessionSerializer()


class ExecResultSerializer(serializers.Serializer):
    stdout = serializers.CharField(allow_blank=True)
    stderr = serializers.CharField(allow_blank=True)
    returncode = serializers.IntegerField(allow_null=True, help_text="null when the API server reported none")
    truncated = serializers.BooleanField(help_text="output beyond the site's limit was dropped")
    pod = serializers.CharField()
    container = serializers.CharField()


class ExecTimeoutSerializer(ExecResultSerializer):
    detail = serializers.CharField()


# ---------------------------------------------------------------- views


def _wait_seconds(request: Request) -> int:
    raw = request.query_params.get("wait", "")
    if raw == "":
        return 0
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({"wait": ["must be a whole number of seconds"]}) from None
    if not 0 <= value <= rules.WAIT_MAX_SECONDS:
        raise ValidationError({"wait": [f"must be between 0 and {rules.WAIT_MAX_SECONDS} seconds"]})
    return value


def _unavailable(exc: ClusterError) -> Response:
    return Response(
        {"detail": f"the Kubernetes API server could not be read: {exc}"},
        status=status.HTTP_503_SERVICE_UNAVAILABLE,
    )


def _conflict(session: Session, message: str) -> Response:
    return Response({"detail": message, "state": session.state}, status=status.HTTP_409_CONFLICT)


def _visible(request: Request, session_id: str) -> Session:
    session = selectors.session_for(request.user, session_id)
    if session is None:
        raise Http404("no such session")
    return session


WAIT_PARAMETER = OpenApiParameter(
    "wait",
    {"type": "integer", "minimum": 0, "maximum": rules.WAIT_MAX_SECONDS},
    required=False,
    description=(f"block up to this many seconds (at most {rules.WAIT_MAX_SECONDS}) until the state settles"),
)


class SessionListCreateApi(ListAPIView):
    serializer_class = SessionSerializer
    pagination_class = CreatedCursorPagination

    def get_queryset(self) -> Any:
        state = self.request.query_params.get("state", "")
        queryset = selectors.sessions_visible_to(self.request.user)
        if state:
            if state not in SessionState.values:
                raise ValidationError({"state": [f"not one of {', '.join(SessionState.values)}"]})
            queryset = queryset.filter(state=state)
        return queryset

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "state", str, required=False, enum=["", *SessionState.values], description="empty: any state"
            )
        ],
        summary="Sessions you may see, newest first (cursor pagination)",
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=SessionOpenSerializer,
        parameters=[WAIT_PARAMETER],
        responses={
            200: SessionSerializer,
            202: SessionSerializer,
            403: SessionErrorSerializer,
            409: SessionErrorSerializer,
            422: SessionRefusedSerializer,
            503: SessionErrorSerializer,
        },
        summary="Open a session: a TrainJob kept alive; 202 while starting, 200 once running (or failed)",
    )
    def post(self, request: Request) -> Response:
        owner = request.user
        assert isinstance(owner, User)  # IsAuthenticated ran
        wait = _wait_seconds(request)
        serializer = SessionOpenSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            session = services.session_open(owner=owner, request=serializer.to_request())
        except NamespaceNotGranted as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
        except errors.SessionRefused as exc:
            reasons = [r.to_dict() for r in exc.reasons]
            detail = "the runtime cannot serve a session: " + "; ".join(r.message for r in exc.reasons)
            return Response(
                {"detail": detail, "reasons": reasons}, status=status.HTTP_422_UNPROCESSABLE_ENTITY
            )
        except (errors.SessionNameTaken, errors.SessionLimitReached) as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        except errors.SessionCreateFailed as exc:
            failed = (
                status.HTTP_503_SERVICE_UNAVAILABLE if exc.transient else status.HTTP_422_UNPROCESSABLE_ENTITY
            )
            return Response(
                {"detail": str(exc), "session": SessionSerializer(exc.session).data}, status=failed
            )
        except ClusterError as exc:
            return _unavailable(exc)
        if wait and session.state == SessionState.STARTING:
            try:
                with long_request(owner):
                    session = services.session_wait(session=session, seconds=wait)
            except (Throttled, ServerBusy):
                pass  # opened all the same: 202, the caller polls the status URL instead of waiting here
        code = status.HTTP_202_ACCEPTED if session.state == SessionState.STARTING else status.HTTP_200_OK
        return Response(
            SessionSerializer(session).data,
            status=code,
            headers={"Location": f"/api/v1/sessions/{session.id}"},
        )


class SessionDetailApi(APIView):
    @extend_schema(responses=SessionSerializer, summary="One session: state, TrainJob, trainer pod, message")
    def get(self, request: Request, session_id: str) -> Response:
        return Response(SessionSerializer(_visible(request, session_id)).data)

    @extend_schema(
        parameters=[WAIT_PARAMETER],
        responses={200: SessionSerializer, 202: SessionSerializer, 403: SessionErrorSerializer},
        summary="Close: delete the TrainJob; closed once its pods are gone (idempotent); 202 while closing",
    )
    def delete(self, request: Request, session_id: str) -> Response:
        session = _visible(request, session_id)
        wait = _wait_seconds(request)
        if not selectors.may_close(request.user, session):
            return Response(
                {"detail": "only the owner, on-call or platform may close a session", "state": session.state},
                status=status.HTTP_403_FORBIDDEN,
            )
        assert isinstance(request.user, User)
        session = services.session_close(actor=request.user, session=session)
        if wait and session.state == SessionState.CLOSING:
            try:
                with long_request(request.user):
                    session = services.session_wait(session=session, seconds=wait, closing=True)
            except (Throttled, ServerBusy):
                pass  # closing all the same: 202, the caller polls
        code = status.HTTP_202_ACCEPTED if session.state == SessionState.CLOSING else status.HTTP_200_OK
        return Response(SessionSerializer(session).data, status=code)


class SessionExecApi(APIView):
    @extend_schema(
        request=SessionExecRequestSerializer,
        responses={
            200: ExecResultSerializer,
            # Two answers: the body's field errors (SessionExecRequestSerializer), or the exec refused for
            # the request's own reason (errors.ExecRefused: detail and the session's state).
            400: OpenApiResponse(
                response={
                    "anyOf": [
                        {"$ref": f"#/components/schemas/{FIELD_ERRORS}"},
                        {"$ref": "#/components/schemas/SessionError"},
                    ]
                },
                description="Invalid input: the errors per field, or the exec refused (detail, state)",
            ),
            403: SessionErrorSerializer,
            409: SessionErrorSerializer,
            429: SessionErrorSerializer,
            503: SessionErrorSerializer,
            504: ExecTimeoutSerializer,
        },
        summary="Run a command in the trainer pod (a string with sh -c, a list directly)",
    )
    def post(self, request: Request, session_id: str) -> Response:
        session = selectors.session_for_exec(request.user, session_id)
        if session is None:
            raise Http404("no such session")
        serializer = SessionExecRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        actor = request.user
        assert isinstance(actor, User)
        try:
            with long_request(actor):  # 429 / 503 with Retry-After when no slot is free
                result = execute.session_exec(
                    actor=actor,
                    session=session,
                    command=data["command"],
                    container=data.get("container"),
                    timeout_seconds=data.get("timeout_seconds"),
                )
        except (errors.NotSessionOwner, errors.ExecForbidden) as exc:
            return Response({"detail": str(exc), "state": session.state}, status=status.HTTP_403_FORBIDDEN)
        except errors.SessionNotRunning as exc:
            return _conflict(exc.session, str(exc))
        except errors.ExecRefused as exc:
            return Response({"detail": str(exc), "state": session.state}, status=status.HTTP_400_BAD_REQUEST)
        except errors.ExecTimedOut as exc:
            body = ExecResultSerializer(exc.result).data | {"detail": str(exc)}
            return Response(body, status=status.HTTP_504_GATEWAY_TIMEOUT)
        except ClusterError as exc:
            return _unavailable(exc)
        return Response(ExecResultSerializer(result).data)
