"""`manage.py check_cluster`: is dispatch's admission guard in the cluster (cluster.guard)? For each policy of
deploy/guard: present, bound, and which managed namespaces (dispatch.dev/managed=true) among those granted in
dispatch it covers; a granted namespace without the label is named too. A missing
guard is a warning on stderr and exit 1; a cluster that cannot be read, exit 2."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cluster.errors import ClusterError
from cluster.guard import read_guard


class Command(BaseCommand):
    help = (
        "Check that each admission guard policy (deploy/guard) is installed, bound, and covers every "
        "namespace dispatch is granted (each labelled dispatch.dev/managed=true); exit 1 when one is "
        "missing, 2 when the cluster cannot be read."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = read_guard()
        except ClusterError as exc:
            raise CommandError(f"the admission guard could not be read: {exc}", returncode=2) from None
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            self.stdout.write(f"managed namespaces: {', '.join(report.managed) or 'none'}")
            if report.unmanaged:
                self.stdout.write(f"granted but not managed: {', '.join(report.unmanaged)}")
            for state in report.doors:
                door = state.door
                if state.ok:
                    covers = ", ".join(state.covered)
                    self.stdout.write(f"ok       {door.policy} (binding {door.binding}): covers {covers}")
                else:
                    self.stdout.write(f"MISSING  {door.policy} (binding {door.binding}): {state.problem}")
        if not report.ok:
            for warning in report.warnings:
                self.stderr.write(f"warning: {warning}")
            raise CommandError(
                f"the admission guard is incomplete ({len(report.warnings)} warning(s)): a namespace member "
                "may forge what the missing policies guard (docs/security.md)",
                returncode=1,
            )
