"""schemathesis hooks for this API, loaded by schemathesis.toml (`hooks`): the CLI and the suite share them.

One rule of a job body crosses fields, which JSON Schema cannot state: a resource request must not exceed
the limit of the same resource (Kubernetes refuses such a pod; the API answers 400 before anything is
created, and the schema says so in `ResourceRequirements`' description). Generated bodies keep to it, so a
body that breaks it is never counted as "schema-valid data rejected".
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import schemathesis

from jobs.spec import parse_quantity


def _requests_within_limits(resources: Any) -> bool:
    if not isinstance(resources, dict):
        return True
    requests, limits = resources.get("requests"), resources.get("limits")
    if not isinstance(requests, dict) or not isinstance(limits, dict):
        return True
    for name, request in requests.items():
        if name not in limits:
            continue
        try:
            if parse_quantity(str(request)) > parse_quantity(str(limits[name])):
                return False
        except (ValueError, ArithmeticError):
            continue  # not a quantity: the schema's own rules decide
    return True


@schemathesis.hook
def filter_body(context: Any, body: Any) -> bool:
    """Keep generated job and session bodies within the request <= limit rule."""
    if isinstance(body, dict):
        return _requests_within_limits(body.get("resources_per_node"))
    return True


@schemathesis.hook
def filter_query(context: Any, query: Any) -> bool:
    """GET /api/v1/usage: `since` must not be after `until` (today when not given), which JSON Schema cannot
    state; the API answers 400 naming `since`."""
    if not isinstance(query, dict) or "since" not in query:  # only the usage query has `since`
        return True
    try:
        since = date.fromisoformat(str(query["since"]))
        until = date.fromisoformat(str(query["until"])) if "until" in query else datetime.now(UTC).date()
    except ValueError:
        return True  # not a date: the schema's own rules decide
    return since <= until
