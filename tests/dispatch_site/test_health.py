"""/healthz and /readyz: each dependency reported with its error, never a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client, override_settings


def test_healthz_needs_nothing(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


# The opt-in that shows a direct caller on the host every check (the tests' client calls from 127.0.0.1).
on_the_host = override_settings(READYZ_DETAIL_ADDRESSES=("127.0.0.1",))


@on_the_host
@pytest.mark.django_db
def test_readyz_reports_database_and_redis(client: Client) -> None:
    body = client.get("/readyz").json()
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["redis"]["ok"] is True


@on_the_host
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


@on_the_host
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


REMOTE = "203.0.113.20"  # a caller that is not on the host


@pytest.mark.django_db
def test_readyz_tells_a_remote_anonymous_caller_only_the_status(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        response = client.get("/readyz", REMOTE_ADDR=REMOTE)
    assert response.status_code == 503
    assert response.json() == {"status": "not ready"}
    assert b"ConnectionError" not in response.content and b"127.0.0.1" not in response.content
    assert any(
        "redis is down" in r.getMessage() and "ConnectionError" in r.getMessage() for r in caplog.records
    )


@pytest.mark.django_db
def test_readyz_ready_to_a_remote_caller_is_200_without_details(client: Client) -> None:
    response = client.get("/readyz", REMOTE_ADDR=REMOTE)
    # The Kubernetes check fails outside the cluster tests (unreachable API server), so this is not ready.
    assert response.status_code == 503
    assert set(response.json()) == {"status"}


@pytest.mark.django_db
def test_readyz_gives_details_to_platform_by_token_or_session_not_to_a_plain_user(
    client: Client, platform_user: tuple[object, str], plain_user: tuple[object, str]
) -> None:
    as_platform = client.get("/readyz", REMOTE_ADDR=REMOTE, HTTP_AUTHORIZATION=f"Token {platform_user[1]}")
    assert as_platform.json()["checks"]["database"]["ok"] is True
    as_user = client.get("/readyz", REMOTE_ADDR=REMOTE, HTTP_AUTHORIZATION=f"Bearer {plain_user[1]}")
    assert "checks" not in as_user.json()
    bad_token = client.get("/readyz", REMOTE_ADDR=REMOTE, HTTP_AUTHORIZATION="Token nonsense")
    assert "checks" not in bad_token.json()
    client.login(username="pat", password="pw-pat")
    assert "checks" in client.get("/readyz", REMOTE_ADDR=REMOTE).json()
    client.login(username="uma", password="pw-uma")
    assert "checks" not in client.get("/readyz", REMOTE_ADDR=REMOTE).json()


@pytest.mark.django_db
def test_by_default_no_address_sees_details_not_even_localhost(client: Client) -> None:
    """Safe default (issue 22): READYZ_DETAIL_ADDRESSES is empty unless set; before, 127.0.0.1 and ::1 saw
    every dependency's error."""
    from dispatch_site.config import load_config

    assert load_config({"DEBUG": "false", "SECRET_KEY": "x" * 50}).readyz_detail_addresses == ()
    with override_settings(READYZ_DETAIL_ADDRESSES=load_config({"DEBUG": "1"}).readyz_detail_addresses):
        for address in ("127.0.0.1", "::1"):
            assert set(client.get("/readyz", REMOTE_ADDR=address).json()) == {"status"}


@on_the_host
@pytest.mark.django_db
@pytest.mark.parametrize(
    "header",
    [
        {"HTTP_X_FORWARDED_FOR": "203.0.113.9"},
        {"HTTP_X_REAL_IP": "203.0.113.9"},
        {"HTTP_FORWARDED": "for=203.0.113.9"},
    ],
)
def test_a_same_pod_proxy_does_not_count_as_localhost(client: Client, header: dict[str, str]) -> None:
    """A proxy beside dispatch in the pod connects from 127.0.0.1 for any client: with the opt-in set to
    127.0.0.1, a proxied request still sees only the status."""
    assert "checks" in client.get("/readyz", REMOTE_ADDR="127.0.0.1").json()
    meta: dict[str, Any] = {"REMOTE_ADDR": "127.0.0.1", **header}
    assert set(client.get("/readyz", **meta).json()) == {"status"}
