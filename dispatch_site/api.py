"""API plumbing shared by every endpoint: the exception handler and a cursor paginator."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from django import db
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import QueryDict
from rest_framework import exceptions, serializers, status
from rest_framework.exceptions import ErrorDetail
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

logger = logging.getLogger(__name__)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    # The database is down or restarting (or a lock wait was cut short): a 503 that names it, never a 500.
    if isinstance(exc, (db.OperationalError, db.InterfaceError)):
        logger.warning("database unavailable: %s", exc)
        return Response(
            {"detail": f"dependency down: database: {type(exc).__name__}: {str(exc).strip()[:300]}"},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
        )
    # Input PostgreSQL cannot take (a NUL character in a filter, a number out of range): the client's, a 400.
    if isinstance(exc, db.DataError):
        logger.info("input the database refused: %s", exc)
        return Response(
            {"detail": f"invalid input: {str(exc).strip().splitlines()[0][:200]}"},
            status=status.HTTP_400_BAD_REQUEST,
        )
    # A model-level ValidationError that slipped through is still the client's input, never a 500.
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        exc = exceptions.ValidationError(detail)
    response = drf_exception_handler(exc, context)
    if response is not None and response.status_code == status.HTTP_401_UNAUTHORIZED:
        response.data = {"detail": "Authentication credentials were not provided or are invalid."} | (
            response.data if isinstance(response.data, dict) else {}
        )
    return response


class DetailSerializer(serializers.Serializer):
    """An error with one message: {"detail": "..."} (DRF's own errors and the views' 403/404/409/503)."""

    detail = serializers.CharField()


UNKNOWN_FIELD = "unknown field"
NOT_TEXT = "must be a string"
NOT_BOOLEAN = "must be true or false"


def _text_problem(field: serializers.Field, value: Any) -> bool:
    """DRF's CharField turns 0 or true into "0"/"True"; a JSON number where text belongs is an error."""
    if isinstance(field, serializers.CharField):
        return value is not None and not isinstance(value, str)
    if isinstance(field, serializers.ListField) and isinstance(field.child, serializers.CharField):
        return isinstance(value, list) and any(not isinstance(item, str) for item in value)
    if isinstance(field, serializers.DictField) and isinstance(field.child, serializers.CharField):
        return isinstance(value, Mapping) and any(not isinstance(item, str) for item in value.values())
    return False


class RejectUnknownFieldsMixin:
    """Rejects keys the serializer does not declare, each as a field error "unknown field": a typo in a
    request must not be silently ignored. A number where text belongs is an error too (not coerced). The
    schema shows both (dispatch_site.schema: additionalProperties false)."""

    fields: Any

    def to_internal_value(self, data: Any) -> Any:
        unknown: dict[str, list[ErrorDetail]] = {}
        if isinstance(data, Mapping):
            unknown = {
                str(k): [ErrorDetail(UNKNOWN_FIELD, code="unknown")] for k in data if k not in self.fields
            }
            unknown |= {
                str(k): [ErrorDetail(NOT_TEXT, code="invalid")]
                for k, v in data.items()
                if k in self.fields and _text_problem(self.fields[k], v)
            }
            # DRF's BooleanField takes 0, 1, "yes", "off": a JSON body has true and false (a query string
            # has only text, so there "true" is fine).
            if not isinstance(data, QueryDict):
                unknown |= {
                    str(k): [ErrorDetail(NOT_BOOLEAN, code="invalid")]
                    for k, v in data.items()
                    if isinstance(self.fields.get(k), serializers.BooleanField) and not isinstance(v, bool)
                }
        try:
            value = super().to_internal_value(data)  # type: ignore[misc]
        except exceptions.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise exceptions.ValidationError({**exc.detail, **unknown}) from None
            raise
        if unknown:
            raise exceptions.ValidationError(unknown)
        return value


class StrictSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    pass


# Registers the schema extension for RejectUnknownFieldsMixin (drf-spectacular finds it on import).
from dispatch_site import schema as _schema  # noqa: E402, F401

BASE64_TEXT = re.compile(r"[A-Za-z0-9+/=]*")


class CreatedCursorPagination(CursorPagination):
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500
    ordering: str | tuple[str, ...] = "-created_at"

    def get_page_size(self, request: Any) -> int:
        """`limit` is an integer from 1 to max_page_size; anything else is a 400, not silently the default."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= self.max_page_size:
            raise exceptions.ValidationError(
                {self.page_size_query_param: [f"must be an integer from 1 to {self.max_page_size}"]}
            )
        return int(raw)

    def decode_cursor(self, request: Any) -> Any:
        """A cursor is DRF's base64 text: anything else (a NUL, a space) is an invalid cursor, 404 as DRF
        answers one it cannot decode. DRF's own decoding drops characters outside the alphabet, so such a
        cursor read as no cursor at all and answered the first page (schemathesis found it, issue 37)."""
        raw = request.query_params.get(self.cursor_query_param)
        if raw is not None and not BASE64_TEXT.fullmatch(raw):
            raise exceptions.NotFound(self.invalid_cursor_message)
        return super().decode_cursor(request)

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        """DRF's page schema says `nullable: true`, which OpenAPI 3.1 (JSON Schema) does not know: a page
        without a next or previous one answers null, so the type says so."""
        paginated = super().get_paginated_response_schema(schema)
        for link in ("next", "previous"):
            field = paginated["properties"][link]
            field.pop("nullable", None)
            field["type"] = ["string", "null"]
        return paginated

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": self.max_page_size}
        return parameters
