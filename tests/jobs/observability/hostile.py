"""Hostile webhook receivers for the tests of jobs.observability (test_webhook_attacks.py in this process,
test_webhook_queue.py against a real worker): a raw TCP server on 127.0.0.1 (TLS when given a context) that
answers what no polite server would, the answers themselves, and a due delivery nobody has sent yet."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import ssl
import subprocess
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.models import Job, JobEvent, JobState
from jobs.naming import new_job_id
from jobs.observability import webhooks
from jobs.observability.models import WebhookDelivery, WebhookEndpoint


class RawReceiver:
    """A TCP server on 127.0.0.1 (TLS when given a context): `answer(write, stopped)` writes whatever bytes
    it likes after reading the request's head. `stopped` is set when the test ends, so a receiver that drips
    for ever stops then."""

    def __init__(
        self,
        answer: Callable[[Callable[[bytes], None], threading.Event], None],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.tls = tls
        self.stopped = threading.Event()
        self.requests = 0
        self.sent = 0
        receiver = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                if tls is not None:
                    try:
                        sock = tls.wrap_socket(sock, server_side=True)
                    except (ssl.SSLError, OSError):
                        return  # a client that does not trust the certificate hangs up here
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                receiver.requests += 1

                def write(data: bytes) -> None:
                    sock.sendall(data)
                    receiver.sent += len(data)

                with contextlib.suppress(OSError):  # the client hung up: what a bounded sender does
                    answer(write, receiver.stopped)

        socketserver.ThreadingTCPServer.daemon_threads = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.server.server_address[1]}/hooks"

    def close(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()


def pending_delivery(owner: Any, url: str) -> WebhookDelivery:
    """An endpoint and one change of one job for it, fanned out into a due delivery that nobody sent yet.
    Every endpoint is paused during the fan-out, so the in-process task sends nothing at once: the fan-out
    also gives the endpoints an earlier call made a delivery of this job, and those would otherwise be sent
    here, to their receivers, before the test has begun."""
    endpoint, _ = webhooks.endpoint_create(owner=owner, url=url)
    active = list(WebhookEndpoint.objects.filter(active=True).values_list("pk", flat=True))
    WebhookEndpoint.objects.filter(pk__in=active).update(active=False)
    job = Job.objects.create(
        id=new_job_id(),
        owner=owner,
        namespace="team-a",
        runtime_kind="ClusterTrainingRuntime",
        runtime_name="x",
        spec={},
        state=JobState.QUEUED,
    )
    JobEvent.objects.create(
        job=job, attempt=1, kind="transition", from_state="queued", to_state="running", message="running"
    )
    webhooks.fanout()
    WebhookEndpoint.objects.filter(pk__in=active).update(active=True)
    return WebhookDelivery.objects.get(endpoint=endpoint)


BOMB_INFLATED = 1 << 30  # 1 GiB of zeros once inflated, about 1 MB on the wire


def gzip_bomb(write: Callable[[bytes], None], stopped: threading.Event) -> None:
    write(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Encoding: gzip\r\n"
        b"Connection: close\r\n\r\n"
    )
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip stream
    zeros = bytes(1 << 20)
    for _ in range(BOMB_INFLATED >> 20):
        if stopped.is_set():
            return
        write(compressor.compress(zeros))
    write(compressor.flush())


def drip_headers(write: Callable[[bytes], None], stopped: threading.Event) -> None:
    write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
    while not stopped.wait(1.0):
        write(b"a")


def drip_body(write: Callable[[bytes], None], stopped: threading.Event) -> None:
    write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100000\r\n\r\n")
    while not stopped.wait(1.0):
        write(b"a")


@dataclass(frozen=True)
class LocalCA:
    ca: Path  # the CA's certificate: what dispatch is told to trust
    server: ssl.SSLContext  # the receiver's certificate for 127.0.0.1, signed by it


def make_local_ca(d: Path) -> LocalCA:
    """A CA of the test's own in `d` (openssl, as scripts/cluster uses it) and a certificate for 127.0.0.1."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    )
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext",
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(d / "server.pem", d / "server.key")
    return LocalCA(ca=d / "ca.pem", server=server)
