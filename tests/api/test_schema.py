"""The OpenAPI schema and the Swagger UI, served from local static files (no CDN)."""

from __future__ import annotations

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
