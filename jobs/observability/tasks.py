"""Celery tasks of the webhooks: thin. A delivery task takes the delivery's primary key; the service claims it
(compare-and-set) and returns when there is nothing to do, so a duplicate or a stale message is harmless."""

from __future__ import annotations

from celery import shared_task

from jobs import enqueue
from jobs.observability import collector, webhooks


@shared_task(name=enqueue.WEBHOOKS_FANOUT, acks_late=True)
def webhooks_fanout() -> int:
    return webhooks.fanout()


@shared_task(name=enqueue.WEBHOOK_DELIVER, acks_late=True)
def webhook_deliver(delivery_id: int) -> None:
    webhooks.delivery_send(delivery_id=delivery_id)


@shared_task(name=enqueue.WEBHOOKS_SWEEP, acks_late=True)
def webhooks_sweep() -> int:
    return webhooks.sweep()


@shared_task(name=enqueue.JOB_COUNTS_COMPACT, acks_late=True)
def job_counts_compact() -> int:
    return collector.compact_job_counts()
