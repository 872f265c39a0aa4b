"""Prometheus metrics: every metric dispatch exports, defined once, and the /metrics exposition.

Counters and histograms live in the process that observes them (a gunicorn worker, a Celery worker, the
supervisor). With PROMETHEUS_MULTIPROC_DIR set, prometheus_client keeps them in memory-mapped files in that
directory and /metrics adds up the files of every process that shares it (multiprocess mode); a process that
exits is marked dead (gunicorn's child_exit hook in gunicorn.conf.py, Celery's worker_process_shutdown signal)
so its live gauges stop counting. Without the variable (tests, a single process) the default registry is used.

Numbers the database holds (jobs by state, the supervisor's lag) are not kept in any process: collectors
registered with `register_scrape_collector` read them at scrape time (jobs.observability.collector), so they
are right even when the process that changes them is down.

No metric has a per-user or per-job label: label values come from small fixed sets (states, causes, reason
codes, verbs and kinds, namespaces), so the number of series stays bounded.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from dispatch_site.client_address import proxied

logger = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_multiproc_dir = os.environ.get(MULTIPROC_ENV, "")
if _multiproc_dir:
    # prometheus_client picks its value class when it is first imported: the directory must exist by then.
    Path(_multiproc_dir).mkdir(parents=True, exist_ok=True)

from prometheus_client import (  # noqa: E402 - after the directory exists
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily  # noqa: E402
from prometheus_client.registry import Collector  # noqa: E402

# ---------------------------------------------------------------- the metrics

JOB_TRANSITIONS = Counter(
    "dispatch_job_transitions",
    "Job state changes, by the state left ('new' for a submission), the state entered and the cause.",
    ["from", "to", "cause"],
)
REFUSALS = Counter(
    "dispatch_refusals",
    "Refusal reasons recorded for jobs (at submission or at start), one per reason code.",
    ["code"],
)
SUBMISSION_TO_TRAINJOB = Histogram(
    "dispatch_submission_to_trainjob_seconds",
    "From an execution's creation (the job's submission for attempt 1) to its TrainJob existing.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
QUEUE_WAIT = Histogram(
    "dispatch_queue_wait_seconds",
    "For jobs that name a Kueue LocalQueue: from an execution's TrainJob existing to the execution running "
    "(the time Kueue held it before admission, and the pods' start).",
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600),
)
GPU_SECONDS = Counter(
    "dispatch_gpu_seconds",
    "GPU-seconds of ended attempts as the usage rollup counts them (jobs.usage), by namespace (those granted "
    "to someone; any other is 'other'), Kueue LocalQueue ('' without Kueue) and outcome (the cause, or "
    "succeeded).",
    ["namespace", "queue", "outcome"],
)
ATTEMPT_QUEUE_WAIT = Histogram(
    "dispatch_attempt_queue_wait_seconds",
    "Per ended attempt that ran, by Kueue LocalQueue: from its TrainJob's creation to all ranks running.",
    ["queue"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400),
)
SUPERVISOR_CYCLE = Histogram(
    "dispatch_supervisor_cycle_seconds",
    "Duration of one supervision cycle (list the cluster, derive, write).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
IDENTITY_FINDINGS = Counter(
    "dispatch_identity_findings",
    "Identity findings: a rank run twice under one execution identity (expected: the plan's allowRankRestart "
    "warning foresaw it).",
    ["expected"],
)
RECOVERY_ATTEMPTS = Counter(
    "dispatch_recovery_attempts",
    "Attempts A+1 scheduled by the recovery policy, by the cause of the failed attempt.",
    ["cause"],
)
SESSION_EXEC = Histogram(
    "dispatch_session_exec_seconds",
    "Duration of one command executed in an interactive session's trainer pod (pods/exec).",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600),
)
KUBERNETES_REQUESTS = Counter(
    "dispatch_kubernetes_requests",
    "Requests to the Kubernetes API server through the gateway, by verb, kind and HTTP status "
    "('error' when no answer came).",
    ["verb", "kind", "code"],
)
WEBHOOK_DELIVERIES = Counter(
    "dispatch_webhook_deliveries",
    "Webhook delivery attempts, by outcome (delivered, failed, disabled).",
    ["outcome"],
)
WEBHOOK_DELIVERY_SECONDS = Histogram(
    "dispatch_webhook_delivery_seconds",
    "Duration of one webhook delivery attempt (until the receiver answered or the attempt failed).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

# ---------------------------------------------------------------- scrape-time collectors

_scrape_collectors: list[Collector] = []


def register_scrape_collector(collector: Collector) -> None:
    """A collector read at every scrape of /metrics (once per process; an app's ready() registers it)."""
    if not any(type(c) is type(collector) for c in _scrape_collectors):
        _scrape_collectors.append(collector)


class _Guarded(Collector):
    """A scrape collector whose failure (the database is down) becomes dispatch_scrape_error{source} 1 instead
    of failing the whole scrape: the process metrics still reach Prometheus."""

    def __init__(self, collectors: Iterable[Collector]) -> None:
        self.collectors = list(collectors)

    def collect(self) -> Iterable[Any]:
        errors = GaugeMetricFamily(
            "dispatch_scrape_error",
            "1 when a scrape-time source could not be read (its figures are missing from this scrape).",
            labels=["source"],
        )
        for collector in self.collectors:
            source = getattr(collector, "source", type(collector).__name__)
            try:
                families = list(collector.collect())
            except Exception as exc:
                logger.warning("metrics: %s could not be read: %s", source, exc)
                errors.add_metric([source], 1)
                continue
            errors.add_metric([source], 0)
            yield from families
        yield errors


def registry() -> CollectorRegistry:
    """What a scrape reads: every process's metrics (multiprocess mode) or this process's, plus the
    scrape-time collectors."""
    if _multiproc_dir:
        scrape = CollectorRegistry()
        multiprocess.MultiProcessCollector(scrape)
    else:
        scrape = CollectorRegistry(auto_describe=False)
        scrape.register(_Forward(REGISTRY))
    if _scrape_collectors:
        scrape.register(_Guarded(_scrape_collectors))
    return scrape


class _Forward(Collector):
    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterable[Any]:
        return self.source.collect()


def exposition() -> tuple[bytes, str]:
    """The text a scrape gets, and its content type."""
    return generate_latest(registry()), CONTENT_TYPE_LATEST


# ---------------------------------------------------------------- who may scrape

LOOPBACK = frozenset({"127.0.0.1", "::1"})


def scrape_allowed(token: str, authorization: str, remote_addr: str, *, via_proxy: bool) -> bool:
    """With METRICS_TOKEN set, a scrape must send `Authorization: Bearer <token>`; without it only this host
    (loopback) may scrape, and only directly: behind a proxy on this host (a sidecar, an ingress on the node)
    every caller's peer address is the proxy's loopback one."""
    if token:
        scheme, _, presented = authorization.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip(), token)
    return remote_addr in LOOPBACK and not via_proxy


REFUSED_WITH_TOKEN = "a scrape needs Authorization: Bearer <METRICS_TOKEN>\n"
REFUSED_WITHOUT_TOKEN = (
    "metrics answer this host only, and not through a proxy; "
    "set METRICS_TOKEN to let a scraper elsewhere in\n"
)


def _guarded(app: Any, token: str) -> Any:
    """The process metrics' WSGI app behind the same rule as the web's /metrics (scrape_allowed)."""

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        allowed = scrape_allowed(
            token,
            str(environ.get("HTTP_AUTHORIZATION", "")),
            str(environ.get("REMOTE_ADDR", "")),
            via_proxy=proxied(environ),
        )
        if allowed:
            return app(environ, start_response)
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if token:
            start_response("401 Unauthorized", [*headers, ("WWW-Authenticate", 'Bearer realm="metrics"')])
            return [REFUSED_WITH_TOKEN.encode()]
        start_response("403 Forbidden", headers)
        return [REFUSED_WITHOUT_TOKEN.encode()]

    return guarded


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one line every few seconds per scraper)."""


# ---------------------------------------------------------------- worker and supervisor pods

PORT_ENV = "METRICS_PORT"


def serve_process_metrics() -> int | None:
    """A pod without the web (Celery worker, supervisor) serves its own processes' metrics on METRICS_PORT
    (plain HTTP, every address), under the web's rule: the scraper sends METRICS_TOKEN as a Bearer token, or,
    with no token set, only this host may scrape. The database's figures come from the web's /metrics.
    Returns the port, or None when METRICS_PORT is unset."""
    raw = os.environ.get(PORT_ENV, "").strip()
    if not raw:
        return None
    from django.conf import settings
    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    served = CollectorRegistry()
    if _multiproc_dir:
        multiprocess.MultiProcessCollector(served)
    else:
        served = REGISTRY
    app = _guarded(make_wsgi_app(served), str(settings.METRICS_TOKEN))
    server = make_server(
        os.environ.get("METRICS_ADDR", "0.0.0.0"),
        int(raw),
        app,
        ThreadingWSGIServer,
        handler_class=_QuietHandler,
    )
    threading.Thread(target=server.serve_forever, name="process-metrics", daemon=True).start()
    logger.info("metrics of this pod's processes on port %s", raw)
    return int(raw)


# ---------------------------------------------------------------- process bookkeeping


def process_exited(pid: int) -> None:
    """Multiprocess mode: a worker process ended (gunicorn child_exit, Celery worker_process_shutdown)."""
    if _multiproc_dir:
        multiprocess.mark_process_dead(pid, _multiproc_dir)
