"""`manage.py derive_status FILE... [--json]`: the supervisor's status derivation on recorded objects.

Each FILE is a Kubernetes List (JSON or YAML, as `kubectl get -o json` writes it) holding one execution's
objects: its TrainJob, JobSet, Jobs, Pods, Events, the Nodes they ran on, Kueue Workloads. The same pure
function the supervisor runs (jobs.status.derive) judges each file. With --json: one JSON list, in file order,
of {state, cause, rank, exit_code, evidence: [{object, field, value}], identity_findings: [{rank, attempt,
restart_attempt, pods, why}]}. Exit 2 with one line naming the file when it cannot be read or parsed.
Needs no database and no cluster.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch_site.names import DEFAULT_LABEL_DOMAIN
from jobs.supervision.status import Context, derive
from jobs.waits import Thresholds, parse_time
from runtimes.management.commands.check_runtime import USAGE_ERROR, load_objects


class Command(BaseCommand):
    help = (
        "Derive state, typed cause and evidence from recorded Kubernetes objects (no database, no cluster)."
    )
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("files", nargs="+", metavar="FILE")
        parser.add_argument("--json", action="store_true", help="print one JSON list, in file order")
        parser.add_argument("--label-domain", default=DEFAULT_LABEL_DOMAIN)
        parser.add_argument(
            "--now", default="", help="RFC 3339 time to judge waiting causes at (default: the current time)"
        )
        parser.add_argument("--no-capacity-after", type=float, default=Thresholds.no_capacity_after)
        parser.add_argument("--stuck-after", type=float, default=Thresholds.stuck_after)
        parser.add_argument("--inadmissible-after", type=float, default=Thresholds.inadmissible_after)
        parser.add_argument(
            "--identity-warned", action="store_true", help="the plan carried an allowRankRestart warning"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        now = datetime.now(UTC)
        if options["now"]:
            parsed = parse_time(options["now"])
            if parsed is None:
                raise CommandError(
                    f"--now {options['now']!r} is not an RFC 3339 time", returncode=USAGE_ERROR
                )
            now = parsed
        ctx = Context(
            now=now,
            label_domain=options["label_domain"],
            identity_warned=options["identity_warned"],
            thresholds=Thresholds(
                no_capacity_after=options["no_capacity_after"],
                stuck_after=options["stuck_after"],
                inadmissible_after=options["inadmissible_after"],
            ),
        )
        results = []
        for path in options["files"]:
            objects = load_objects(path)  # CommandError (exit 2) naming the file
            results.append((path, derive(objects, ctx)))
        if options["json"]:
            self.stdout.write(json.dumps([status.contract() for _, status in results], indent=2))
            return
        for path, status in results:
            cause = f" / {status.cause}" if status.cause else ""
            self.stdout.write(
                f"{path}: {status.state}{cause}" + (f": {status.message}" if status.message else "")
            )
            for item in status.evidence:
                self.stdout.write(f"  evidence: {item['object']} {item['field']} = {item['value']}")
            if status.queued_reason:
                self.stdout.write(
                    f"  waiting: {status.queued_reason.get('reason')}: {status.queued_reason.get('message')}"
                )
            for finding in status.identity_findings:
                self.stdout.write(f"  identity: {finding['why']}")
