"""The answers every API operation can give, added to the OpenAPI schema in one place.

Views document their own success and domain answers (a 422 refusal, a 409 conflict) with
`extend_schema(responses=...)`. The answers that come from the shared plumbing are the same for every
operation, so they are stated once here, by a drf-spectacular postprocessing hook:

- 400: DRF field errors, for any operation that takes a body or query parameters (a query parameter given
  twice too: dispatch_site.middleware);
- 401: no credentials, or an unknown, expired or revoked token (dispatch_site.auth);
- 403: authenticated but not allowed (the role, a namespace grant, or CSRF for a browser session);
- 404: a path parameter names nothing you may see (or a list's `cursor` is invalid);
- 414: gunicorn's answer to a request line over 4,094 bytes (query or path parameters), an HTML page;
- 429: a throttle (dispatch_site.throttles, every operation) said wait;
- 503: a dependency is down, and the detail names it (dispatch_site.api.exception_handler).

An operation that already documents a code keeps its own body.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension

DETAIL = "Detail"
RULES = "x-dispatch-rules"
FIELD_ERRORS = "FieldErrors"

_SCHEMAS: dict[str, dict[str, Any]] = {
    DETAIL: {
        "type": "object",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
        "description": "An error with one message.",
    },
    FIELD_ERRORS: {
        "type": "object",
        "additionalProperties": True,
        "description": (
            "DRF field errors: each key a field (nested where the body nests) with a list of messages, "
            "or `detail` / `non_field_errors`."
        ),
    },
}

_DESCRIPTIONS = {
    "400": "Invalid input: the errors per field",
    "401": "No credentials, or the token is unknown, expired or revoked",
    "403": "Not allowed: the role or a namespace grant does not cover it (or CSRF for a browser session)",
    "404": "No such object, or not one you may see",
    "414": "The request line is longer than the server reads (gunicorn: 4,094 bytes); an HTML page",
    "429": "Throttled: retry after the Retry-After header's seconds",
    "503": "A dependency (database, broker, Kubernetes API server) is down: the detail names it",
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _common_codes(path: str, operation: dict[str, Any]) -> list[str]:
    parameters = operation.get("parameters", [])
    codes = []
    if "requestBody" in operation or any(p.get("in") == "query" for p in parameters):
        codes.append("400")
    if any(requirement for requirement in operation.get("security", [])):
        codes += ["401", "403"]
    # DRF's cursor paginator answers an invalid `cursor` with a 404 ("Invalid cursor").
    if "{" in path or any(p.get("name") == "cursor" for p in parameters):
        codes.append("404")
    if "{" in path or any(p.get("in") == "query" for p in parameters):
        codes.append("414")
    return [*codes, "429", "503"]


# DRF's CharField refuses NUL characters, and PostgreSQL cannot store or compare them.
NO_NUL = "^[^\\u0000]*$"


def _python_whitespace() -> str:
    """Python's whitespace (str.isspace, what strip() and DRF's trim remove) as a character class body of
    \\u escapes: JSON Schema's `\\s` (ECMA-262) differs from it (it lacks U+001C-U+001F and U+0085, which
    Python strips), so a pattern written with `\\s` lets through what the server then calls blank."""
    spaces = [i for i in range(0x10000) if chr(i).isspace()]
    ranges: list[tuple[int, int]] = []
    for code in spaces:
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1] = (ranges[-1][0], code)
        else:
            ranges.append((code, code))
    return "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges)


# The same, and not only whitespace as Python counts it (a trimmed CharField would then be blank; a command
# would be empty).
NOT_BLANK = f"^[^\\u0000]*[^{_python_whitespace()}\\u0000][^\\u0000]*$"


def _no_nul(schema: Any) -> None:
    """Every free text a client sends (body strings, map values, list items) says: no NUL character."""
    if isinstance(schema, list):
        for item in schema:
            _no_nul(item)
        return
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "string" and not {"pattern", "enum", "format"} & schema.keys():
        schema["pattern"] = NO_NUL
    for key, value in schema.items():
        if key in ("properties", "patternProperties"):
            for sub in value.values():
                _no_nul(sub)
        elif key in ("items", "additionalProperties", "oneOf", "anyOf", "allOf", "schema"):
            _no_nul(value)


def _any_or_null(node: Any) -> None:
    """OpenAPI 3.1 renders a nullable free-form field (a JSONField) as `oneOf: [{}, {type: null}]`, which no
    value can satisfy: null matches both. The empty schema already allows null, so it stays alone."""
    if isinstance(node, dict):
        one_of = node.get("oneOf")
        if isinstance(one_of, list) and {} in one_of and {"type": "null"} in one_of and len(one_of) == 2:
            del node["oneOf"]
        for value in node.values():
            _any_or_null(value)
    elif isinstance(node, list):
        for value in node:
            _any_or_null(value)


# OpenAPI links: the id a create answers is the path parameter of the operations on what it created, so a
# client generator (and schemathesis' stateful phase) can follow a job or a session it just made.
_LINKS: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    # operationId: (answers carrying the id, path parameter, operations taking it)
    "v1_jobs_create": (
        ("202", "422"),
        "job_id",
        ("v1_jobs_retrieve", "v1_jobs_cancel_create", "v1_jobs_logs_retrieve"),
    ),
    "v1_sessions_create": (
        ("200", "202"),
        "session_id",
        ("v1_sessions_retrieve", "v1_sessions_exec_create", "v1_sessions_destroy"),
    ),
}


def _add_links(operation: dict[str, Any]) -> None:
    found = _LINKS.get(str(operation.get("operationId")))
    if found is None:
        return
    codes, parameter, targets = found
    for code in codes:
        response = operation.get("responses", {}).get(code)
        if response is not None:
            response["links"] = {
                target: {"operationId": target, "parameters": {parameter: "$response.body#/id"}}
                for target in targets
            }


def add_common_responses(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    _any_or_null(schemas)
    for name, schema in _SCHEMAS.items():
        schemas.setdefault(name, schema)
    for name, schema in schemas.items():
        schema.update(schema.pop(RULES, {}))
        if name.endswith("Request"):  # COMPONENT_SPLIT_REQUEST: the request side of each serializer
            _no_nul(schema)
    for path, operations in result.get("paths", {}).items():
        for operation in operations.values():
            _no_nul(operation.get("parameters", []))
            for media in operation.get("requestBody", {}).get("content", {}).values():
                _no_nul(media)
            responses = operation.setdefault("responses", {})
            _add_links(operation)
            for code in _common_codes(path, operation):
                if code in responses:
                    continue
                if code == "414":  # answered by gunicorn before Django sees the request
                    content = {"text/html": {"schema": {"type": "string"}}}
                else:
                    body = FIELD_ERRORS if code == "400" else DETAIL
                    content = {"application/json": {"schema": _ref(body)}}
                responses[code] = {"content": content, "description": _DESCRIPTIONS[code]}
    return result


class StrictSerializerExtension(OpenApiSerializerExtension):
    """A request body read by RejectUnknownFieldsMixin rejects unknown keys: say so in the schema."""

    target_class = "dispatch_site.api.RejectUnknownFieldsMixin"
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_basic_serializer(self.target, direction)
        if direction == "request":
            schema["additionalProperties"] = False
            # A rule across fields that validate() enforces, stated by the serializer as JSON Schema; put in
            # place by add_common_responses, after the enum hook (which would rewrite its enums).
            rules = getattr(self.target, "request_schema_rules", None)
            if rules:
                schema[RULES] = rules
        return schema
