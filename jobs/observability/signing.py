"""Pure: Standard Webhooks signatures (https://www.standardwebhooks.com/).

A secret is "whsec_" + base64 of 32 random bytes. A message is signed as
`v1,` + base64(HMAC-SHA256(secret bytes, f"{msg_id}.{timestamp}.{body}")); during a secret rotation the
header carries one signature per valid secret, separated by spaces, and a receiver accepts any of them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"
SECRET_BYTES = 32


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes:
    raw = secret.removeprefix(PREFIX)
    return base64.b64decode(raw + "=" * (-len(raw) % 4))


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    digest = hmac.new(secret_key(secret), f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secrets_: list[str], msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The three headers of a message, signed with every secret given (the current one first)."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, msg_id, timestamp, body) for s in secrets_ if s),
        "Content-Type": "application/json",
    }
