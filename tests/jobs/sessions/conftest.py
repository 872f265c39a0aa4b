"""Fixtures shared by the sessions' tests against the real control plane."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient


@pytest.fixture
def api(submitter: tuple[User, str]) -> APIClient:
    """The REST client of the test's plain user, granted the test's namespace (tests.support.dispatch)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {submitter[1]}")
    return client
