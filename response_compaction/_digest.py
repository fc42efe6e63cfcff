"""The store's keyed digest. Pure: no I/O.

A plain sha256 of the canonical bytes would let anyone holding a receipt or a reference test
guesses offline: ``{"pin":"4821"}`` falls to ten thousand hashes. Every store therefore has its
own secret key (32 random bytes, created once, 0600, beside the index), and entries are named
and checked by HMAC-SHA256 under that key. Equal values still get equal digests within one
store (dedup and the summary cache keep working) and every read still recomputes the digest
over the bytes it returns; across stores, digests of one value differ and say nothing.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["DIGEST_PREFIX", "KEY_BYTES", "digest_hex", "digest_of", "matches", "new_hasher"]

#: The prefix receipts carry. The contract fixes the shape ``"sha256:" + 64 hex``; the hex is
#: SHA-256 in HMAC mode under the store's key, so it is not the plain sha256 of the bytes.
DIGEST_PREFIX = "sha256:"
#: Length of a store key.
KEY_BYTES = 32


def new_hasher(key: bytes) -> hmac.HMAC:
    """A streaming keyed hasher: ``update`` it with each piece, then ``hexdigest``."""
    return hmac.new(key, digestmod=hashlib.sha256)


def digest_hex(key: bytes, data: bytes | memoryview) -> str:
    """The 64 hex characters of ``data``'s keyed digest."""
    return hmac.digest(key, data, "sha256").hex()


def digest_of(key: bytes, data: bytes | memoryview) -> str:
    """``"sha256:" + hex`` (HMAC-SHA256 under the key) of ``data``, as receipts carry it."""
    return DIGEST_PREFIX + digest_hex(key, data)


def matches(key: bytes, data: bytes | memoryview, hex_digest: str) -> bool:
    """Whether ``data``'s keyed digest is ``hex_digest`` (compared in constant time)."""
    return hmac.compare_digest(digest_hex(key, data), hex_digest)
