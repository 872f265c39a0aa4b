"""The command line of a dispatch Celery worker, for the processes that start one themselves (the bench, the
chaos stack, the tests that run a real worker); `make up` starts it from scripts/up. Imports nothing of
Django, so a harness can build it before it sets Django up."""

from __future__ import annotations

import sys
from collections.abc import Sequence

# The queues (dispatch_site.settings: CELERY_TASK_QUEUES, CELERY_TASK_ROUTES). Webhook deliveries have their
# own, consumed by a worker of their own (scripts/up, deploy/base/webhooks.yaml) with few threads, so a slow
# receiver holds one of those, never a thread that starts TrainJobs. A worker started without queues (the
# tests' and benches' single worker) consumes both.
DEFAULT_QUEUE = "celery"
WEBHOOKS_QUEUE = "webhooks"
QUEUES = (DEFAULT_QUEUE, WEBHOOKS_QUEUE)


def worker_command(
    *,
    pool: str,
    concurrency: int | None = None,
    name: str = "",
    loglevel: str = "INFO",
    extra: Sequence[str] = (),
    python: str = sys.executable,
    queues: Sequence[str] = (),
) -> list[str]:
    """`python -m celery -A dispatch_site worker` with the pool, its concurrency and the worker's name when
    given, and the queues it consumes (every one of QUEUES when none are given). Gossip and mingle are off:
    dispatch's workers share nothing through them, and both cost a start-up round with every other worker."""
    return [
        python,
        "-m",
        "celery",
        "-A",
        "dispatch_site",
        "worker",
        "--pool",
        pool,
        *(["--concurrency", str(concurrency)] if concurrency is not None else []),
        "--without-gossip",
        "--without-mingle",
        *(["-n", name] if name else []),
        *(["-Q", ",".join(queues)] if queues else []),
        "--loglevel",
        loglevel,
        *extra,
    ]
