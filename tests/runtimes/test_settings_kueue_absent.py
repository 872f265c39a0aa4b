"""Site settings on the local control plane without Kueue (issue 37): the cluster can be read and does not
serve kueue.x-k8s.io, so a default queue or a priority class is a 400 (every job would be refused
queue-not-found), not a silent save; settings that do not name Kueue objects are saved as before."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from dispatch_site.models import AuditEvent
from runtimes.models import SiteSettings

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]


def test_kueue_settings_are_refused_where_kueue_is_not_installed(
    platform_api: APIClient, dispatch_on_cluster: str, namespace: str, make_user: Any
) -> None:
    from cluster.kueue import presence

    presence.forget()
    make_user("gina", namespaces=(namespace,))
    body = {
        "kueue_default_queues": {namespace: "dispatch"},
        "kueue_priority_classes": {"*": ["dispatch-low"]},
    }
    response = platform_api.patch("/api/v1/settings", body, format="json")
    assert response.status_code == 400, response.json()
    assert "Kueue is not installed" in response.json()["kueue_default_queues"][namespace][0]
    assert "Kueue is not installed" in response.json()["kueue_priority_classes"]["*"][0]
    assert SiteSettings.load().kueue_default_queues == {}
    assert not AuditEvent.objects.filter(action="settings.update").exists()
    ok = platform_api.patch("/api/v1/settings", {"allow_rank_restart": True}, format="json")
    assert ok.status_code == 200 and ok.json()["warnings"] == []
