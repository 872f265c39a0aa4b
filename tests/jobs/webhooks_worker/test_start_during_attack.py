"""A start submitted while webhook receivers attack reaches the cluster in its usual time (issue 33).

The attack: a gzip bomb and receivers that drip their headers a byte a second, served over TLS with a CA of
the test's own (WEBHOOK_CA_BUNDLE), more of them than the webhooks worker has threads. The workers are real
processes with deploy/base's commands (worker.yaml: the default queue, which starts TrainJobs;
webhooks.yaml: deliveries), on the suite's Redis and database and the real API server with the Trainer's
controllers. A start is timed from its POST to its TrainJob in the cluster, once before the attack and once
during it, side by side in one run; the webhooks worker stays up and records every attempt."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from dispatch_site import roles
from dispatch_site.celery import app
from dispatch_site.services import user_create
from jobs import enqueue
from jobs.observability.models import WebhookAttempt
from runtimes.models import AllowListEntry
from tests.client.conftest import Process
from tests.jobs.observability.hostile import (
    LocalCA,
    RawReceiver,
    drip_headers,
    gzip_bomb,
    make_local_ca,
    pending_delivery,
)
from tests.jobs.webhooks_worker.test_webhook_queue import _deployed_worker
from tests.support.dispatch import api_as, trainjob_exists, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

# More receivers than the default worker has threads (deploy/base/worker.yaml: 16): were deliveries to share
# its threads, every one of them would be held for the whole deadline, and the start would wait behind them.
DRIPS = 18
DEADLINE = 30  # WEBHOOK_TIMEOUT_SECONDS: how long each hostile receiver holds a thread


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    return make_local_ca(tmp_path_factory.mktemp("attack-ca"))


@pytest.fixture
def workers(dispatch_on_cluster: str, local_ca: LocalCA, tmp_path: Path) -> Iterator[tuple[Process, Process]]:
    db = connection.settings_dict
    env = os.environ | {
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "KUBECONFIG": dispatch_on_cluster,
        "DEBUG": "true",
        "WEBHOOK_CA_BUNDLE": str(local_ca.ca),
        "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
        "WEBHOOK_TIMEOUT_SECONDS": str(DEADLINE),
        "WEBHOOK_RETRY_SCHEDULE": "600,600",
    }
    default = _deployed_worker("worker.yaml", "worker", env, tmp_path)
    hooks = _deployed_worker("webhooks.yaml", "webhooks", env, tmp_path)
    app.conf.task_always_eager = False  # the POSTs below go through the broker to the real workers
    try:
        wait_for(
            lambda: "ready" in default.tail() and "ready" in hooks.tail(), timeout=90, what="workers ready"
        )
        yield default, hooks
    finally:
        app.conf.task_always_eager = True
        default.stop()
        hooks.stop()


def _start(token: str, namespace: str, kube: Any) -> float:
    """Seconds from the POST to the TrainJob existing in the cluster."""
    began = time.monotonic()
    response = api_as(token).post(
        "/api/v1/jobs",
        {
            "runtime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-kind"},
            "namespace": namespace,
            "image": "localhost/trainer:v1",
            "num_nodes": 2,
            "env": {"KWOK_RUN_DURATION": "2s"},
        },
        format="json",
    )
    assert response.status_code == 202, response.content
    name = f"{response.json()['id']}-1"
    wait_for(lambda: trainjob_exists(kube, namespace, name), timeout=120, what=f"TrainJob {name}")
    return time.monotonic() - began


def test_a_start_submitted_during_a_webhook_attack_reaches_the_cluster_in_its_usual_time(
    kube: Any, namespace: str, workers: tuple[Process, Process], local_ca: LocalCA
) -> None:
    default, hooks = workers
    _, token = user_create(username=f"ada-{namespace[-6:]}", role=roles.USER, namespaces=[namespace])
    # The attackers: users of their own (at most WEBHOOK_ENDPOINTS_PER_USER endpoints each), whose endpoints
    # point at the hostile receivers.
    attackers = [
        user_create(username=f"mal{i}-{namespace[-6:]}", role=roles.USER, namespaces=["team-a"])[0]
        for i in range(2)
    ]
    AllowListEntry.objects.get_or_create(
        kind="ClusterTrainingRuntime", namespace="", name="dispatch-kind", defaults={"for_jobs": True}
    )
    usual = _start(token, namespace, kube)

    receivers = [RawReceiver(gzip_bomb, local_ca.server)] + [
        RawReceiver(drip_headers, local_ca.server) for _ in range(DRIPS)
    ]
    try:
        deliveries = [pending_delivery(attackers[i % 2], r.url) for i, r in enumerate(receivers)]
        for delivery in deliveries:
            enqueue.send(enqueue.WEBHOOK_DELIVER, delivery.pk)
        # The attack is on: every thread of the webhooks worker holds a receiver (an attempt is recorded in
        # its claim, before the POST).
        wait_for(
            lambda: WebhookAttempt.objects.filter(delivery__in=deliveries).count() >= 4,
            timeout=60,
            what="the webhooks worker busy with the receivers",
        )
        # The receivers really were reached, over TLS (a request counts once its head was read).
        wait_for(lambda: sum(r.requests for r in receivers) >= 4, timeout=30, what="receivers reached")
        during = _start(token, namespace, kube)
        assert during <= 3 * usual + 5, f"a start took {during:.1f} s during the attack, {usual:.1f} s before"
        assert during < DEADLINE
    finally:
        for receiver in receivers:
            receiver.close()
    # The receivers gone, the webhooks worker works through the rest; it stayed up and took them all.
    wait_for(
        lambda: WebhookAttempt.objects.filter(delivery__in=deliveries).count() == len(deliveries),
        timeout=DEADLINE * 3,
        what="every delivery attempted",
    )
    assert hooks.popen.poll() is None and default.popen.poll() is None, hooks.tail()
    bomb = WebhookAttempt.objects.get(delivery=deliveries[0])
    assert bomb.status_code == 500
