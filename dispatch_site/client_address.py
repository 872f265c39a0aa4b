"""Who is calling: the client's address, `X-Forwarded-For` believed only as far as trusted proxies wrote it.

A proxy appends the address of the peer it received the request from; everything to the left of that entry
is whatever the peer sent, which a client can write freely. So the address is found by walking from the one
peer nobody can forge (the TCP peer, REMOTE_ADDR) to the left through `X-Forwarded-For`, as long as each hop
is one of the site's proxies (TRUSTED_PROXIES: addresses or CIDRs): the first address that is not a trusted
proxy is the client. A client that reaches dispatch directly (not one of the proxies) is its own address,
whatever `X-Forwarded-For` it sends; this is what nginx's `real_ip_recursive` and Go's `realclientip` do.

A count of proxies (DRF's NUM_PROXIES) cannot tell a direct client from a proxy: with one proxy configured,
a client that bypasses it (from inside the cluster, say) chooses its own address by sending one entry.
django-ipware matches proxies by string prefix and judges only the header, never the peer that sent it, so it
has the same hole; the walk below is a few lines of the standard library's `ipaddress`. Pure."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from functools import lru_cache

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class BadProxy(ValueError):
    pass


# Headers a proxy adds (WSGI environ / request.META names). A request carrying any of them came through a
# proxy, so its TCP peer (REMOTE_ADDR) is the proxy's address, never the caller's: /readyz and /metrics never
# count such a request as coming from the address they trust.
PROXY_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP", "HTTP_FORWARDED")


def proxied(meta: object) -> bool:
    """Whether a request's META (or WSGI environ) says it came through a proxy."""
    return any(header in meta for header in PROXY_HEADERS)  # type: ignore[operator]


def parse_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """Addresses and CIDRs ("10.0.0.0/8", "192.0.2.7", "fd00::/8") as networks; BadProxy names a bad one."""
    networks = []
    for entry in entries:
        text = entry.strip()
        if not text:
            continue
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise BadProxy(f"{text!r} is not an IP address or a CIDR (e.g. 10.0.0.0/8)") from None
    return tuple(networks)


@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    return parse_networks(entries)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    value = text.strip()
    if value.startswith("[") and "]" in value:  # [v6]:port
        value = value[1 : value.index("]")]
    elif value.count(":") == 1:  # v4:port
        value = value.partition(":")[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address, proxies: Sequence[Network]) -> bool:
    return any(address.version == net.version and address in net for net in proxies)


def client_address(remote_addr: str, forwarded_for: str | None, trusted_proxies: Sequence[str]) -> str:
    """The client's address: REMOTE_ADDR unless it is a trusted proxy; then, from the right of
    `X-Forwarded-For`, the first entry that is not a trusted proxy (an entry that is not an address counts as
    not trusted: the proxy that wrote it is the last hop known). When every hop is a trusted proxy, the
    leftmost one."""
    proxies = _networks(tuple(trusted_proxies))
    peer = _address(remote_addr or "")
    if peer is None or not proxies or not _trusted(peer, proxies) or not forwarded_for:
        return remote_addr or ""
    client = str(peer)
    for entry in reversed(forwarded_for.split(",")):
        hop = _address(entry)
        if hop is None:
            return entry.strip() or client
        client = str(hop)
        if not _trusted(hop, proxies):
            return client
    return client
