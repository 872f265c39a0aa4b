"""API token authentication: `Authorization: Token <token>` or `Authorization: Bearer <token>`.

Tokens are django-rest-knox tokens kept as SHA-512 digests in dispatch_site.ApiToken: the token is looked up
by its first characters and compared by digest in constant time. An expired or revoked (deleted) token is a
401. The time of last use is written at most once a minute per token, not on every request.
"""

from __future__ import annotations

from datetime import timedelta
from hmac import compare_digest
from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.crypto import hash_token
from knox.settings import CONSTANTS
from rest_framework import authentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from dispatch_site.models import ApiToken

KEYWORDS = ("Token", "Bearer")
LAST_USED_RESOLUTION = timedelta(seconds=60)
INVALID = "Invalid token."


def token_lookup(token: str) -> ApiToken | None:
    """The stored token matching a presented one (expired or not), or None."""
    for candidate in ApiToken.objects.filter(token_key=token[: CONSTANTS.TOKEN_KEY_LENGTH]).select_related(
        "user"
    ):
        if compare_digest(hash_token(token), candidate.digest):
            return candidate
    return None


def token_authenticate(token: str) -> tuple[Any, ApiToken]:
    """The user a presented token stands for; AuthenticationFailed when it is unknown, revoked or expired."""
    found = token_lookup(token)
    if found is None:
        raise AuthenticationFailed(INVALID)
    now = timezone.now()
    if found.expiry is not None and found.expiry <= now:
        raise AuthenticationFailed("Token expired: create a new one (dashboard → API tokens).")
    if not found.user.is_active:
        raise AuthenticationFailed("User inactive or deleted.")
    if found.last_used_at is None or now - found.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
        found.last_used_at = now
    return found.user, found


class TokenAuthentication(KnoxTokenAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        auth = authentication.get_authorization_header(request).split()
        if not auth or auth[0].decode(errors="replace") not in KEYWORDS:
            return None
        if len(auth) != 2:
            raise AuthenticationFailed("Invalid token header: expected 'Token <token>'.")
        try:
            token = auth[1].decode("ascii")
        except UnicodeError:
            raise AuthenticationFailed("Invalid token header: the token has invalid characters.") from None
        return token_authenticate(token)

    def authenticate_header(self, request: Request) -> str:
        return "Token"


class TokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema describes TokenAuthentication (the same as DRF's own token scheme)."""

    target_class = "dispatch_site.auth.TokenAuthentication"
    name = "tokenAuth"
    match_subclasses = True
    priority = 1

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'Token-based authentication: "Token <token>" or "Bearer <token>"',
        }
