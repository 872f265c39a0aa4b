"""gunicorn reads this file from the working directory (the repository, /app in the image) by default.

Metrics in multiprocess mode (dispatch_site.metrics): a worker that exits is marked dead, so its live gauges
stop counting; its counters stay in the sum, as Prometheus expects of a counter."""

from __future__ import annotations

from typing import Any


def child_exit(server: Any, worker: Any) -> None:
    from dispatch_site.metrics import process_exited

    process_exited(worker.pid)
