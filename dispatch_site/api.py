"""API plumbing shared by every endpoint: the exception handler and a cursor paginator."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django import db
from django.core.exceptions import ValidationError as DjangoValidationError
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


UNKNOWN_FIELD = "unknown field"


class RejectUnknownFieldsMixin:
    """Rejects keys the serializer does not declare, each as a field error "unknown field": a typo in a
    request must not be silently ignored."""

    fields: Any

    def to_internal_value(self, data: Any) -> Any:
        unknown: dict[str, list[ErrorDetail]] = {}
        if isinstance(data, Mapping):
            unknown = {
                str(k): [ErrorDetail(UNKNOWN_FIELD, code="unknown")] for k in data if k not in self.fields
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


class CreatedCursorPagination(CursorPagination):
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500
    ordering = "-created_at"
