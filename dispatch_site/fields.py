"""Serializer fields that more than one layer uses: strict JSON integers, DNS-1123 names with their patterns
in the schema, and a recovery policy (the site settings' default and a job's overrides)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from dispatch_site.api import StrictSerializer
from dispatch_site.causes import MAX_BACKOFF_SECONDS, MAX_RETRIES, RETRYABLE_CAUSES
from dispatch_site.names import (
    _DNS1123_LABEL,
    _DNS1123_SUBDOMAIN,
    DNS1123_LABEL_MAX,
    DNS1123_SUBDOMAIN_MAX,
    dns1123_label_problem,
    dns1123_subdomain_problem,
)


def problem_validator(problem: Callable[[str], str | None]) -> Callable[[str], None]:
    """A DRF validator from a jobs.spec syntax check."""

    def validator(value: str) -> None:
        message = problem(value)
        if message:
            raise serializers.ValidationError(message)

    return validator


class StrictIntegerField(serializers.IntegerField):
    """An integer that is a JSON integer: 3, and 3.0 (JSON Schema counts a number without a fraction as an
    integer), but not "3", 3.5 or true (DRF's IntegerField takes "3")."""

    def to_internal_value(self, data: Any) -> int:
        return super().to_internal_value(json_integer(data, self.fail))


def json_integer(data: Any, fail: Callable[[str], Any]) -> int:
    if isinstance(data, float) and data.is_integer() and abs(data) < 2**63:
        return int(data)
    if isinstance(data, bool) or not isinstance(data, int):
        fail("invalid")
    return int(data)


@extend_schema_field({"type": "string", "pattern": _DNS1123_LABEL.pattern, "maxLength": DNS1123_LABEL_MAX})
class Dns1123LabelField(serializers.CharField):
    """A DNS-1123 label (a namespace); the schema shows its pattern so a client can check it first."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            max_length=DNS1123_LABEL_MAX, validators=[problem_validator(dns1123_label_problem)], **kwargs
        )


@extend_schema_field(
    {"type": "string", "pattern": _DNS1123_SUBDOMAIN.pattern, "maxLength": DNS1123_SUBDOMAIN_MAX}
)
class Dns1123SubdomainField(serializers.CharField):
    """A DNS-1123 subdomain (a runtime or queue name), its pattern in the schema."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            max_length=DNS1123_SUBDOMAIN_MAX,
            validators=[problem_validator(dns1123_subdomain_problem)],
            **kwargs,
        )


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
