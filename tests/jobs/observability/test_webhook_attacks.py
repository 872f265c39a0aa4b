"""Hostile webhook receivers, each a real server on 127.0.0.1 that this test starts (raw sockets, so it can
answer what no polite server would; over plain HTTP and over TLS with a CA the test makes with openssl and
dispatch trusts through WEBHOOK_CA_BUNDLE): a gzip bomb, a receiver that drips a byte a second for ever, a
worker that dies mid-send, two senders of one delivery at once, and one user subscribing too many endpoints.
Deliveries run in this process (the suite's in-process tasks), the same code a worker runs."""

from __future__ import annotations

import contextlib
import gzip
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from dispatch_site import roles
from jobs.observability import outbox, webhook_send, webhooks
from jobs.observability.models import DeliveryState, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tests.jobs.observability.conftest import Receiver
from tests.jobs.observability.hostile import (
    LocalCA,
    RawReceiver,
    drip_body,
    drip_headers,
    gzip_bomb,
    make_local_ca,
    pending_delivery,
)

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 2.0
MARGIN = 1.5


@pytest.fixture(autouse=True)
def _local_receivers(settings: Any) -> None:
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_RETRY_SCHEDULE = (60.0, 60.0)
    settings.WEBHOOK_TIMEOUT_SECONDS = DEADLINE
    outbox.forget_cached_endpoints()


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    """A CA of this test's own (openssl, as scripts/cluster uses it) and a certificate for 127.0.0.1."""
    return make_local_ca(tmp_path_factory.mktemp("webhook-ca"))


@pytest.fixture(params=["http", "https"])
def raw_receiver(
    request: pytest.FixtureRequest, local_ca: LocalCA, settings: Any
) -> Iterator[Callable[..., RawReceiver]]:
    """Each attack twice: over plain HTTP, and over TLS with the test's CA trusted (WEBHOOK_CA_BUNDLE)."""
    made: list[RawReceiver] = []
    tls = local_ca.server if request.param == "https" else None
    settings.WEBHOOK_CA_BUNDLE = str(local_ca.ca)

    def make(answer: Callable[[Callable[[bytes], None], threading.Event], None]) -> RawReceiver:
        made.append(RawReceiver(answer, tls))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


def _send_guarded(delivery_id: int, within: float) -> float:
    """delivery_send in a thread of its own, waited for at most `within` seconds: a sender that never
    returns fails the test instead of hanging it. Returns how long it took."""
    started = time.monotonic()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            webhooks.delivery_send(delivery_id=delivery_id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    elapsed = time.monotonic() - started
    assert not thread.is_alive(), f"the attempt still runs after {elapsed:.1f} s (deadline {DEADLINE} s)"
    assert not errors, errors
    return elapsed


# ---------------------------------------------------------------- a gzip bomb


def test_a_gzip_bomb_is_never_read_nor_inflated(
    make_user: Any, raw_receiver: Callable[..., RawReceiver]
) -> None:
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    receiver = raw_receiver(gzip_bomb)
    delivery = pending_delivery(uma, receiver.url)
    tracemalloc.start()
    try:
        _send_guarded(delivery.pk, 60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The worker's memory did not grow with the bomb (1 GiB inflated); a few MiB is the attempt's own work.
    assert peak < 8 << 20, f"the attempt allocated {peak >> 20} MiB at its peak"
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert (attempt.status_code, attempt.error) == (500, "")
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and delivery.last_status == 500 and delivery.state == DeliveryState.PENDING


BANNER = b"SSH-2.0-OpenSSH_9.2 internal-build-host secret-banner"


def test_the_receivers_answer_never_reaches_the_endpoints_owner(
    make_user: Any, raw_receiver: Callable[..., RawReceiver]
) -> None:
    """An owner who points an endpoint at a service reads back its status only: never what it said (its
    banner, its error page). Otherwise any user could read other services' answers through dispatch."""

    def banner(write: Callable[[bytes], None], stopped: threading.Event) -> None:
        write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        write(BANNER + b"\n" + b"more of the service's answer " * 100)

    uma, token = make_user("uma", roles.USER, ("team-a",))
    delivery = pending_delivery(uma, raw_receiver(banner).url)
    _send_guarded(delivery.pk, 30)
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert attempt.status_code == 502 and b"secret-banner" not in attempt.error.encode()

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    deliveries = api.get(f"/api/v1/webhooks/{delivery.endpoint_id}/deliveries")
    assert deliveries.status_code == 200, deliveries.content
    assert b"502" in deliveries.content and b"secret-banner" not in deliveries.content
    page = Client()
    page.force_login(uma)
    detail = page.get(reverse("dashboard:webhook", args=[delivery.endpoint_id]))
    assert detail.status_code == 200
    assert b"HTTP 502" in detail.content and b"secret-banner" not in detail.content


def test_gzip_is_the_bomb_s_encoding() -> None:
    """The bomb above is what it claims: a gzip stream of zeros (checked on a small one)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    assert gzip.decompress(compressor.compress(bytes(1000)) + compressor.flush()) == bytes(1000)


def test_a_receiver_whose_certificate_is_not_trusted_gets_nothing(
    make_user: Any, local_ca: LocalCA, settings: Any
) -> None:
    """TLS is verified: without the test's CA among the roots (certifi's only), the handshake fails and the
    attempt records why."""
    settings.WEBHOOK_CA_BUNDLE = ""
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    receiver = RawReceiver(
        lambda write, stopped: write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), local_ca.server
    )
    try:
        delivery = pending_delivery(uma, receiver.url)
        _send_guarded(delivery.pk, 30)
    finally:
        receiver.close()
    assert receiver.requests == 0
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert attempt.status_code is None and "certificate" in attempt.error.lower()


# ---------------------------------------------------------------- a receiver that drips


def test_a_receiver_dripping_its_headers_a_byte_a_second_is_cut_off_at_the_deadline(
    make_user: Any, raw_receiver: Callable[..., RawReceiver]
) -> None:
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    receiver = raw_receiver(drip_headers)
    delivery = pending_delivery(uma, receiver.url)
    elapsed = _send_guarded(delivery.pk, DEADLINE + 20)
    assert elapsed < DEADLINE + MARGIN, f"the attempt took {elapsed:.1f} s, its deadline is {DEADLINE} s"
    assert receiver.requests == 1
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert attempt.status_code is None and "timeout" in attempt.error.lower()
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and delivery.state == DeliveryState.PENDING
    assert "timeout" in delivery.last_error.lower()


def test_a_receiver_dripping_its_body_is_not_waited_for(
    make_user: Any, raw_receiver: Callable[..., RawReceiver]
) -> None:
    """The status line is the answer: a body promised 100 kB long and sent a byte a second is never read."""
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    receiver = raw_receiver(drip_body)
    delivery = pending_delivery(uma, receiver.url)
    elapsed = _send_guarded(delivery.pk, DEADLINE + 20)
    assert elapsed < DEADLINE, f"the attempt took {elapsed:.1f} s: it waited on the body"
    assert receiver.requests == 1
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert (attempt.status_code, attempt.error) == (500, "")
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and delivery.state == DeliveryState.PENDING


# ---------------------------------------------------------------- a worker that dies mid-send


class WorkerKilled(BaseException):
    """What a worker's process dying (OOM-killed, SIGKILL) looks like from inside the attempt: nothing after
    it runs. A fake: the real parts cannot be made to die at this exact point on demand."""


def _crash_after_sending(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake: the real POST reaches the real receiver, then the worker 'dies' before it records the
    outcome."""
    real_post = webhook_send.post

    def post_then_die(*args: Any, **kwargs: Any) -> Any:
        real_post(*args, **kwargs)
        raise WorkerKilled

    monkeypatch.setattr(webhook_send, "post", post_then_die)


def test_an_attempt_during_which_the_worker_died_counts_and_the_schedule_goes_on(
    make_user: Any, receiver: Receiver, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    delivery = pending_delivery(uma, receiver.url)
    _crash_after_sending(monkeypatch)
    before = timezone.now()
    with pytest.raises(WorkerKilled):
        webhooks.delivery_send(delivery_id=delivery.pk)
    assert len(receiver.received) == 1
    delivery.refresh_from_db()
    # The attempt was recorded before the POST: it counts, and the next one is due on the schedule.
    assert delivery.attempts == 1
    assert list(WebhookAttempt.objects.filter(delivery=delivery).values_list("number", flat=True)) == [1]
    assert delivery.next_attempt_at >= before + timedelta(seconds=60)
    assert delivery.state == DeliveryState.PENDING

    # Time passes (moved, as it would): the claim of the dead worker expires and the retry is due.
    monkeypatch.undo()
    _local = {"claim_until": timezone.now() - timedelta(1), "next_attempt_at": timezone.now()}
    WebhookDelivery.objects.filter(pk=delivery.pk).update(**_local)
    webhooks.delivery_send(delivery_id=delivery.pk)
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.DELIVERED and delivery.attempts == 2
    assert len(receiver.received) == 2


def test_a_worker_dying_on_every_attempt_still_disables_the_endpoint_after_the_schedule(
    make_user: Any, receiver: Receiver, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.WEBHOOK_RETRY_SCHEDULE = (60.0,)  # two attempts
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    delivery = pending_delivery(uma, receiver.url)
    _crash_after_sending(monkeypatch)
    for _ in range(3):
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            claim_until=timezone.now() - timedelta(1), next_attempt_at=timezone.now()
        )
        with contextlib.suppress(WorkerKilled):
            webhooks.delivery_send(delivery_id=delivery.pk)
    # Two attempts reached the receiver; the third claim found the schedule spent and sent nothing.
    assert len(receiver.received) == 2
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.FAILED and delivery.attempts == 2
    endpoint = WebhookEndpoint.objects.get(pk=delivery.endpoint_id)
    assert not endpoint.active and "failed 2 attempts" in endpoint.disabled_reason


def test_two_senders_of_one_delivery_at_once_send_it_once(make_user: Any, receiver: Receiver) -> None:
    """The claim is a compare-and-set: a duplicated task message runs beside the first, and only one POSTs.
    The receiver is slow, so both are inside delivery_send at the same time."""
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    delivery = pending_delivery(uma, receiver.url)

    def slow(n: int, headers: dict[str, str]) -> int:
        time.sleep(0.5)
        return 200

    receiver.plan = slow
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def send() -> None:
        try:
            start.wait()
            webhooks.delivery_send(delivery_id=delivery.pk)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert len(receiver.received) == 1
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.DELIVERED and delivery.attempts == 1
    assert WebhookAttempt.objects.filter(delivery=delivery).count() == 1


# ---------------------------------------------------------------- too many endpoints


def test_one_endpoint_more_than_the_cap_is_refused_naming_the_limit(make_user: Any, settings: Any) -> None:
    settings.WEBHOOK_ENDPOINTS_PER_USER = 3
    _, token = make_user("uma", roles.USER, ("team-a",))
    _, other = make_user("bob", roles.USER, ("team-b",))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    for n in range(3):
        created = api.post("/api/v1/webhooks", {"url": f"https://hooks.example.com/{n}"}, format="json")
        assert created.status_code == 201, created.content
    refused = api.post("/api/v1/webhooks", {"url": "https://hooks.example.com/4"}, format="json")
    assert refused.status_code == 409  # a conflict with what exists; the request itself is valid
    message = refused.json()["detail"]
    assert "you have 3 webhook endpoints" in message and "WEBHOOK_ENDPOINTS_PER_USER=3" in message
    assert WebhookEndpoint.objects.filter(owner__username="uma").count() == 3
    # Another user's endpoints are theirs to count.
    api.credentials(HTTP_AUTHORIZATION=f"Token {other}")
    theirs = api.post("/api/v1/webhooks", {"url": "https://hooks.example.com/b"}, format="json")
    assert theirs.status_code == 201
    # Deleting one makes room.
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    first = WebhookEndpoint.objects.filter(owner__username="uma").first()
    assert first is not None
    assert api.delete(f"/api/v1/webhooks/{first.pk}").status_code == 204
    again = api.post("/api/v1/webhooks", {"url": "https://hooks.example.com/5"}, format="json")
    assert again.status_code == 201


def test_the_webhooks_page_refuses_one_endpoint_more_than_the_cap_too(make_user: Any, settings: Any) -> None:
    """The page's form (request.user is a lazy object there) says the same as the API."""
    settings.WEBHOOK_ENDPOINTS_PER_USER = 1
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    page = Client()
    page.force_login(uma)
    url = reverse("dashboard:webhooks")
    assert page.post(url, {"url": "https://hooks.example.com/1"}).status_code in (200, 302)
    refused = page.post(url, {"url": "https://hooks.example.com/2"})
    assert refused.status_code == 400 and "WEBHOOK_ENDPOINTS_PER_USER=1" in refused.content.decode()
    assert WebhookEndpoint.objects.filter(owner=uma).count() == 1
