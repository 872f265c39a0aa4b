"""The client's address (dispatch_site.client_address): X-Forwarded-For believed only as far as the site's own
proxies (TRUSTED_PROXIES) wrote it; and the setting's parsing."""

from __future__ import annotations

import pytest

from dispatch_site.client_address import client_address
from dispatch_site.config import ConfigError, load_config

PROXIES = ("10.244.0.0/24", "192.0.2.10")


@pytest.mark.parametrize(
    ("remote", "forwarded", "expected"),
    [
        ("203.0.113.9", None, "203.0.113.9"),  # direct, no header
        ("203.0.113.9", "198.51.100.1", "203.0.113.9"),  # direct: its own header is never believed
        ("10.244.0.5", "198.51.100.1", "198.51.100.1"),  # through the ingress
        ("10.244.0.5", "6.6.6.6, 198.51.100.1", "198.51.100.1"),  # what the client wrote itself is left
        ("10.244.0.5", "6.6.6.6, 198.51.100.1, 192.0.2.10", "198.51.100.1"),  # two proxies in a row
        ("10.244.0.5", "10.244.0.7, 10.244.0.6", "10.244.0.7"),  # all hops trusted: the leftmost
        ("10.244.0.5", None, "10.244.0.5"),  # a proxy's own request (a probe)
        ("10.244.0.5", "198.51.100.1:4431", "198.51.100.1"),  # a port is not part of the address
        ("10.244.0.5", "[2001:db8::1]:443", "2001:db8::1"),
        ("::ffff:10.244.0.5", "198.51.100.1", "198.51.100.1"),  # a v4 peer seen through a v6 socket
    ],
)
def test_the_first_address_that_is_not_a_trusted_proxy_is_the_client(
    remote: str, forwarded: str | None, expected: str
) -> None:
    assert client_address(remote, forwarded, PROXIES) == expected


def test_without_trusted_proxies_the_header_is_never_read() -> None:
    assert client_address("10.244.0.5", "198.51.100.1", ()) == "10.244.0.5"


def test_trusted_proxies_come_from_the_environment_as_addresses_or_cidrs() -> None:
    config = load_config({"DEBUG": "1", "TRUSTED_PROXIES": "10.244.0.0/16, 192.0.2.10,fd00::/8"})
    assert config.trusted_proxies == ("10.244.0.0/16", "192.0.2.10/32", "fd00::/8")
    assert load_config({"DEBUG": "1"}).trusted_proxies == ()


def test_a_bad_proxy_entry_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"TRUSTED_PROXIES='10.0.0.0/8,ingress': 'ingress' is not an IP"):
        load_config({"DEBUG": "1", "TRUSTED_PROXIES": "10.0.0.0/8,ingress"})


def test_a_proxy_count_is_refused_with_what_to_set_instead() -> None:
    """A count cannot tell a proxy from a client that bypasses it: NUM_PROXIES (what the example deployment
    set) is refused at start, naming TRUSTED_PROXIES, rather than silently trusting nobody."""
    with pytest.raises(ConfigError, match=r"NUM_PROXIES='1' is no longer read.*TRUSTED_PROXIES"):
        load_config({"DEBUG": "1", "NUM_PROXIES": "1"})
    assert load_config({"DEBUG": "1", "NUM_PROXIES": "0"}).trusted_proxies == ()
