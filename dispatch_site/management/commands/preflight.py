"""Checks that each dependency answers before the service starts: one clear line per problem."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch_site.health import readiness_checks


class Command(BaseCommand):
    help = "Check the database, Redis and (unless --no-kubernetes) the Kubernetes API; exit 2 if one is down."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-kubernetes", action="store_true", help="skip the Kubernetes API check")

    def handle(self, *args: Any, **options: Any) -> None:
        checks = readiness_checks()
        if options["no_kubernetes"]:
            checks.pop("kubernetes", None)
        failures = []
        for name, check in checks.items():
            result = check()
            if result["ok"]:
                self.stdout.write(f"{name}: ok")
            else:
                failures.append(f"{name}: {result['error']}")
        if failures:
            raise CommandError("dependency down: " + "; ".join(failures), returncode=2)
