"""REST: runtimes with their verdicts, the allow-list (platform role), and the site settings."""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from django.http import Http404
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dispatch_site.api import NOT_TEXT, RejectUnknownFieldsMixin, StrictSerializer
from dispatch_site.fields import Dns1123SubdomainField, RecoveryPolicySerializer
from dispatch_site.names import (
    DNS1123_LABEL_MAX,
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    dns1123_subdomain_problem,
    is_dns1123_label,
    is_dns1123_subdomain,
)
from dispatch_site.permissions import IsPlatform, IsPlatformOrReadOnly
from runtimes import selectors, services
from runtimes.fixes import FIXES
from runtimes.models import AllowListEntry, PublishVia, ReviewState, RuntimeKind, RuntimeVerdict, SiteSettings
from runtimes.settings_checks import TRAINER_RELEASES

CLUSTER_SCOPE = "_"


def _row_data(row: selectors.RuntimeRow) -> dict[str, Any]:
    entry = row.entry
    return {
        "kind": row.kind,
        "namespace": row.namespace or None,
        "name": row.name,
        "ref": row.ref,
        "allow_listed": row.allow_listed,
        "purposes": entry.purposes if entry else [],
        "note": entry.note if entry else "",
        "verdict": row.verdict or None,
        "verdict_source": row.source,
        "review": _review_data(entry) if entry else None,
        "resource_version": row.resource_version,
        "url": f"/api/v1/runtimes/{row.kind}/{row.namespace or CLUSTER_SCOPE}/{row.name}",
    }


def _review_data(entry: AllowListEntry) -> dict[str, Any]:
    return {
        "state": entry.review,
        "spec_hash": entry.reviewed_hash or None,
        "reviewed_at": entry.reviewed_at,
        "reviewed_by": entry.reviewed_by or None,
    }


def _history_data(v: RuntimeVerdict) -> dict[str, Any]:
    return {
        "checked_at": v.checked_at,
        "refused": v.refused,
        "codes": v.codes,
        "resource_version": v.resource_version,
        "generation": v.generation,
    }


# Response shapes, for the OpenAPI schema (the views build plain dicts).
class ReasonSerializer(serializers.Serializer):
    code = serializers.ChoiceField(
        choices=sorted(FIXES),
        help_text="a stable refusal code (an API; the dashboard's Refusals page gives each one's meaning "
        "and fix)",
    )
    message = serializers.CharField()
    path = serializers.CharField()
    waived = serializers.BooleanField()


class CapabilitySerializer(serializers.Serializer):
    name = serializers.CharField()
    supported = serializers.BooleanField()
    why = serializers.CharField()


class VerdictSerializer(serializers.Serializer):
    refused = serializers.BooleanField()
    reasons = ReasonSerializer(many=True)
    identity_warning = serializers.CharField(allow_null=True)
    capabilities = CapabilitySerializer(many=True)


class ReviewSerializer(serializers.Serializer):
    state = serializers.ChoiceField(
        choices=ReviewState.values,
        help_text="content: the reviewed spec, labels and annotations are recorded (a change in any is "
        "runtime-changed-since-review); name: by name only (written in code, never by the API); missing: the "
        "runtime could not be read when it was approved; stale: approved before reviews covered labels and "
        "annotations. missing and stale are refused until re-approved",
    )
    spec_hash = serializers.CharField(
        allow_null=True, help_text="sha256 of what was reviewed: the spec, labels and annotations"
    )
    reviewed_at = serializers.DateTimeField(allow_null=True)
    reviewed_by = serializers.CharField(allow_null=True)


class RuntimeRowSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=RuntimeKind.values)
    namespace = serializers.CharField(allow_null=True)
    name = serializers.CharField()
    ref = serializers.CharField()
    allow_listed = serializers.BooleanField()
    purposes = serializers.ListField(child=serializers.ChoiceField(choices=["jobs", "sessions"]))
    note = serializers.CharField()
    verdict = VerdictSerializer(allow_null=True)
    verdict_source = serializers.ChoiceField(choices=["live", "recorded"])
    review = ReviewSerializer(allow_null=True, help_text="what was reviewed, for an allow-listed runtime")
    resource_version = serializers.CharField()
    url = serializers.CharField()


class RuntimeListSerializer(serializers.Serializer):
    results = RuntimeRowSerializer(many=True)
    cluster_error = serializers.CharField(allow_null=True)


class VerdictHistorySerializer(serializers.Serializer):
    checked_at = serializers.DateTimeField()
    refused = serializers.BooleanField()
    codes = serializers.ListField(child=serializers.CharField())
    resource_version = serializers.CharField()
    generation = serializers.IntegerField(allow_null=True)


class RuntimeDetailSerializer(RuntimeRowSerializer):
    object = serializers.JSONField(allow_null=True)
    history = VerdictHistorySerializer(many=True)
    cluster_error = serializers.CharField(allow_null=True)


class RuntimeListApi(APIView):
    @extend_schema(
        operation_id="runtimes_list",
        responses=RuntimeListSerializer,
        summary="The runtimes you may read (ClusterTrainingRuntimes; TrainingRuntimes in your namespaces), "
        "each with its verdict",
    )
    def get(self, request: Request) -> Response:
        overview = selectors.runtimes_overview(request.user)
        return Response(
            {
                "results": [_row_data(r) for r in overview.rows],
                "cluster_error": overview.cluster_error or None,
            }
        )


def parse_runtime_key(kind: str, namespace: str, name: str) -> tuple[str, str, str]:
    """The (kind, namespace, name) a URL names; 404 when no runtime could have that name, so a malformed
    name never reaches the API server (which would answer 400 about its own request)."""
    if kind not in RuntimeKind.values:
        raise Http404(f"unknown runtime kind {kind!r}")
    if namespace == CLUSTER_SCOPE:
        namespace = ""
    if kind == RuntimeKind.CLUSTER and namespace:
        raise Http404("a ClusterTrainingRuntime has no namespace: use _")
    if kind == RuntimeKind.NAMESPACED and not is_dns1123_label(namespace):
        raise Http404("not a namespace name")
    if not is_dns1123_subdomain(name):
        raise Http404("not a runtime name")
    return kind, namespace, name


class RuntimeDetailApi(APIView):
    @extend_schema(
        operation_id="runtimes_retrieve",
        responses=RuntimeDetailSerializer,
        summary="One runtime: every reason, capabilities, the object and the verdict history",
    )
    def get(self, request: Request, kind: str, namespace: str, name: str) -> Response:
        key = parse_runtime_key(kind, namespace, name)
        row, cluster_error = selectors.runtime_detail(request.user, *key)
        if row is None:
            if cluster_error:
                return Response({"detail": cluster_error}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
            raise Http404("no such runtime in the cluster or on the allow-list")
        data = _row_data(row)
        data["object"] = row.body
        data["history"] = [_history_data(v) for v in selectors.verdict_history(*key)]
        data["cluster_error"] = cluster_error or None
        return Response(data)


class AllowListInputSerializer(StrictSerializer):
    # validate() below, for the schema (dispatch_site.schema): a TrainingRuntime needs its namespace,
    # a ClusterTrainingRuntime has none.
    request_schema_rules = {
        "oneOf": [
            {
                "properties": {
                    "kind": {"enum": [RuntimeKind.NAMESPACED.value]},
                    "namespace": {"pattern": DNS1123_LABEL_PATTERN},
                },
                "required": ["kind", "namespace"],
            },
            {"properties": {"kind": {"enum": [RuntimeKind.CLUSTER.value]}, "namespace": {"maxLength": 0}}},
        ],
        "allOf": [{"properties": {"purposes": {"minItems": 1}}}],
    }
    kind = serializers.ChoiceField(choices=RuntimeKind.values)
    # Not trimmed: " " is not "no namespace" (the schema says a ClusterTrainingRuntime's namespace is empty).
    namespace = serializers.CharField(required=False, allow_blank=True, default="", trim_whitespace=False)
    name = Dns1123SubdomainField()
    purposes = serializers.MultipleChoiceField(
        choices=["jobs", "sessions"], default={"jobs"}, allow_empty=False
    )
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        namespace = attrs.get("namespace", "")
        if attrs["kind"] == RuntimeKind.NAMESPACED:
            if not namespace:
                raise ValidationError({"namespace": "a TrainingRuntime needs its namespace"})
            if not is_dns1123_label(namespace):
                raise ValidationError({"namespace": "must be a lowercase RFC 1123 label"})
        elif namespace:
            raise ValidationError({"namespace": "a ClusterTrainingRuntime has no namespace"})
        if not attrs["purposes"]:
            raise ValidationError({"purposes": "name at least one of jobs, sessions"})
        return attrs


class AllowListAddApi(APIView):
    permission_classes = [IsPlatform]

    @extend_schema(
        request=AllowListInputSerializer,
        responses={201: RuntimeRowSerializer, 200: RuntimeRowSerializer},
        summary="Allow a runtime, or re-approve one on the allow-list (platform role)",
        description="Records the runtime's spec as reviewed now (its sha256): a later change of the spec "
        "refuses the runtime with runtime-changed-since-review until a platform user POSTs it again. "
        "201: added; 200: re-approved (purposes and note as given now).",
    )
    def post(self, request: Request) -> Response:
        serializer = AllowListInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        approval = services.allow_list_approve(
            actor=request.user,
            kind=data["kind"],
            namespace=data["namespace"],
            name=data["name"],
            for_jobs="jobs" in data["purposes"],
            for_sessions="sessions" in data["purposes"],
            note=data["note"],
        )
        entry = approval.entry
        row, _ = selectors.runtime_detail(request.user, entry.kind, entry.namespace, entry.name)
        assert row is not None  # the entry exists
        code = status.HTTP_201_CREATED if approval.created else status.HTTP_200_OK
        return Response(_row_data(row), status=code)


class AllowListRemoveApi(APIView):
    permission_classes = [IsPlatform]

    @extend_schema(responses={204: None}, summary="Remove a runtime from the allow-list (platform role)")
    def delete(self, request: Request, kind: str, namespace: str, name: str) -> Response:
        entry = selectors.allow_list_entry(*parse_runtime_key(kind, namespace, name))
        if entry is None:
            raise Http404("not on the allow-list")
        services.allow_list_remove(actor=request.user, entry=entry)
        return Response(status=status.HTTP_204_NO_CONTENT)


# Kueue settings per namespace: a namespace name, or "*" for every namespace without its own entry.
ALL_NAMESPACES = "*"
_NAMESPACE_KEY_SCHEMA = {
    "type": "string",
    "pattern": f"^(?:\\*|{DNS1123_LABEL_PATTERN[1:-1]})$",
    "maxLength": 63,
}
# A LocalQueue or WorkloadPriorityClass name: it becomes a TrainJob label value, so at most 63 characters.
_KUEUE_NAME_SCHEMA = {"type": "string", "pattern": DNS1123_SUBDOMAIN_PATTERN, "maxLength": DNS1123_LABEL_MAX}


def _kueue_name_problem(value: str) -> str | None:
    if len(value) > DNS1123_LABEL_MAX:
        return (
            f"must be at most {DNS1123_LABEL_MAX} characters (it has {len(value)}): it becomes a label value"
        )
    return dns1123_subdomain_problem(value)


def _namespace_key_errors(value: dict[str, Any]) -> dict[str, list[str]]:
    return {
        key: [f"{key!r} is not a namespace name (a DNS-1123 label) or {ALL_NAMESPACES!r}"]
        for key in value
        if key != ALL_NAMESPACES and not is_dns1123_label(key)
    }


@extend_schema_field(
    {
        "type": "object",
        "propertyNames": _NAMESPACE_KEY_SCHEMA,
        "additionalProperties": _KUEUE_NAME_SCHEMA,
        "description": "Kueue: the LocalQueue a job without queue_name joins, per namespace ({namespace: "
        'queue}; "*" for every namespace without its own entry)',
    }
)
class DefaultQueuesField(serializers.DictField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=serializers.CharField(), **kwargs)

    def to_internal_value(self, data: Any) -> dict[str, str]:
        value: dict[str, str] = super().to_internal_value(data)
        errors = _namespace_key_errors(value)
        errors |= {k: [p] for k, v in value.items() if k not in errors and (p := _kueue_name_problem(v))}
        if errors:
            raise ValidationError(errors)
        return value


@extend_schema_field(
    {
        "type": "object",
        "propertyNames": _NAMESPACE_KEY_SCHEMA,
        "additionalProperties": {"type": "array", "items": _KUEUE_NAME_SCHEMA, "uniqueItems": True},
        "description": "Kueue: the WorkloadPriorityClasses a job may ask for (priority_class), per namespace "
        '({namespace: [class, ...]}; "*" for every namespace without its own entry; none where nothing is '
        "listed)",
    }
)
class PriorityClassesField(serializers.DictField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=serializers.ListField(child=serializers.CharField()), **kwargs)

    def to_internal_value(self, data: Any) -> dict[str, list[str]]:
        if isinstance(data, dict):  # DRF's CharField would take 0 for "0": a class name is text
            not_text = {
                str(k): [NOT_TEXT]
                for k, v in data.items()
                if isinstance(v, list) and any(not isinstance(c, str) for c in v)
            }
            if not_text:
                raise ValidationError(not_text)
        value: dict[str, list[str]] = super().to_internal_value(data)
        errors = _namespace_key_errors(value)
        for key, classes in value.items():
            problems = [f"{c!r} {p}" for c in classes if (p := _kueue_name_problem(c))]
            if len(set(classes)) != len(classes):
                problems.append("lists a class twice")
            if problems and key not in errors:
                errors[key] = problems
        if errors:
            raise ValidationError(errors)
        return value


def _not_a_release() -> str:
    return (
        '"{input}" is not a Kubeflow Trainer release dispatch knows: '
        f"{', '.join(TRAINER_RELEASES)} (the installed Trainer's version decides image placement)"
    )


class SiteSettingsSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    trainer_version = serializers.ChoiceField(
        choices=TRAINER_RELEASES,
        required=False,
        error_messages={"invalid_choice": _not_a_release()},
        help_text="the installed Kubeflow Trainer's version: a release dispatch knows",
    )
    kueue_default_queues = DefaultQueuesField(required=False)
    kueue_priority_classes = PriorityClassesField(required=False)
    publish_via = serializers.ChoiceField(choices=PublishVia.values, required=False)
    recovery_policy = RecoveryPolicySerializer(
        required=False, help_text="the site's default recovery policy; a job's own overrides it per key"
    )
    # validate() below, for the schema (dispatch_site.schema). The publish settings go together in one
    # request, whatever is stored: setting publish_via to initContainer names the container, and the
    # container is emptied only together with publish_via env. So a request is valid or not on its own.
    request_schema_rules = {
        "allOf": [
            {
                "anyOf": [
                    {"not": {"required": ["publish_via"]}},
                    {"properties": {"publish_via": {"enum": [PublishVia.ENV.value]}}},
                    {
                        "required": ["publish_container"],
                        "properties": {"publish_container": {"minLength": 1}},
                    },
                ]
            },
            {
                "anyOf": [
                    {"not": {"required": ["publish_container"]}},
                    {"properties": {"publish_container": {"minLength": 1}}},
                    {
                        "required": ["publish_via"],
                        "properties": {"publish_via": {"enum": [PublishVia.ENV.value]}},
                    },
                ]
            },
        ]
    }

    class Meta:
        model = SiteSettings
        fields = [
            "allow_rank_restart",
            "publish_via",
            "publish_container",
            "label_domain",
            "trainer_version",
            "recovery_policy",
            "kueue_default_queues",
            "kueue_priority_classes",
            "max_open_sessions_per_user",
            "updated_at",
        ]
        read_only_fields = ["updated_at"]
        # RegexValidators (not validate_<field>), so the schema shows the patterns a client must meet.
        extra_kwargs = {
            "publish_container": {
                "validators": [
                    RegexValidator(DNS1123_LABEL_PATTERN, "must be a container name (RFC 1123 label)")
                ]
            },
            # DNS_SUBDOMAIN with at least one dot
            "label_domain": {
                "validators": [
                    RegexValidator(
                        r"^[a-z0-9][-a-z0-9.]*\.[-a-z0-9.]*[a-z0-9]$",
                        "must be a DNS domain such as dispatch.example.com",
                    )
                ]
            },
        }

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("publish_via") == PublishVia.INIT_CONTAINER and not attrs.get("publish_container"):
            raise ValidationError({"publish_container": "required when publish_via is initContainer"})
        if (
            "publish_container" in attrs
            and not attrs["publish_container"]
            and attrs.get("publish_via") != PublishVia.ENV
        ):
            raise ValidationError({"publish_container": "may be emptied only together with publish_via env"})
        instance = self.instance
        via = attrs.get("publish_via", getattr(instance, "publish_via", PublishVia.ENV))
        container = attrs.get("publish_container", getattr(instance, "publish_container", ""))
        if via == PublishVia.INIT_CONTAINER and not container:
            raise ValidationError({"publish_container": "required when publish_via is initContainer"})
        if container and not is_dns1123_label(container):
            raise ValidationError({"publish_container": "must be a container name (RFC 1123 label)"})
        return attrs


class SiteSettingsChangedSerializer(SiteSettingsSerializer):
    warnings = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="what could not be checked (the cluster could not be read): the change is saved anyway",
    )

    class Meta(SiteSettingsSerializer.Meta):
        fields = [*SiteSettingsSerializer.Meta.fields, "warnings"]
        read_only_fields = ["updated_at", "warnings"]


class SettingsRefusedSerializer(serializers.Serializer):
    """422: a valid change that the cluster refutes (runtimes.services.site_settings_check)."""

    kueue_default_queues = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text='{namespace or "*": [why]}: a LocalQueue that does not exist there, or Kueue not installed',
    )
    kueue_priority_classes = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text='{namespace or "*": [why]}: a WorkloadPriorityClass that does not exist, or Kueue not '
        "installed",
    )


class SiteSettingsApi(APIView):
    permission_classes = [IsAuthenticated, IsPlatformOrReadOnly]

    @extend_schema(responses=SiteSettingsSerializer, summary="The site settings the rules use")
    def get(self, request: Request) -> Response:
        return Response(SiteSettingsSerializer(selectors.site_settings_seen_by(request.user)).data)

    @extend_schema(
        request=SiteSettingsSerializer,
        responses={200: SiteSettingsChangedSerializer, 422: SettingsRefusedSerializer},
        summary="Change site settings",
        description="A default LocalQueue or an allowed WorkloadPriorityClass that does not exist in the "
        "cluster is a 422 naming the namespace (Kueue not installed too): the request is valid, the "
        "cluster refutes it, and nothing is saved. A value the schema refuses is a 400. When the cluster "
        "cannot be read the change is saved and `warnings` says what was not checked. Only new or changed "
        'entries are checked; a "*" queue in every namespace granted by name without its own entry.',
    )
    def patch(self, request: Request) -> Response:
        site = SiteSettings.load()
        serializer = SiteSettingsSerializer(site, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        check = services.site_settings_check(site=site, changes=serializer.validated_data)
        if check.errors:
            refused = SettingsRefusedSerializer(check.errors).data
            return Response(refused, status=status.HTTP_422_UNPROCESSABLE_ENTITY)
        site = services.site_settings_update(
            actor=request.user, warnings=check.warnings, **serializer.validated_data
        )
        return Response({**SiteSettingsSerializer(site).data, "warnings": check.warnings})
