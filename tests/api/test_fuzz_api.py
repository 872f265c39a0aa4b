"""Property test over the whole OpenAPI schema: no generated input makes a server error.

schemathesis generates requests (valid and invalid) for every operation from /api/schema/ and sends them
through the WSGI app with a platform token. The cluster is unreachable here, so the one allowed 5xx is the
503 that says so (and records nothing); everything else must be a 2xx or a 4xx.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings

from dispatch_site.wsgi import application

schema = schemathesis.openapi.from_wsgi("/api/schema/", application)


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


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_input_makes_a_server_error(case: Any, platform_user: Any, keep_test_connection: None) -> None:
    response = case.call(headers={"Authorization": f"Token {platform_user[1]}"})
    if response.status_code == 503:
        assert "could not be read" in response.text, response.text
    else:
        assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:500]}"
