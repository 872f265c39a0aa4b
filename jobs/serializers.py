"""Job API serializers.

JobSpecSerializer validates a job request body (and a stored spec, which has the same shape) and turns it
into a jobs.spec.JobSpec. Errors are DRF field errors, nested where the body is (runtime.name,
env.PET_NNODES, resources_per_node.requests.cpu). Unknown fields are errors, not silently dropped: a typo
like `num_node` would otherwise run a job the user did not ask for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from dispatch_site.api import StrictSerializer
from jobs.spec import (
    _DNS1123_LABEL,
    _DNS1123_SUBDOMAIN,
    ARGS_MAX_ITEMS,
    CLUSTER_TRAINING_RUNTIME,
    DISPLAY_NAME_MAX,
    DNS1123_LABEL_MAX,
    DNS1123_SUBDOMAIN_MAX,
    ENV_MAX_ITEMS,
    IMAGE_MAX,
    INT32_MAX,
    INT64_MAX,
    MAX_BACKOFF_SECONDS,
    MAX_RETRIES,
    NUM_NODES_MAX,
    RETRYABLE_CAUSES,
    RUNTIME_KINDS,
    TRAINING_RUNTIME,
    JobSpec,
    RuntimeRef,
    dns1123_label_problem,
    dns1123_subdomain_problem,
    env_name_problem,
    label_value_problem,
    parse_quantity,
    qualified_name_problem,
    quantity_problem,
)

# Labels dispatch sets itself on the TrainJob; queue_name is how a job names its Kueue queue.
RESERVED_LABEL_KEYS = {
    "app.kubernetes.io/managed-by": "dispatch sets it",
    "kueue.x-k8s.io/queue-name": "use queue_name",
}


def _check(problem: Callable[[str], str | None]) -> Callable[[str], None]:
    """A DRF validator from a jobs.spec syntax check."""

    def validator(value: str) -> None:
        message = problem(value)
        if message:
            raise serializers.ValidationError(message)

    return validator


class StrictIntegerField(serializers.IntegerField):
    """An integer that is a JSON integer: DRF's IntegerField also takes "3" and 3.0 (and true is not one)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


@extend_schema_field({"oneOf": [{"type": "string"}, {"type": "integer"}], "example": "500m"})
class QuantityField(serializers.Field):
    """A Kubernetes quantity: a string ("500m", "4Gi") or an integer; kept as a string."""

    default_error_messages = {"invalid": "must be a quantity string like '500m', '2' or '4Gi'"}

    def to_internal_value(self, data: Any) -> str:
        if isinstance(data, bool) or not isinstance(data, str | int):
            self.fail("invalid")
        text = str(data)
        problem = quantity_problem(text)
        if problem:
            raise serializers.ValidationError(problem)
        return text

    def to_representation(self, value: Any) -> str:
        return str(value)


def _keyed_errors(items: Mapping[str, str], check: Callable[[str, str], str | None]) -> None:
    """Per-key errors, nested under the key (like DictField's own value errors)."""
    errors = {k: [msg] for k, v in items.items() if (msg := check(k, v))}
    if errors:
        raise serializers.ValidationError(errors)


@extend_schema_field({"type": "string", "pattern": _DNS1123_LABEL.pattern, "maxLength": DNS1123_LABEL_MAX})
class Dns1123LabelField(serializers.CharField):
    """A DNS-1123 label (a namespace); the schema shows its pattern so a client can check it first."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=DNS1123_LABEL_MAX, validators=[_check(dns1123_label_problem)], **kwargs)


@extend_schema_field(
    {"type": "string", "pattern": _DNS1123_SUBDOMAIN.pattern, "maxLength": DNS1123_SUBDOMAIN_MAX}
)
class Dns1123SubdomainField(serializers.CharField):
    """A DNS-1123 subdomain (a runtime or queue name), its pattern in the schema."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            max_length=DNS1123_SUBDOMAIN_MAX, validators=[_check(dns1123_subdomain_problem)], **kwargs
        )


_RUNTIME_NAME_SCHEMA = {
    "type": "string",
    "pattern": _DNS1123_SUBDOMAIN.pattern,
    "maxLength": DNS1123_SUBDOMAIN_MAX,
}


@extend_schema_field({"type": "string", "maxLength": IMAGE_MAX, "pattern": "^[^\\s\\u0000]*$"})
class ImageField(serializers.CharField):
    """A container image reference: no whitespace (JobSpecSerializer.validate_image), no NUL."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=IMAGE_MAX, **kwargs)


# The schema a client sees: a ClusterTrainingRuntime has no namespace, a TrainingRuntime is the one in the
# job's own namespace (the body may repeat it as runtime.namespace, which must then equal `namespace`).
@extend_schema_field(
    {
        "oneOf": [
            {
                "type": "object",
                "properties": {"kind": {"type": "string", "enum": [kind]}, "name": _RUNTIME_NAME_SCHEMA},
                "required": ["kind", "name"],
                "additionalProperties": False,
            }
            for kind in (TRAINING_RUNTIME, CLUSTER_TRAINING_RUNTIME)
        ],
        "description": "The runtime: a TrainingRuntime in the job's namespace or a ClusterTrainingRuntime.",
    }
)
class RuntimeRefSerializer(StrictSerializer):
    kind = serializers.ChoiceField(choices=RUNTIME_KINDS)
    name = Dns1123SubdomainField()
    namespace = Dns1123LabelField(required=False)


def _resource_problem(name: str, _quantity: str) -> str | None:
    problem = qualified_name_problem(name)
    return f"resource name {problem}" if problem else None


class ResourceRequirementsSerializer(StrictSerializer):
    """corev1.ResourceRequirements without claims (resource claims cannot be given per node here)."""

    requests = serializers.DictField(child=QuantityField(), required=False)
    limits = serializers.DictField(child=QuantityField(), required=False)

    def validate_requests(self, value: dict[str, str]) -> dict[str, str]:
        _keyed_errors(value, _resource_problem)
        return value

    def validate_limits(self, value: dict[str, str]) -> dict[str, str]:
        _keyed_errors(value, _resource_problem)
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # Kubernetes rejects the pod (after the TrainJob exists) when a request exceeds its limit.
        requests, limits = attrs.get("requests", {}), attrs.get("limits", {})
        errors = {
            name: [f"request {requests[name]} exceeds the limit {limits[name]}"]
            for name in requests
            if name in limits and parse_quantity(requests[name]) > parse_quantity(limits[name])
        }
        if errors:
            raise serializers.ValidationError({"requests": errors})
        return attrs


def _cause_problem(cause: str, _retries: object) -> str | None:
    if cause in RETRYABLE_CAUSES:
        return None
    return f"cannot be retried: retryable causes are {', '.join(RETRYABLE_CAUSES)}"


class RecoveryBudgetsSerializer(StrictSerializer):
    infrastructure = StrictIntegerField(required=False, min_value=0, max_value=MAX_RETRIES)
    user = StrictIntegerField(required=False, min_value=0, max_value=MAX_RETRIES)


def _per_cause_schema(maximum: int) -> dict[str, Any]:
    """A {cause: integer} map as the schema shows it: only retryable causes are keys (_cause_problem)."""
    value = {"type": "integer", "minimum": 0, "maximum": maximum}
    return {
        "type": "object",
        "properties": dict.fromkeys(RETRYABLE_CAUSES, value),
        "additionalProperties": False,
    }


@extend_schema_field(_per_cause_schema(MAX_RETRIES))
class RetriesPerCauseField(serializers.DictField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=StrictIntegerField(min_value=0, max_value=MAX_RETRIES), **kwargs)


@extend_schema_field(_per_cause_schema(MAX_BACKOFF_SECONDS))
class BackoffPerCauseField(serializers.DictField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=StrictIntegerField(min_value=0, max_value=MAX_BACKOFF_SECONDS), **kwargs)


@extend_schema_field(
    {"type": "string", "pattern": _DNS1123_SUBDOMAIN.pattern, "maxLength": DNS1123_LABEL_MAX}
)
class QueueNameField(serializers.CharField):
    """A Kueue LocalQueue name: a DNS-1123 subdomain of at most 63 characters (a label value)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            max_length=DNS1123_LABEL_MAX, validators=[_check(dns1123_subdomain_problem)], **kwargs
        )


class RecoveryPolicySerializer(StrictSerializer):
    """Overrides of the site's recovery policy (jobs.recovery): per cause the retries and the backoff before
    attempt A+1, and the budgets that cap infrastructure and user causes together."""

    retry = RetriesPerCauseField(required=False, allow_empty=True)
    backoff_seconds = BackoffPerCauseField(required=False, allow_empty=True)
    budgets = RecoveryBudgetsSerializer(required=False)

    def validate_retry(self, value: dict[str, int]) -> dict[str, int]:
        errors = {k: [msg] for k, v in value.items() if (msg := _cause_problem(k, v))}
        if errors:
            raise serializers.ValidationError(errors)
        return value

    def validate_backoff_seconds(self, value: dict[str, int]) -> dict[str, int]:
        return self.validate_retry(value)


def _env_problem(name: str, _value: str) -> str | None:
    problem = env_name_problem(name)
    return f"{name} {problem}" if problem else None


def _label_problem(key: str, value: str) -> str | None:
    problem = qualified_name_problem(key)
    if problem:
        return f"label key {problem}"
    reserved = RESERVED_LABEL_KEYS.get(key)
    if reserved:
        return f"label {key} is reserved: {reserved}"
    problem = label_value_problem(value)
    return f"label value {problem}" if problem else None


class JobSpecSerializer(StrictSerializer):
    """A job request body. Context: `label_domain` (optional) reserves the site's own label prefix."""

    runtime = RuntimeRefSerializer()
    namespace = Dns1123LabelField()
    display_name = serializers.CharField(required=False, max_length=DISPLAY_NAME_MAX)
    image = ImageField()
    command = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        required=False,
        max_length=ARGS_MAX_ITEMS,
    )
    args = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        required=False,
        max_length=ARGS_MAX_ITEMS,
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False
    )
    num_nodes = StrictIntegerField(required=False, min_value=1, max_value=NUM_NODES_MAX)
    procs_per_node = StrictIntegerField(required=False, min_value=1, max_value=INT32_MAX)
    resources_per_node = ResourceRequirementsSerializer(required=False)
    active_deadline_seconds = StrictIntegerField(required=False, min_value=1, max_value=INT64_MAX)
    labels = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False
    )
    queue_name = QueueNameField(required=False)
    recovery_policy = RecoveryPolicySerializer(required=False)

    def validate_image(self, value: str) -> str:
        if any(c.isspace() for c in value):
            raise serializers.ValidationError("must not contain whitespace")
        return value

    def validate_env(self, value: dict[str, str]) -> dict[str, str]:
        if len(value) > ENV_MAX_ITEMS:
            raise serializers.ValidationError(f"at most {ENV_MAX_ITEMS} variables (the TrainJob limit)")
        _keyed_errors(value, _env_problem)
        return value

    def validate_labels(self, value: dict[str, str]) -> dict[str, str]:
        domain = self.context.get("label_domain")

        def problem(key: str, label_value: str) -> str | None:
            if domain and key.startswith(f"{domain}/"):
                return f"label {key} is reserved: dispatch owns the {domain}/ prefix"
            return _label_problem(key, label_value)

        _keyed_errors(value, problem)
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        runtime = attrs["runtime"]
        namespace = runtime.get("namespace")
        if runtime["kind"] == TRAINING_RUNTIME:
            # A TrainJob can only use a TrainingRuntime in its own namespace (trainer-facts §2).
            if namespace is not None and namespace != attrs["namespace"]:
                message = (
                    f"must be the job's namespace {attrs['namespace']!r}: a TrainJob can only use a "
                    "TrainingRuntime in its own namespace"
                )
                raise serializers.ValidationError({"runtime": {"namespace": [message]}})
            runtime["namespace"] = attrs["namespace"]
        elif namespace is not None:
            raise serializers.ValidationError(
                {"runtime": {"namespace": ["must not be set: a ClusterTrainingRuntime is cluster-scoped"]}}
            )
        return attrs

    def to_spec(self) -> JobSpec:
        """The validated body as a JobSpec; call after is_valid()."""
        data: dict[str, Any] = self.validated_data
        runtime = data["runtime"]
        recovery = data.get("recovery_policy")
        return JobSpec(
            runtime=RuntimeRef(
                kind=runtime["kind"], name=runtime["name"], namespace=runtime.get("namespace")
            ),
            namespace=data["namespace"],
            image=data["image"],
            display_name=data.get("display_name"),
            command=tuple(data.get("command", ())),
            args=tuple(data.get("args", ())),
            env=tuple(data.get("env", {}).items()),
            num_nodes=data.get("num_nodes"),
            procs_per_node=data.get("procs_per_node"),
            resources_per_node=dict(data.get("resources_per_node", {})),
            active_deadline_seconds=data.get("active_deadline_seconds"),
            labels=dict(data.get("labels", {})),
            queue_name=data.get("queue_name"),
            recovery_policy=None if recovery is None else {k: dict(v) for k, v in recovery.items()},
        )
