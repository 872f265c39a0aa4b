"""One webhook POST, bounded whatever the receiver does: a worker's thread and memory are never the
receiver's to keep.

- A total deadline (WEBHOOK_TIMEOUT_SECONDS) for the whole attempt: connecting, sending, the status line and
  headers. A receiver that drips one byte a second is cut off at the
  deadline, where a per-read timeout (requests, urllib3) would wait for ever. aiohttp (already installed: the
  Kubernetes client depends on it) reads with non-blocking sockets, so asyncio's timeout cancels the attempt
  wherever it waits; aiohttp also caps the status line and each header at 8 KiB.
- The body of the answer is never read (nor decompressed: auto_decompress=False): the status is the answer,
  and the connection is closed. A gzip bomb costs nothing, and no receiver's words reach the endpoint's
  owner: shown to them, an answer would make dispatch a port scanner and banner grabber.
- No redirects, no proxy from the environment, TLS verified against certifi's roots (what requests used), or
  the PEM roots of WEBHOOK_CA_BUNDLE (receivers behind a private CA; the tests' own CA).
- Only public addresses (unless WEBHOOK_ALLOW_PRIVATE_ADDRESSES): the name is resolved by the connection
  itself (CheckedResolver), inside the deadline, and only the addresses that pass address_allowed are
  connected to. A check before the connection would not do: the name could resolve elsewhere a moment later
  (DNS rebinding). A literal IP in the URL is checked the same way.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import urlparse

import aiohttp
import aiohttp.abc
import certifi

ERROR_CHARS = 500
CONNECT_SECONDS = 3.0


@dataclass(frozen=True)
class AttemptResult:
    status: int | None
    latency_ms: int
    error: str

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def address_allowed(address: str) -> bool:
    """May dispatch connect to this address? Only a global unicast one: never private, loopback, link-local
    (cloud metadata), shared (100.64/10), documentation, reserved or multicast ranges, and an IPv4 address
    written as IPv6 (::ffff:10.0.0.1) is judged as the IPv4 address it is."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return bool(ip.is_global and not ip.is_multicast)


class PrivateAddress(OSError):
    """The receiver's host resolves only to addresses dispatch does not connect to (errno and strerror set:
    aiohttp's connection error shows the strerror)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EACCES, message)


class CheckedResolver(aiohttp.abc.AbstractResolver):
    """The connection's own resolver: the host's addresses, keeping only those address_allowed accepts."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[Any]:
        found = await self._inner.resolve(host, port, family)
        kept = [entry for entry in found if address_allowed(str(entry["host"]))]
        if not kept:
            addresses = ", ".join(sorted({str(entry["host"]) for entry in found}))
            raise PrivateAddress(f"{host} resolves to {addresses}: no public address to connect to")
        return kept

    async def close(self) -> None:
        await self._inner.close()


@cache
def _tls(cafile: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile or certifi.where())


async def _post_async(
    url: str, body: bytes, headers: dict[str, str], deadline: float, cafile: str, allow_private: bool
) -> tuple[int, str]:
    timeout = aiohttp.ClientTimeout(total=deadline, connect=min(CONNECT_SECONDS, deadline))
    resolver = None if allow_private else CheckedResolver()
    connector = aiohttp.TCPConnector(ssl=_tls(cafile), force_close=True, limit=1, resolver=resolver)
    async with (
        aiohttp.ClientSession(
            timeout=timeout, connector=connector, auto_decompress=False, trust_env=False
        ) as session,
        session.post(url, data=body, headers=headers, allow_redirects=False) as response,
    ):
        # The status is the whole answer: the body is never read, kept or shown. Shown to the endpoint's
        # owner, it would let any user read what a service answers (a port scanner and banner grabber
        # through dispatch); read, a gzip bomb or a drip could hold the worker.
        response.close()
        return response.status, ""


async def _bounded(
    url: str, body: bytes, headers: dict[str, str], deadline: float, cafile: str, allow_private: bool
) -> tuple[int, str]:
    # aiohttp's total timeout covers the request; this one also covers the session's set-up and teardown.
    async with asyncio.timeout(deadline):
        return await _post_async(url, body, headers, deadline, cafile, allow_private)


def _literal_problem(url: str) -> str:
    """A literal IP host that is not public (aiohttp connects to a literal without asking the resolver)."""
    host = urlparse(url).hostname or ""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return ""  # a name: the resolver judges its addresses
    return "" if address_allowed(host) else f"{host} is not a public address"


def post(
    url: str,
    body: str,
    headers: dict[str, str],
    *,
    deadline: float,
    cafile: str = "",
    allow_private: bool = False,
) -> AttemptResult:
    """POST `body` to `url` within `deadline` seconds in all; the answer's status (its body is never read), or
    why there was none. Never raises for what the receiver does. TLS is verified
    against `cafile` (PEM roots), certifi's roots when empty."""
    started = time.monotonic()

    def latency() -> int:
        return int((time.monotonic() - started) * 1000)

    literal = "" if allow_private else _literal_problem(url)
    if literal:
        return AttemptResult(status=None, latency_ms=0, error=f"not sent: {literal}")
    try:
        status, error = asyncio.run(_bounded(url, body.encode(), headers, deadline, cafile, allow_private))
    except TimeoutError:
        return AttemptResult(
            status=None,
            latency_ms=latency(),
            error=f"timeout: no complete answer within {deadline:g} s (WEBHOOK_TIMEOUT_SECONDS, the whole "
            "attempt's budget)",
        )
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        return AttemptResult(status=None, latency_ms=latency(), error=error)
    return AttemptResult(status=status, latency_ms=latency(), error=error)
