"""Property test over the whole OpenAPI schema: every answer is one the schema documents.

schemathesis generates requests (valid and invalid) for every operation from /api/schema/ and sends them
through the WSGI app with a platform token, and again with a plain user's; `call_and_validate` runs every
check schemathesis has (no server error, status code and body as documented, content type, schema-valid input
accepted, schema-violating input rejected ...), with the project's schemathesis.toml (a 422 refusal by the
site's rules counts as accepted input). The cluster is unreachable here, so plan and submit stop at the
documented 503 that names the API server; tests/jobs/submission/test_schema_fuzz.py fuzzes them past
validation against the real one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig

from dispatch_site.wsgi import application
from runtimes.models import SiteSettings

CONFIG = SchemathesisConfig.from_path(Path(__file__).resolve().parents[2] / "schemathesis.toml")
schema = schemathesis.openapi.from_wsgi("/api/schema/", application, config=CONFIG)


@pytest.fixture
def keep_test_connection() -> Iterator[None]:
    """Like Django's test client: the WSGI app must not close the test's database connection (it holds the
    test transaction) at the end of each request."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _call_and_validate(case: Any, token: str) -> None:
    # Each example starts from the default site settings: a PATCH of an earlier one must not decide what a
    # later PATCH may omit (publish_container is required only once publish_via is initContainer).
    SiteSettings.objects.all().delete()
    # Every check but "no 5xx": with the cluster down, the one allowed 5xx is the documented 503 naming it.
    response = case.call_and_validate(
        headers={"Authorization": f"Token {token}"}, excluded_checks=[not_a_server_error]
    )
    if response.status_code >= 500:
        assert response.status_code == 503, response.text
        assert "could not be read" in response.text and "unreachable" in response.text, response.text


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_answer_is_documented(case: Any, platform_user: Any, keep_test_connection: None) -> None:
    _call_and_validate(case, platform_user[1])


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_answer_to_a_plain_user_is_documented(
    case: Any, plain_user: Any, keep_test_connection: None
) -> None:
    """The same as a user without the platform role: what their role skips must still be checked. An outside
    run as such a user found GET /api/v1/tokens?owner= taking a NUL (only the platform role's list read
    `owner`); the schema's own cases (schemathesis' coverage phase) find that at any example count, so
    fewer generated examples than the platform run keep this cheap."""
    _call_and_validate(case, plain_user[1])
