"""Throttles counted in the real Redis: login attempts per username and per address, API requests per user;
each answers 429 with Retry-After. (tests/conftest.py gives every test its own counter prefix.)"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from dispatch_site.models import AuditEvent

pytestmark = pytest.mark.django_db


def _rates(settings: Any, **rates: str | None) -> None:
    settings.THROTTLE_RATES = {"login-user": None, "login-address": None, "api-user": None} | {
        k.replace("_", "-"): v for k, v in rates.items()
    }


def _login(client: Client, username: str, password: str, address: str) -> Any:
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_failed_logins_per_username_lock_out_unknown_addresses_but_never_the_right_password_from_a_known_one(
    settings: Any, client: Client, plain_user: tuple[User, str]
) -> None:
    """The attack (issue 22): anyone could lock `uma` out by sending logins with her name, because every
    attempt counted before the password was checked. Now only failures count, and a stranger's failures never
    reach uma's right password from an address she logged in from before."""
    _rates(settings, login_user="3/m", login_address="100/m")
    assert _login(client, "uma", "pw-uma", "10.1.1.1").status_code == 302  # uma's known address
    client.logout()
    for i in range(10):  # the stranger, from other addresses
        response = _login(client, "uma", "wrong", f"10.0.0.{i}")
        assert response.status_code == (200 if i < 3 else 429), i
    throttled = _login(client, "uma", "pw-uma", "10.0.0.99")  # the right password, from a new address
    assert throttled.status_code == 429
    assert 1 <= int(throttled["Retry-After"]) <= 60
    assert b"Too many login attempts" in throttled.content
    assert "_auth_user_id" not in client.session
    # uma, from her known address, logs in whatever the stranger did.
    assert _login(client, "uma", "pw-uma", "10.1.1.1").status_code == 302
    client.logout()
    # Another username is not affected.
    assert _login(client, "someone-else", "x", "10.0.0.9").status_code == 200


def test_right_passwords_are_never_counted(
    settings: Any, client: Client, plain_user: tuple[User, str]
) -> None:
    _rates(settings, login_user="2/m", login_address="2/m")
    for i in range(6):
        assert _login(client, "uma", "pw-uma", f"10.2.0.{i}").status_code == 302, i
        client.logout()


def test_failed_logins_per_address_are_429_whatever_the_username(
    settings: Any, client: Client, plain_user: tuple[User, str]
) -> None:
    _rates(settings, login_address="3/m")
    for name in ("a", "b", "c"):
        assert _login(client, name, "x", "192.0.2.7").status_code == 200
    throttled = _login(client, "uma", "pw-uma", "192.0.2.7")
    assert throttled.status_code == 429 and int(throttled["Retry-After"]) >= 1
    # A forged X-Forwarded-For does not make a new address (no proxy is configured: TRUSTED_PROXIES empty).
    forged = client.post(
        "/login/", {"username": "d", "password": "x"}, REMOTE_ADDR="192.0.2.7", HTTP_X_FORWARDED_FOR="1.2.3.4"
    )
    assert forged.status_code == 429
    assert _login(client, "uma", "pw-uma", "192.0.2.8").status_code == 302  # another address logs in


def test_behind_a_trusted_proxy_each_client_has_its_own_address(
    settings: Any, client: Client, plain_user: tuple[User, str]
) -> None:
    """TRUSTED_PROXIES (deploy/: the ingress controller's pods): a request whose TCP peer is one of them is
    counted by the address that proxy appended to X-Forwarded-For, so one client's failures do not lock out
    everyone behind the ingress; entries to the left of it are the client's own claims, never believed."""
    settings.TRUSTED_PROXIES = ["10.244.0.0/24"]
    _rates(settings, login_address="2/m", login_user="100/m")
    ingress = "10.244.0.5"

    def through_ingress(username: str, password: str, client_address: str) -> Any:
        return client.post(
            "/login/",
            {"username": username, "password": password},
            REMOTE_ADDR=ingress,
            HTTP_X_FORWARDED_FOR=f"1.2.3.4, {client_address}",  # the first entry is the client's own claim
        )

    for _ in range(2):
        assert through_ingress("x", "bad", "203.0.113.1").status_code == 200
    assert through_ingress("x", "bad", "203.0.113.1").status_code == 429
    assert through_ingress("uma", "pw-uma", "203.0.113.2").status_code == 302


def test_a_client_that_bypasses_the_proxy_cannot_choose_its_address(
    settings: Any, client: Client, plain_user: tuple[User, str]
) -> None:
    """The attack (issue 33): with a proxy count (NUM_PROXIES=1, as deploy/overlays/example set it), a client
    that reached the web pods directly (any pod in the cluster) sent its own X-Forwarded-For, a new address on
    every attempt, and the per-address limit never applied. The proxies are now named (TRUSTED_PROXIES), and
    a client that is not one of them is its own address whatever it sends; DRF's NUM_PROXIES, set here as
    the example deployment set it, changes nothing."""
    settings.TRUSTED_PROXIES = ["10.244.0.0/24"]
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    _rates(settings, login_address="3/m", login_user="100/m")
    direct = "10.8.3.9"  # a training pod, say: not the ingress
    codes = [
        client.post(
            "/login/",
            {"username": f"guess-{i}", "password": "bad"},
            REMOTE_ADDR=direct,
            HTTP_X_FORWARDED_FOR=f"198.51.100.{i}",
        ).status_code
        for i in range(6)
    ]
    assert codes == [200, 200, 200, 429, 429, 429]
    failed = AuditEvent.objects.filter(action="login.fail").values_list("details", flat=True)
    assert {d["address"] for d in failed} == {direct}  # the audit log names the real peer too


@pytest.mark.django_db(transaction=True)
def test_concurrent_wrong_passwords_never_get_more_checks_than_the_limit(settings: Any) -> None:
    """The attack (issue 33): the counters were checked, then read, then written, so wrong passwords sent at
    once all passed the check before any was counted: a guesser with many connections was never limited.
    Each attempt now takes its place on the counters in one atomic step before its password is checked."""
    _rates(settings, login_user="3/m", login_address="100/m")
    User.objects.create_user("ula", password="the-right-password-1")
    attempts = 12
    ready = threading.Barrier(attempts)

    def attempt(i: int) -> int:
        try:
            browser = Client()
            ready.wait(timeout=30)
            return browser.post(
                "/login/", {"username": "ula", "password": f"wrong-{i}"}, REMOTE_ADDR=f"10.9.0.{i}"
            ).status_code
        finally:
            connection.close()

    with ThreadPoolExecutor(attempts) as pool:
        codes = sorted(pool.map(attempt, range(attempts)))
    assert codes == [200] * 3 + [429] * (attempts - 3)  # 3 passwords checked (and refused), the rest not
    assert AuditEvent.objects.filter(action="login.fail", object_id="ula").count() == 3
    lockouts = AuditEvent.objects.filter(action="login.lockout", object_id="ula")
    assert [e.details["counters"] for e in lockouts] == [["username"]]
    # The right password, from an address the user never logged in from, waits like the guesser.
    assert (
        Client()
        .post("/login/", {"username": "ula", "password": "the-right-password-1"}, REMOTE_ADDR="10.9.1.1")
        .status_code
        == 429
    )


def test_api_requests_per_user_are_429_with_retry_after(
    settings: Any, user_api: APIClient, platform_api: APIClient
) -> None:
    _rates(settings, api_user="5/m")
    assert [user_api.get("/api/v1/me").status_code for _ in range(5)] == [200] * 5
    throttled = user_api.get("/api/v1/runtimes")
    assert throttled.status_code == 429
    assert 1 <= int(throttled["Retry-After"]) <= 60
    assert "throttled" in throttled.json()["detail"].lower()
    assert platform_api.get("/api/v1/me").status_code == 200  # counted per user


def test_without_redis_requests_pass_and_are_not_throttled(settings: Any, user_api: APIClient) -> None:
    # Nothing listens on port 1: what a stopped Redis looks like. Throttling fails open (and logs it).
    _rates(settings, api_user="1/m")
    settings.CACHES = {
        **settings.CACHES,
        "throttle": {**settings.CACHES["throttle"], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    assert [user_api.get("/api/v1/me").status_code for _ in range(3)] == [200] * 3


def test_default_rates_are_set_and_the_suite_is_not_throttled_by_accident(settings: Any) -> None:
    from dispatch_site.config import load_config

    config = load_config({"DEBUG": "1"})
    assert (config.login_rate_user, config.login_rate_address, config.api_rate_user) == (
        "10/m",
        "30/m",
        "3000/m",
    )
    assert set(settings.THROTTLE_RATES) == {"login-user", "login-address", "api-user"}


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("THROTTLE_API_USER", "off", None),
        ("THROTTLE_API_USER", "20/hour", "20/h"),
        ("THROTTLE_LOGIN_USER", "5/s", "5/s"),
    ],
)
def test_rates_come_from_the_environment(variable: str, value: str, expected: str | None) -> None:
    from dispatch_site.config import load_config

    config = load_config({"DEBUG": "1", variable: value})
    field = {"THROTTLE_API_USER": "api_rate_user", "THROTTLE_LOGIN_USER": "login_rate_user"}[variable]
    assert getattr(config, field) == expected


@pytest.mark.parametrize("value", ["ten/m", "10/week", "0/m", "10"])
def test_a_bad_rate_is_one_clear_error(value: str) -> None:
    from dispatch_site.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=f"THROTTLE_LOGIN_ADDRESS='{value}' is not a rate"):
        load_config({"DEBUG": "1", "THROTTLE_LOGIN_ADDRESS": value})
