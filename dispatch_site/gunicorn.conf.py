"""The web server's settings: one definition for `make up` (scripts/up), the image (Containerfile) and the
Deployment (deploy/base/web.yaml), read with `gunicorn -c dispatch_site/gunicorn.conf.py`.

Threaded workers (gthread): WEB_WORKERS processes of WEB_THREADS threads each. A long request (exec up to
600 s, ?wait= up to 300 s, logs?follow=true) holds one thread, never a whole process, and at most
LONG_REQUESTS_PER_PROCESS of them run in a process at once (dispatch_site.longrequests), so the other threads
always serve the short requests and the probes. The worker timeout is the main loop's heartbeat, which the
threads do not block. Each thread keeps its own database connection: PostgreSQL's max_connections must cover
web pods x WEB_WORKERS x WEB_THREADS, plus the workers'.
"""

import os

from dispatch_site.config import load_config

_config = load_config()

wsgi_app = "dispatch_site.wsgi:application"
bind = os.environ.get("WEB_BIND", f"0.0.0.0:{os.environ.get('PORT', '8000')}")
worker_class = "gthread"
workers = _config.web_workers
threads = _config.web_threads
timeout = 60
graceful_timeout = 30
keepalive = 5
accesslog = "-"
worker_tmp_dir = os.environ.get("WEB_WORKER_TMP_DIR", "/tmp")


def child_exit(server: object, worker: object) -> None:
    """Metrics in multiprocess mode (dispatch_site.metrics): a worker that exits is marked dead, so its live
    gauges stop counting; its counters stay in the sum, as Prometheus expects of a counter."""
    from dispatch_site.metrics import process_exited

    process_exited(worker.pid)  # type: ignore[attr-defined]
