"""Webhooks reach public addresses only, judged where the connection is made (webhook_send): the name is
resolved by the connection's own resolver and only public addresses are connected to, so a name that passed a
check and then resolves to a private address (DNS rebinding) still never reaches it. The receiver is a real
TCP server on 127.0.0.1; `localhost` stands in for a name that resolves privately."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from dispatch_site import roles
from jobs.observability import webhooks
from jobs.observability.models import WebhookAttempt
from jobs.observability.webhook_send import address_allowed, post
from tests.jobs.observability.hostile import RawReceiver, pending_delivery


def _ok(write: Callable[[bytes], None], stopped: threading.Event) -> None:
    write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("8.8.8.8", True),
        ("2001:4860:4860::8888", True),
        ("::ffff:8.8.8.8", True),  # an IPv4 address written as IPv6: judged as itself
        ("10.0.0.7", False),
        ("127.0.0.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # shared (carrier-grade NAT): not global
        ("192.0.2.1", False),  # documentation
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fc00::1", False),
        ("fe80::1%eth0", False),
        ("::ffff:10.0.0.7", False),  # a private IPv4 address dressed as IPv6
        ("::ffff:127.0.0.1", False),
        ("not-an-address", False),
    ],
)
def test_only_global_unicast_addresses_are_allowed(address: str, allowed: bool) -> None:
    assert address_allowed(address) is allowed


def test_a_name_resolving_to_a_private_address_is_never_connected_to(settings: Any) -> None:
    settings.WEBHOOK_ALLOW_HTTP = True
    receiver = RawReceiver(_ok)
    try:
        port = receiver.server.server_address[1]
        # The check without resolving passes (as at save time for a name that resolved publicly then).
        assert webhooks.url_problem(f"http://localhost:{port}/hook", resolve=False) == ""
        refused = post(f"http://localhost:{port}/hook", "{}", {}, deadline=5)
        assert refused.status is None and "no public address" in refused.error, refused
        literal = post(f"http://127.0.0.1:{port}/hook", "{}", {}, deadline=5)
        assert literal.status is None and "not a public address" in literal.error, literal
        assert receiver.requests == 0  # nothing reached it
        # Where the platform allows private addresses (tests, a private receiver), the same POST arrives.
        allowed = post(f"http://localhost:{port}/hook", "{}", {}, deadline=5, allow_private=True)
        assert allowed.status == 204 and receiver.requests == 1, allowed
    finally:
        receiver.close()


@pytest.mark.django_db
def test_a_delivery_to_a_name_that_now_resolves_privately_is_recorded_not_sent(
    settings: Any, make_user: Any
) -> None:
    """Saved while allowed (as a name that resolved publicly then), sent after it resolves privately: the
    attempt is recorded with the reason, and the receiver never sees a connection."""
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    receiver = RawReceiver(_ok)
    try:
        owner, _ = make_user("uma", roles.USER, ("team-a",))
        delivery = pending_delivery(owner, f"http://localhost:{receiver.server.server_address[1]}/hook")
        settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
        webhooks.delivery_send(delivery_id=delivery.pk)
        [attempt] = WebhookAttempt.objects.filter(delivery=delivery)
        assert attempt.status_code is None and "no public address" in attempt.error, attempt.error
        assert receiver.requests == 0
    finally:
        receiver.close()
