"""The OpenAPI schema and the Swagger UI, served from local static files (no CDN)."""

from __future__ import annotations

import re

import pytest
import yaml
from django.test import Client

pytestmark = pytest.mark.django_db


def test_schema_describes_the_api(client: Client) -> None:
    response = client.get("/api/schema/")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    assert schema["openapi"] == "3.1.0"  # JSON Schema: the rules on map keys are stated (propertyNames)
    for path in (
        "/api/v1/plan",
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}/cancel",
        "/api/v1/runtimes",
        "/api/v1/runtimes/allow-list",
        "/api/v1/settings",
        "/api/v1/audit",
    ):
        assert path in schema["paths"], path
    assert "Idempotency-Key" in str(schema["paths"]["/api/v1/jobs"]["post"]["parameters"])


def test_swagger_ui_loads_from_local_static_files(client: Client) -> None:
    page = client.get("/api/docs/").content.decode()
    assert "swagger-ui" in page
    assert "cdn." not in page and "unpkg" not in page
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert (
        client.get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js").status_code == 200
    )


def test_no_schema_is_unsatisfiable_for_null(client: Client) -> None:
    """A `oneOf` holding the empty schema matches null twice, so a null answer would break a client that
    validates responses (drf-spectacular writes `oneOf: [{}, {type: null}]` for a nullable JSONField)."""
    schema = yaml.safe_load(client.get("/api/schema/").content)
    found: list[str] = []

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            if {} in (node.get("oneOf") or []):
                found.append(where)
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}/{index}")

    walk(schema, "")
    assert found == []


def test_every_operation_with_parameters_documents_gunicorns_414(client: Client) -> None:
    """A request line over 4,094 bytes never reaches Django: gunicorn answers 414 with an HTML page."""
    schema = yaml.safe_load(client.get("/api/schema/").content)
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            takes = "{" in path or any(p.get("in") == "query" for p in operation.get("parameters", []))
            documented = operation["responses"].get("414")
            assert bool(documented) == takes, (method, path)
            if documented:
                assert list(documented["content"]) == ["text/html"]


def test_blank_names_and_commands_are_invalid_by_the_schema_as_by_the_server(client: Client) -> None:
    """The server trims a token name and refuses a command of only whitespace; the schema's patterns say the
    same, so a client validating with the schema is not told a request is fine that will be a 400."""
    schemas = yaml.safe_load(client.get("/api/schema/").content)["components"]["schemas"]
    token_name = schemas["TokenInputRequest"]["properties"]["name"]["pattern"]
    command = schemas["SessionExecRequestRequest"]["properties"]["command"]["oneOf"][0]["pattern"]
    for blank in ("\r\r", "   ", "\t"):
        assert not re.search(token_name, blank) and not re.search(command, blank), repr(blank)
    assert re.search(token_name, " laptop ") and re.search(command, "echo hi")
    assert not re.search(command, "echo \x00")


def test_the_schemas_not_blank_pattern_calls_blank_exactly_what_the_server_strips_to_nothing() -> None:
    """NOT_BLANK (the schema's pattern for names and commands) and Python's strip() agree on every character
    of the Basic Multilingual Plane: with `\\s` the schema let U+001C through while the server answered
    "must not be empty" (schemathesis, issue 37). The pattern spells its class out, so a JSON Schema
    validator (ECMA-262 regular expressions) reads the same class."""
    import re

    from dispatch_site.schema import NOT_BLANK

    pattern = re.compile(NOT_BLANK)
    for code in range(1, 0x10000):
        if 0xD800 <= code <= 0xDFFF:
            continue  # surrogates: not characters a JSON string carries alone
        char = chr(code)
        assert bool(pattern.fullmatch(char)) == bool(char.strip()), hex(code)
        assert bool(pattern.fullmatch(f" {char} ")) == bool(char.strip()), hex(code)
    assert "\\s" not in NOT_BLANK
