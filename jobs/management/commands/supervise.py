"""`manage.py supervise [--once]`: the supervisor, with a pod watch between its cycles
(jobs.supervision.watch)."""

from __future__ import annotations

import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from dispatch_site import metrics
from jobs.supervision import cycle
from jobs.supervision.watch import run_forever


class Command(BaseCommand):
    help = "Run the supervisor: a cycle every SUPERVISOR_INTERVAL_SECONDS, and at once when a pod changes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="run one cycle and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["once"]:
            report = cycle.supervise()
            self.stdout.write(
                f"ran={report.ran} executions={report.executions} transitions={report.transitions} "
                f"api_requests={report.api_requests} duration_ms={report.duration_ms} error={report.error!r}"
            )
            return
        metrics.serve_process_metrics()  # METRICS_PORT: this pod's metrics (README "Observability")
        stop = {"now": False}

        def _stop(*_: Any) -> None:
            stop["now"] = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        run_forever(lambda: stop["now"])
