"""API token authentication: `Authorization: Token <key>` or `Authorization: Bearer <key>`."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication
from rest_framework.request import Request


class TokenAuthentication(authentication.TokenAuthentication):
    keywords = ("Token", "Bearer")

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        auth = authentication.get_authorization_header(request).split()
        if not auth or auth[0].decode(errors="replace") not in self.keywords:
            return None
        if len(auth) != 2:
            from rest_framework.exceptions import AuthenticationFailed

            raise AuthenticationFailed("Invalid token header: expected 'Token <key>'.")
        try:
            token = auth[1].decode()
        except UnicodeError:
            from rest_framework.exceptions import AuthenticationFailed

            raise AuthenticationFailed("Invalid token header: the token has invalid characters.") from None
        return self.authenticate_credentials(token)
