"""python manage.py create_user NAME --role platform|oncall|user --namespace NS... : prints an API token
(once: only its digest is stored)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch_site import roles
from dispatch_site.names import is_dns1123_label
from dispatch_site.services import user_create


class Command(BaseCommand):
    help = "Create a user with a role and namespace grants, and print their API token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", choices=roles.ROLES, default=roles.USER)
        parser.add_argument(
            "--namespace", nargs="*", default=[], help='namespaces they may submit into ("*": all)'
        )
        parser.add_argument("--password", default=None, help="for dashboard login (optional)")
        parser.add_argument("--email", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        username: str = options["username"]
        if User.objects.filter(username=username).exists():
            raise CommandError(f"user {username!r} already exists")
        if options["password"] is not None:
            try:
                validate_password(options["password"], User(username=username, email=options["email"]))
            except ValidationError as exc:
                raise CommandError("password refused: " + " ".join(exc.messages)) from None
        for namespace in options["namespace"]:
            if namespace != "*" and not is_dns1123_label(namespace):
                raise CommandError(f"namespace {namespace!r} is not a valid Kubernetes namespace name")
        _, token = user_create(
            username=username,
            role=options["role"],
            namespaces=options["namespace"],
            password=options["password"],
            email=options["email"],
        )
        self.stdout.write(token)
