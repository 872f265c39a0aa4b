"""Plan and submit fuzzed past validation against the real API server, every answer checked by the schema.

tests/dispatch_site/test_fuzz_api.py sees an unreachable cluster, so plan and submit stop at a 503 there.
Here the generated requests that the schema calls valid name the test's namespace and an allow-listed
TrainingRuntime that exists, so `POST /api/v1/plan` reads the runtime from the API server and answers its
verdict, and `POST /api/v1/jobs` accepts (202) or refuses (422, every reason); schema-violating requests
must still be rejected. `call_and_validate` runs every schemathesis check on each answer (project
schemathesis.toml). PATCH /api/v1/settings too: its Kueue entries are read in the cluster."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode

from dispatch_site.wsgi import application
from runtimes.models import SiteSettings
from tests.dispatch_site.test_fuzz_api import CONFIG
from tests.dispatch_site.test_fuzz_api import keep_test_connection as keep_test_connection

pytestmark = pytest.mark.cluster

_api = schemathesis.openapi.from_wsgi("/api/schema/", application, config=CONFIG)
schema = _api.include(path_regex=r"^/api/v1/(plan|jobs)$", method="POST")
settings_schema = _api.include(path="/api/v1/settings", method="PATCH")


@pytest.fixture
def runtime_in_namespace(namespaced_runtime: Callable[..., dict[str, Any]], namespace: str) -> Iterator[str]:
    namespaced_runtime("fuzz-runtime")
    yield namespace


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_plan_and_submit_answers_match_the_schema(
    case: Any, runtime_in_namespace: str, platform_user: Any, keep_test_connection: None
) -> None:
    if case.meta.generation.mode == GenerationMode.POSITIVE and isinstance(case.body, dict):
        # A valid body about something that exists: past validation to the rules and the cluster.
        case.body["namespace"] = runtime_in_namespace
        case.body["runtime"] = {"kind": "TrainingRuntime", "name": "fuzz-runtime"}
    response = case.call_and_validate(headers={"Authorization": f"Token {platform_user[1]}"})
    assert response.status_code < 500, response.text


@pytest.mark.django_db
@settings_schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_settings_answers_match_the_schema_where_the_cluster_is_read(
    case: Any, namespace: str, dispatch_on_cluster: str, platform_user: Any, keep_test_connection: None
) -> None:
    """PATCH /api/v1/settings against the real API server, which dispatch reads for the Kueue entries: a
    schema-valid default queue or priority class that the cluster refutes (no such LocalQueue, or Kueue not
    installed) is a documented 422, never a 400 (an outside run saw 400s counted as valid data rejected)."""
    SiteSettings.objects.all().delete()  # each example from the defaults, as in test_fuzz_api.py
    response = case.call_and_validate(headers={"Authorization": f"Token {platform_user[1]}"})
    assert response.status_code < 500, response.text
