"""Throttles counted in the real Redis: login attempts per username and per address, API requests per user;
each answers 429 with Retry-After. (tests/conftest.py gives every test its own counter prefix.)"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

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
    # A forged X-Forwarded-For does not make a new address (no proxy is configured: NUM_PROXIES=0).
    forged = client.post(
        "/login/", {"username": "d", "password": "x"}, REMOTE_ADDR="192.0.2.7", HTTP_X_FORWARDED_FOR="1.2.3.4"
    )
    assert forged.status_code == 429
    assert _login(client, "uma", "pw-uma", "192.0.2.8").status_code == 302  # another address logs in


def test_behind_one_proxy_each_client_has_its_own_address(
    settings: Any, client: Client, plain_user: tuple[User, str]
) -> None:
    """NUM_PROXIES=1 (deploy/: the ingress is one proxy): the address is the proxy's X-Forwarded-For entry,
    so one client's failures do not lock out everyone behind the ingress."""
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
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
