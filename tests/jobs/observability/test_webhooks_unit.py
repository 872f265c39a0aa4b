"""Webhooks in one process (no cluster): signatures against the `standardwebhooks` library, who may subscribe
to what, URL rules, and the per-job line at the moment a delivery is claimed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook

from dispatch_site import roles
from jobs.models import Job, JobEvent, JobState
from jobs.naming import new_job_id
from jobs.observability import outbox, signing, webhooks
from jobs.observability.models import DeliveryState, WebhookDelivery
from tests.jobs.observability.conftest import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


def _api(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return api


@pytest.fixture(autouse=True)
def _local_receivers(settings: Any) -> None:
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_RETRY_SCHEDULE = (60.0, 60.0)
    outbox.forget_cached_endpoints()


def test_a_signature_verifies_with_the_standard_library_and_one_of_two_secrets_is_enough() -> None:
    old, new = signing.new_secret(), signing.new_secret()
    body = '{"type":"job.state_changed","data":{}}'
    now = int(datetime.now(UTC).timestamp())
    headers = signing.headers([new, old], "msg_1_2", now, body)
    assert Webhook(new).verify(body, headers) == {"type": "job.state_changed", "data": {}}
    assert Webhook(old).verify(body, headers)
    assert headers["webhook-signature"].count("v1,") == 2


def test_only_the_platform_role_subscribes_to_a_namespace_and_users_see_their_own(make_user: Any) -> None:
    _, uma = make_user("uma", roles.USER, ("team-a",))
    _, bob = make_user("bob", roles.USER, ("team-b",))
    _, pat = make_user("pat", roles.PLATFORM, ("*",))
    hook = {"url": "https://hooks.example.com/dispatch"}
    assert (
        _api(uma).post("/api/v1/webhooks", hook | {"namespace": "team-a"}, format="json").status_code == 403
    )
    mine = _api(uma).post("/api/v1/webhooks", hook, format="json")
    assert mine.status_code == 201 and mine.json()["secret"].startswith("whsec_")
    assert "secret" not in _api(uma).get(f"/api/v1/webhooks/{mine.json()['id']}").json()
    assert _api(bob).get(f"/api/v1/webhooks/{mine.json()['id']}").status_code == 404
    assert _api(bob).get("/api/v1/webhooks").json() == []
    platform = _api(pat).post("/api/v1/webhooks", hook | {"namespace": "team-a"}, format="json")
    assert platform.status_code == 201
    assert {e["id"] for e in _api(pat).get("/api/v1/webhooks").json()} == {
        mine.json()["id"],
        platform.json()["id"],
    }


@pytest.mark.parametrize(
    ("url", "field_error"),
    [
        ("ftp://hooks.example.com/x", "https"),
        ("https://user:pw@hooks.example.com/x", "ASCII host name"),
        ("https://hooks.exämple.com/x", "ASCII host name"),
    ],
)
def test_bad_urls_are_field_errors(make_user: Any, url: str, field_error: str) -> None:
    _, uma = make_user("uma", roles.USER, ("team-a",))
    response = _api(uma).post("/api/v1/webhooks", {"url": url}, format="json")
    assert response.status_code == 400 and field_error in str(response.json()["url"])


def test_private_and_plain_http_addresses_are_refused_unless_allowed(settings: Any) -> None:
    settings.WEBHOOK_ALLOW_HTTP = False
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    assert "https" in webhooks.url_problem("http://hooks.example.com/x", resolve=False)
    assert "private or local" in webhooks.url_problem("https://127.0.0.1:8443/x")
    assert "private or local" in webhooks.url_problem("https://10.0.0.7/x")
    assert "private or local" in webhooks.url_problem("https://[::1]/x")


def test_a_later_message_of_a_job_is_never_sent_while_an_earlier_one_is_pending(make_user: Any) -> None:
    """The claim itself checks the job's line: even a stray task for the second message (a duplicate, a
    resent one) sends nothing while the first is pending. (Fan-out and sweep only enqueue heads, so only this
    direct call reaches the check.)"""
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    receiver = Receiver()
    receiver.plan = lambda n, headers: 500
    try:
        webhooks.endpoint_create(owner=uma, url=receiver.url)
        job = Job.objects.create(
            id=new_job_id(),
            owner=uma,
            namespace="team-a",
            runtime_kind="ClusterTrainingRuntime",
            runtime_name="x",
            spec={},
            state=JobState.QUEUED,
        )
        for new in ("running", "failed"):
            JobEvent.objects.create(
                job=job, attempt=1, kind="transition", from_state="queued", to_state=new, message=new
            )
        webhooks.fanout()  # the first message is tried at once (an in-process task here) and fails
        first, second = WebhookDelivery.objects.order_by("seq")
        assert [r.headers["webhook-id"] for r in receiver.received] == [first.msg_id]
        webhooks.delivery_send(delivery_id=second.pk)
        assert [r.headers["webhook-id"] for r in receiver.received] == [first.msg_id]
        second.refresh_from_db()
        assert second.state == DeliveryState.PENDING and second.attempts == 0
    finally:
        receiver.close()


def test_an_active_user_gets_no_fanout_for_someone_elses_job(make_user: Any) -> None:
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    bob, _ = make_user("bob", roles.USER, ("team-b",))
    receiver = Receiver()
    try:
        webhooks.endpoint_create(owner=uma, url=receiver.url)
        Job.objects.create(
            id=new_job_id(),
            owner=bob,
            namespace="team-b",
            runtime_kind="ClusterTrainingRuntime",
            runtime_name="x",
            spec={},
            state=JobState.PENDING,
        )
        assert webhooks.fanout() == 0 and not receiver.received
    finally:
        receiver.close()


@pytest.mark.parametrize("endpoint_id", ["%C2%B2", "%D9%A3", "1" * 25])
def test_an_endpoint_id_that_is_not_an_ascii_number_is_404_not_500(make_user: Any, endpoint_id: str) -> None:
    """An outside schemathesis run: PATCH /api/v1/webhooks/² answered 500 ("²".isdigit(), then int())."""
    api = _api(make_user("pat", roles.PLATFORM, ("*",))[1])
    for call in (api.get, api.patch, api.delete):
        assert call(f"/api/v1/webhooks/{endpoint_id}").status_code == 404
    assert api.get(f"/api/v1/webhooks/{endpoint_id}/deliveries").status_code == 404
    assert api.post(f"/api/v1/webhooks/{endpoint_id}/rotate-secret").status_code == 404
