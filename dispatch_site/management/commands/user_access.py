"""python manage.py user_access NAME [--role platform|oncall|user] [--grant NS...] [--revoke NS...]
[--deactivate | --activate] : change who may do what; every change lands in the audit log."""

from __future__ import annotations

import getpass
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch_site import roles
from dispatch_site.names import is_dns1123_label
from dispatch_site.services import user_access_update


def _namespace(value: str) -> str:
    if value != roles.ALL_NAMESPACES and not is_dns1123_label(value):
        raise CommandError(f"namespace {value!r} is not a valid Kubernetes namespace name")
    return value


class Command(BaseCommand):
    help = "Change a user's role, namespace grants or whether the account may act (audited)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", choices=roles.ROLES)
        parser.add_argument("--grant", nargs="*", default=[], help='namespaces to grant ("*": all)')
        parser.add_argument("--revoke", nargs="*", default=[], help="namespaces to take back")
        active = parser.add_mutually_exclusive_group()
        active.add_argument(
            "--deactivate", action="store_true", help="the account stops acting; its API tokens are revoked"
        )
        active.add_argument("--activate", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        user = User.objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        active = False if options["deactivate"] else True if options["activate"] else None
        changed = user_access_update(
            user=user,
            role=options["role"],
            grant=[_namespace(n) for n in options["grant"]],
            revoke=[_namespace(n) for n in options["revoke"]],
            active=active,
            actor_name=f"manage.py user_access ({getpass.getuser()})",
        )
        self.stdout.write(f"{user.get_username()}: " + ("; ".join(changed) if changed else "nothing changed"))
