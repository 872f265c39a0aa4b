"""Feed cursors that say nothing about anyone else's activity.

A change's place in the feed is its `seq`, one counter for the whole platform: handed out as it is, a cursor
would tell any user how much happens on the platform (the newest seq from `?after=now`, and the gaps between
their own changes), and so would a webhook's message id. So every cursor that leaves dispatch is sealed: the
seq and the user it was handed to, in one AES block (the `cryptography` package's AES; one block under a
fixed key is a pseudo-random permutation, so equal cursors stay equal and nothing else shows), as 22
URL-safe characters. Reading one back checks that it was made for the same user: a cursor cannot be forged,
guessed from a number, or replayed by someone else. The key derives from SECRET_KEY; SECRET_KEY_FALLBACKS
still open cursors handed out before a rotation."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from typing import Final

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from django.conf import settings

_CONTEXT: Final = b"dispatch.feed-cursor.v1:"
_MAGIC: Final = 0x64_66_63_31  # "dfc1": a block that opens to anything else was not made here
_LAYOUT: Final = struct.Struct(">QII")  # seq, user id, magic: one 16-byte block
LENGTH: Final = 22  # base64url of 16 bytes, unpadded
PATTERN: Final = r"[A-Za-z0-9_-]{22}"


class BadCursor(ValueError):
    pass


def _cipher(secret_key: str) -> Cipher[modes.ECB]:
    key = hashlib.sha256(_CONTEXT + secret_key.encode()).digest()[:16]
    # A single block, never a message: ECB here is the bare block cipher, used as a keyed permutation.
    return Cipher(algorithms.AES(key), modes.ECB())


def seal(seq: int, user_id: int) -> str:
    """The cursor of feed position `seq` as handed to user `user_id`."""
    encryptor = _cipher(settings.SECRET_KEY).encryptor()
    block = encryptor.update(_LAYOUT.pack(seq, user_id, _MAGIC)) + encryptor.finalize()
    return base64.urlsafe_b64encode(block).decode().rstrip("=")


def well_formed(cursor: str) -> bool:
    """Shaped like a cursor (the schema's PATTERN): a cursor that is not one of the reader's is then a
    well-formed request dispatch cannot honour (422), not a malformed one (400)."""
    return len(cursor) == LENGTH and re.fullmatch(PATTERN, cursor) is not None


def unseal(cursor: str, user_id: int) -> int:
    """The seq a cursor sealed for `user_id` holds; BadCursor when it is not one."""
    refused = BadCursor(f"{cursor!r} is not a cursor this feed handed you (one from an answer, or 'now')")
    if len(cursor) != LENGTH or not cursor.isascii():
        raise refused
    try:
        block = base64.urlsafe_b64decode(cursor + "==")
    except (binascii.Error, ValueError):
        raise refused from None
    for key in (settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ())):
        decryptor = _cipher(key).decryptor()
        seq, owner, magic = _LAYOUT.unpack(decryptor.update(block) + decryptor.finalize())
        if magic == _MAGIC and owner == user_id:
            return int(seq)
    raise refused
