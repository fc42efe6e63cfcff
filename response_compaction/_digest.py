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
from typing import Any

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
    # HMAC (RFC 2104) from the key's two pads hashed once per key: ``hmac.digest`` hashes
    # them again on every call, 2.35 against 1.68 us for 2 KB (every small read and put).
    inner, outer = _pads.get(key) or _padded(key)
    inner = inner.copy()
    inner.update(data)
    outer = outer.copy()
    outer.update(inner.digest())
    hex_digest: str = outer.hexdigest()
    return hex_digest


_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))
# The hashes of each key's pads, never updated themselves (copied per digest): a few keys
# per process (one per store).
_pads: dict[bytes, tuple[Any, Any]] = {}


def _padded(key: bytes) -> tuple[Any, Any]:
    block = (key if len(key) <= 64 else hashlib.sha256(key).digest()).ljust(64, b"\0")
    pads = (hashlib.sha256(block.translate(_IPAD)), hashlib.sha256(block.translate(_OPAD)))
    if len(_pads) >= 16:
        _pads.clear()
    _pads[bytes(key)] = pads
    return pads


def digest_of(key: bytes, data: bytes | memoryview) -> str:
    """``"sha256:" + hex`` (HMAC-SHA256 under the key) of ``data``, as receipts carry it."""
    return DIGEST_PREFIX + digest_hex(key, data)


def matches(key: bytes, data: bytes | memoryview, hex_digest: str) -> bool:
    """Whether ``data``'s keyed digest is ``hex_digest`` (compared in constant time)."""
    return hmac.compare_digest(digest_hex(key, data), hex_digest)
