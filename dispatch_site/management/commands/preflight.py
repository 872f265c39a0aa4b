"""Checks that each dependency answers before the service starts: one clear line per problem."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch_site.health import check_database, check_kubernetes, check_redis


class Command(BaseCommand):
    help = "Check the database, Redis and (unless --no-kubernetes) the Kubernetes API; exit 2 if one is down."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-kubernetes", action="store_true", help="skip the Kubernetes API check")

    def handle(self, *args: Any, **options: Any) -> None:
        checks = {"database": check_database, "redis": check_redis}
        if not options["no_kubernetes"]:
            checks["kubernetes"] = check_kubernetes
        failures = []
        for name, check in checks.items():
            result = check()
            if result["ok"]:
                self.stdout.write(f"{name}: ok")
            else:
                failures.append(f"{name}: {result['error']}")
        if failures:
            raise CommandError("dependency down: " + "; ".join(failures), returncode=2)
