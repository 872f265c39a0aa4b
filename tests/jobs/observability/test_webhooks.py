"""Status webhooks end to end: a real receiver (an HTTP server on 127.0.0.1) verifies every message with the
`standardwebhooks` library, as a subscriber's code would; dispatch runs as processes (gunicorn, a Celery
worker, beat, the supervisor, its own Redis: conftest.py) on the local control plane. Retries are a second
apart here (WEBHOOK_RETRY_SCHEDULE=1,1,1,1: five attempts)."""

from __future__ import annotations

import collections
import json
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dispatch_site import roles
from dispatch_site.services import user_create
from jobs.models import Job, JobState
from jobs.observability import cursors
from jobs.observability.models import WebhookEndpoint
from runtimes.models import AllowListEntry
from tests.jobs.observability.conftest import Receiver, Stack, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def user(namespace: str) -> dict[str, Any]:
    AllowListEntry.objects.get_or_create(
        kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind", defaults={"for_jobs": True}
    )
    name = f"w-{uuid.uuid4().hex[:6]}"
    account, token = user_create(username=name, role=roles.USER, namespaces=[namespace])
    return {"user": account, "token": token, "namespace": namespace}


def _owner_id(endpoint: dict[str, Any]) -> int:
    return int(WebhookEndpoint.objects.values_list("owner_id", flat=True).get(pk=endpoint["id"]))


def _job(namespace: str, env: dict[str, str] | None = None, runtime: str = "dispatch-kind") -> dict[str, Any]:
    return {
        "runtime": {"kind": "ClusterTrainingRuntime", "name": runtime},
        "namespace": namespace,
        "image": "localhost/trainer:v1",
        "num_nodes": 1,
        "env": env or {},
    }


def _subscribe(stack: Stack, token: str, receiver: Receiver, **extra: Any) -> dict[str, Any]:
    created: dict[str, Any] = stack.post(
        "/api/v1/webhooks", token, {"url": receiver.url, **extra}, expect=(201,)
    )
    assert created["secret"].startswith("whsec_")
    return created


def _verified(receiver: Receiver, secret: str) -> list[dict[str, Any]]:
    """Every accepted message, verified as a receiver verifies it (headers + body + secret)."""
    out = []
    for message in receiver.accepted():
        out.append(Webhook(secret).verify(message.body, message.headers))
    return out


def test_a_receiver_answering_500_three_times_gets_the_message_on_the_fourth_attempt_then_the_rest_in_order(
    stack: Stack, receiver: Receiver, user: dict[str, Any]
) -> None:
    receiver.plan = lambda n, headers: 500 if n < 3 else 200
    endpoint = _subscribe(stack, user["token"], receiver)
    job = stack.post("/api/v1/jobs", user["token"], _job(user["namespace"], {"KWOK_RUN_DURATION": "1s"}))[
        "id"
    ]
    wait_until(lambda: Job.objects.get(pk=job).state == JobState.SUCCEEDED, 120, "the job succeeds", stack)

    def all_delivered() -> bool:
        payloads = receiver.payloads()
        return bool(payloads) and payloads[-1]["data"]["to_state"] == "succeeded"

    wait_until(all_delivered, 60, "every change delivered", stack)
    first_id = receiver.received[0].headers["webhook-id"]
    # The first message: three 500s, then accepted; one webhook-id throughout (a fresh timestamp each time).
    assert [(r.headers["webhook-id"], r.status) for r in receiver.received[:4]] == [
        (first_id, 500),
        (first_id, 500),
        (first_id, 500),
        (first_id, 200),
    ]
    messages = _verified(receiver, endpoint["secret"])
    states = [
        (m["data"]["from_state"], m["data"]["to_state"]) for m in messages if m["type"] == "job.state_changed"
    ]
    assert states[0] == ("", "pending") and states[-1][1] == "succeeded"
    assert "queued" in [to for _, to in states]  # and "running" when a cycle saw it run (a 3 s run: usually)
    # The cursors are sealed for the endpoint's owner (the stack shares this checkout's SECRET_KEY).
    places = [cursors.unseal(m["data"]["cursor"], _owner_id(endpoint)) for m in messages]
    assert places == sorted(places), "in the order the changes happened"
    assert {m["data"]["job"] for m in messages} == {job}
    # Nothing was sent before the first message got through (the job's line waited behind it).
    assert {r.headers["webhook-id"] for r in receiver.received[:4]} == {first_id}
    # Every attempt is recorded with its status code and latency (the API; the page shows the same rows).
    deliveries = stack.get(f"/api/v1/webhooks/{endpoint['id']}/deliveries", user["token"])
    first = next(d for d in deliveries if d["msg_id"] == first_id)
    assert first["state"] == "delivered" and first["attempts"] == 4
    assert [a["status_code"] for a in first["attempt_log"]] == [500, 500, 500, 200]
    assert all(isinstance(a["latency_ms"], int) for a in first["attempt_log"])
    assert first["last_status"] == 200
    assert all(d["state"] == "delivered" for d in deliveries)


def test_a_rotated_secret_signs_beside_the_old_one_until_the_grace_period_ends(
    stack: Stack, receiver: Receiver, user: dict[str, Any]
) -> None:
    endpoint = _subscribe(stack, user["token"], receiver)
    old = endpoint["secret"]
    refused = _job(user["namespace"], runtime="nobody-allowed-this")
    stack.post("/api/v1/jobs", user["token"], refused, expect=(422,))
    wait_until(lambda: len(receiver.accepted()) == 1, 30, "the first message", stack)
    Webhook(old).verify(receiver.accepted()[0].body, receiver.accepted()[0].headers)

    rotated = stack.post(f"/api/v1/webhooks/{endpoint['id']}/rotate-secret", user["token"])
    new = rotated["secret"]
    assert new != old and new.startswith("whsec_")
    stack.post("/api/v1/jobs", user["token"], refused, expect=(422,))
    wait_until(lambda: len(receiver.accepted()) == 2, 30, "the second message", stack)
    during = receiver.accepted()[1]
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    Webhook(new).verify(during.body, during.headers)  # the receiver switched ...
    Webhook(old).verify(during.body, during.headers)  # ... or not yet: both work during the grace period

    # The grace period ends (its end moved to the past, as time would): only the new secret signs.
    WebhookEndpoint.objects.filter(pk=endpoint["id"]).update(
        previous_secret_until=timezone.now() - timedelta(1)
    )
    stack.post("/api/v1/jobs", user["token"], refused, expect=(422,))
    wait_until(lambda: len(receiver.accepted()) == 3, 30, "the third message", stack)
    after = receiver.accepted()[2]
    Webhook(new).verify(after.body, after.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(after.body, after.headers)


def test_each_jobs_events_arrive_in_order_while_a_receiver_keeps_failing_some(
    stack: Stack, receiver: Receiver, user: dict[str, Any]
) -> None:
    """Three jobs at once; the receiver refuses every other request. Each job's messages are accepted in the
    order of its changes, and no message of a job is accepted before an earlier one of the same job."""
    receiver.plan = lambda n, headers: 503 if n % 2 == 0 else 200
    endpoint = _subscribe(stack, user["token"], receiver)
    jobs = [
        stack.post("/api/v1/jobs", user["token"], _job(user["namespace"], {"KWOK_RUN_DURATION": "1s"}))["id"]
        for _ in range(3)
    ]
    wait_until(
        lambda: set(Job.objects.filter(pk__in=jobs).values_list("state", flat=True)) == {JobState.SUCCEEDED},
        150,
        "three jobs succeed",
        stack,
    )

    def finished() -> bool:
        done = {m["data"]["job"] for m in receiver.payloads() if m["data"]["to_state"] == "succeeded"}
        return done == set(jobs)

    wait_until(finished, 90, "every job's last message", stack)
    messages = _verified(receiver, endpoint["secret"])
    for job in jobs:
        owner = _owner_id(endpoint)
        places = [cursors.unseal(m["data"]["cursor"], owner) for m in messages if m["data"]["job"] == job]
        # submitted, queued, (running: a fast job may be seen succeeded straight from queued), succeeded
        assert places == sorted(places) and len(places) == len(set(places)) >= 3, (job, places)
    assert any(r.status == 503 for r in receiver.received)


def test_an_endpoint_that_keeps_failing_is_disabled_with_the_reason_and_resumes_in_order_when_enabled(
    stack: Stack, receiver: Receiver, user: dict[str, Any]
) -> None:
    receiver.plan = lambda n, headers: 500
    endpoint = _subscribe(stack, user["token"], receiver)
    refused = _job(user["namespace"], runtime="nobody-allowed-this")
    ids = [stack.post("/api/v1/jobs", user["token"], refused, expect=(422,))["id"] for _ in range(2)]

    def disabled() -> dict[str, Any] | None:
        shown: dict[str, Any] = stack.get(f"/api/v1/webhooks/{endpoint['id']}", user["token"])
        return shown if not shown["active"] else None

    shown = wait_until(disabled, 60, "the endpoint disabled", stack)
    assert "failed 5 attempts" in shown["disabled_reason"] and "HTTP 500" in shown["disabled_reason"]
    tries = collections.Counter(r.headers["webhook-id"] for r in receiver.received)
    assert 5 in tries.values() and max(tries.values()) == 5  # the schedule's five attempts, then no more
    shown_again = len(receiver.received)

    receiver.plan = lambda n, headers: 200
    stack.patch(f"/api/v1/webhooks/{endpoint['id']}", user["token"], {"active": True})
    assert len(receiver.received) == shown_again  # nothing was sent while it was disabled
    wait_until(lambda: len(receiver.accepted()) == 2, 30, "both messages after enabling", stack)
    assert sorted(m["data"]["job"] for m in _verified(receiver, endpoint["secret"])) == sorted(ids)


def test_no_event_is_lost_when_redis_restarts(stack: Stack, receiver: Receiver, user: dict[str, Any]) -> None:
    """Redis stops (its queues are lost: no persistence) while jobs are refused and recorded; the outbox rows
    are in PostgreSQL. Once Redis is back, beat's sweep sends every one of them, in order."""
    endpoint = _subscribe(stack, user["token"], receiver)
    refused = _job(user["namespace"], runtime="nobody-allowed-this")
    first = stack.post("/api/v1/jobs", user["token"], refused, expect=(422,))["id"]
    wait_until(lambda: len(receiver.accepted()) == 1, 30, "the message before the outage", stack)
    stack.redis.stop()
    try:
        during = [stack.post("/api/v1/jobs", user["token"], refused, expect=(422,))["id"] for _ in range(3)]
        time.sleep(3)  # three sweep intervals: nothing can move while the broker is away
        assert len(receiver.received) == 1
    finally:
        stack.redis.start()  # empty: whatever was queued before it stopped is gone
    wait_until(lambda: len(receiver.accepted()) == 4, 90, "the outage's messages after Redis is back", stack)
    jobs = [m["data"]["job"] for m in _verified(receiver, endpoint["secret"])]
    assert jobs[0] == first and sorted(jobs[1:]) == sorted(during)  # each job's own order; jobs side by side
    assert json.loads(receiver.accepted()[-1].body)["type"] == "job.state_changed"
