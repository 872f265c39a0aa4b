"""An endpoint acts with its owner's authority as it stands now, not as it stood when it was made: a platform
engineer's namespace subscription stops when they leave the platform role, and a deactivated user's
endpoints stop, both for changes made afterwards and for deliveries already waiting."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group

from dispatch_site import roles
from jobs.models import Job, JobEvent, JobState
from jobs.naming import new_job_id
from jobs.observability import outbox, webhooks
from jobs.observability.models import WebhookAttempt, WebhookDelivery
from tests.jobs.observability.conftest import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _local_receivers(settings: Any) -> None:
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_RETRY_SCHEDULE = (60.0, 60.0)
    outbox.forget_cached_endpoints()


def _change(owner: Any, namespace: str = "team-a") -> Job:
    job = Job.objects.create(
        id=new_job_id(),
        owner=owner,
        namespace=namespace,
        runtime_kind="ClusterTrainingRuntime",
        runtime_name="x",
        spec={},
        state=JobState.QUEUED,
    )
    JobEvent.objects.create(job=job, attempt=1, kind="transition", from_state="queued", to_state="running")
    return job


def test_a_demoted_platform_engineers_namespace_subscription_stops(make_user: Any) -> None:
    pat, _ = make_user("pat", roles.PLATFORM, ("*",))
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    receiver = Receiver()
    try:
        endpoint, _ = webhooks.endpoint_create(owner=pat, url=receiver.url, namespace="team-a")
        endpoint.active = False  # hold the first delivery: it waits while pat is demoted
        endpoint.save(update_fields=["active"])
        _change(uma)
        assert webhooks.fanout() > 0
        waiting = list(WebhookDelivery.objects.filter(endpoint=endpoint))
        endpoint.active = True
        endpoint.save(update_fields=["active"])

        pat.groups.remove(Group.objects.get(name=roles.PLATFORM))
        pat.is_superuser = False
        pat.save(update_fields=["is_superuser"])
        _change(uma)
        assert webhooks.fanout() == 0  # a change after the demotion: no delivery for pat's endpoint
        for delivery in waiting:  # one made before it is not sent either
            webhooks.delivery_send(delivery_id=delivery.pk)
            [attempt] = WebhookAttempt.objects.filter(delivery=delivery)
            assert "no longer may receive" in attempt.error
        assert receiver.received == []
    finally:
        receiver.close()


def test_a_deactivated_users_own_endpoint_stops(make_user: Any) -> None:
    uma, _ = make_user("uma", roles.USER, ("team-a",))
    receiver = Receiver()
    try:
        webhooks.endpoint_create(owner=uma, url=receiver.url)
        uma.is_active = False
        uma.save(update_fields=["is_active"])
        _change(uma)
        assert webhooks.fanout() == 0 and receiver.received == []
        uma.is_active = True  # active again: changes from now on are delivered, the skipped ones are not
        uma.save(update_fields=["is_active"])
        _change(uma)
        assert webhooks.fanout() > 0
    finally:
        receiver.close()
