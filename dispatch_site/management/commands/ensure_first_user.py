"""Creates a first platform user when there is no user at all (used by `make up`)."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandParser

from dispatch_site import roles
from dispatch_site.config import VAR_DIR
from dispatch_site.services import user_create


class Command(BaseCommand):
    help = "Create the first platform user (password and token written under var/) if no user exists."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, **options: Any) -> None:
        credentials = VAR_DIR / "first-user.txt"
        if User.objects.exists():
            if credentials.exists():
                self.stdout.write(credentials.read_text().strip())
            return
        password = secrets.token_urlsafe(12)
        username = options["username"]
        _, token = user_create(username=username, role=roles.PLATFORM, namespaces=["*"], password=password)
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        credentials.write_text(f"username: {username}\npassword: {password}\napi token: {token}\n")
        credentials.chmod(0o600)
        self.stdout.write(credentials.read_text().strip())
