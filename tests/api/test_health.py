"""/healthz and /readyz: each dependency reported with its error, never a crash."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client, override_settings


def test_healthz_needs_nothing(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_reports_database_and_redis(client: Client) -> None:
    body = client.get("/readyz").json()
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["redis"]["ok"] is True


@pytest.mark.django_db
def test_readyz_reports_a_stopped_redis_as_down(client: Client) -> None:
    # Nothing listens on port 1: this is what a stopped Redis looks like to the service.
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not ready"
    assert body["checks"]["redis"]["ok"] is False
    assert "ConnectionError" in body["checks"]["redis"]["error"]
    assert body["checks"]["database"]["ok"] is True


@pytest.mark.django_db
def test_readyz_reports_an_unreachable_kubernetes_api(client: Client, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    with override_settings(KUBECONFIG=str(kubeconfig), KUBE_TIMEOUT_SECONDS=2):
        response = client.get("/readyz")
    assert response.status_code == 503
    kube = response.json()["checks"]["kubernetes"]
    assert kube["ok"] is False
    assert "unreachable" in kube["error"]
