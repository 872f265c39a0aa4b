"""Site settings on the local control plane without Kueue (issue 37): the cluster can be read and does not
serve Kueue's group, so a default queue or a priority class is a 422 (every job would be refused
queue-not-found), not a silent save; settings that do not name Kueue objects are saved as before.

Kueue's CRDs stay installed on this plane once Kueue ran, so, as tests/jobs/submission/test_kueue_submit.py
does, dispatch asks for a Kueue group the API server does not serve (its real 404 for the group)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from cluster import kueue as cluster_kueue
from dispatch_site.models import AuditEvent
from runtimes.models import SiteSettings

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]


ABSENT_GROUP = "kueue.absent.dispatch.dev"


def test_kueue_settings_are_refused_where_kueue_is_not_installed(
    platform_api: APIClient,
    dispatch_on_cluster: str,
    namespace: str,
    make_user: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster_kueue, "GROUP", ABSENT_GROUP)
    make_user("gina", namespaces=(namespace,))
    body = {
        "kueue_default_queues": {namespace: "dispatch"},
        "kueue_priority_classes": {"*": ["dispatch-low"]},
    }
    response = platform_api.patch("/api/v1/settings", body, format="json")
    assert response.status_code == 422, response.json()
    assert "Kueue is not installed" in response.json()["kueue_default_queues"][namespace][0]
    assert "Kueue is not installed" in response.json()["kueue_priority_classes"]["*"][0]
    assert SiteSettings.load().kueue_default_queues == {}
    assert not AuditEvent.objects.filter(action="settings.update").exists()
    ok = platform_api.patch("/api/v1/settings", {"allow_rank_restart": True}, format="json")
    assert ok.status_code == 200 and ok.json()["warnings"] == []
