"""Secrets at rest: a model field whose values the database only ever holds encrypted (Fernet: AES-128-CBC
and HMAC-SHA256, from the well-kept `cryptography` package rather than a cipher of our own).

The keys come from Django's own: the first from SECRET_KEY encrypts, and every key of SECRET_KEY and
SECRET_KEY_FALLBACKS decrypts. So rotating SECRET_KEY the way Django documents it (the new key in
SECRET_KEY, the old one in SECRET_KEY_FALLBACKS) keeps every stored secret readable, and
`manage.py reencrypt_secrets` rewrites them under the new key before the fallback is dropped. A stored value
is "enc1:" + the Fernet token; a value without the prefix (a row from before encryption) reads as it is and
is encrypted when next written (the migration that introduced the field rewrote every row)."""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Final

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import models

PREFIX: Final = "enc1:"
_CONTEXT: Final = b"dispatch.encrypted-field.v1:"


class UndecryptableSecret(Exception):
    """A stored secret none of the keys decrypts: SECRET_KEY changed without the old one in the fallbacks."""


def _fernet_key(secret_key: str) -> bytes:
    return base64.urlsafe_b64encode(hashlib.sha256(_CONTEXT + secret_key.encode()).digest())


def keyring() -> MultiFernet:
    """The current key first (it encrypts), then each fallback (they decrypt)."""
    keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ())]
    return MultiFernet([Fernet(_fernet_key(k)) for k in keys])


def encrypt(value: str) -> str:
    return PREFIX + keyring().encrypt(value.encode()).decode()


def decrypt(stored: str) -> str:
    if not stored.startswith(PREFIX):
        return stored  # written before encryption
    try:
        return keyring().decrypt(stored.removeprefix(PREFIX).encode()).decode()
    except InvalidToken:
        raise UndecryptableSecret(
            "a stored secret cannot be decrypted with SECRET_KEY or SECRET_KEY_FALLBACKS: put the key it was "
            "written under back in SECRET_KEY_FALLBACKS"
        ) from None


def reencrypt(stored: str) -> str:
    """The stored value under the current key (MultiFernet.rotate keeps the token's original time)."""
    if not stored.startswith(PREFIX):
        return encrypt(stored) if stored else stored
    return PREFIX + keyring().rotate(stored.removeprefix(PREFIX).encode()).decode()


class EncryptedTextField(models.TextField):
    """A text value the database holds encrypted; Python code reads and writes it in the clear. Not for
    lookups: equal values encrypt differently every time."""

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> str | None:
        return None if value is None else decrypt(value)

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        if value is None or value == "" or not isinstance(value, str) or value.startswith(PREFIX):
            return value
        return encrypt(value)
