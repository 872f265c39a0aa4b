"""`manage.py supervise [--once] [--no-watch] [--stats]`: the supervisor (jobs.supervision.watch)."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from dispatch_site import metrics
from jobs.supervision import cycle
from jobs.supervision.watch import run_forever


class Command(BaseCommand):
    help = "Run the supervisor: watches, and a cycle as soon as something changed (else every interval)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="run one cycle (plain list reads) and exit")
        parser.add_argument(
            "--no-watch",
            action="store_true",
            help="no watches: a cycle of plain list reads every interval (what the beat's cycle does)",
        )
        parser.add_argument(
            "--stats", action="store_true", help="print one JSON line per cycle (what it read, derived, cost)"
        )

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

        def stats(report: cycle.CycleReport) -> None:
            if report.ran:
                line = dataclasses.asdict(report) | {"rss_kib": _rss_kib()}
                self.stdout.write(json.dumps(line))
                self.stdout.flush()

        run_forever(
            lambda: stop["now"], watch=not options["no_watch"], on_cycle=stats if options["stats"] else None
        )


def _rss_kib() -> int:
    """The process's resident memory now (Linux: /proc/self/status VmRSS), 0 where unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
