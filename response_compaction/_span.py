"""Where a streamed array or object lies in an entry's canonical bytes. Pure."""

from __future__ import annotations

import msgspec

__all__ = ["Span"]


class Span(msgspec.Struct, frozen=True, array_like=True):
    """Where a streamed array (or object) lies in the canonical bytes, for a sliced decode.

    ``field`` is the encoded field name in a top-level struct, or None when the array is the
    top-level value; ``start``/``end`` bound its brackets; ``slices`` are the ``[a, b)`` byte
    ranges of each slice's elements (consecutive slices are separated by one comma);
    ``counts`` the number of items the writer put in each slice. ``seal`` is set by the store
    (HMAC under its key, see ``_slices.seal_layout``): only a sealed span's counts are ever
    believed. ``mapping`` marks a string-keyed object streamed in sorted key slices (its
    ``start``/``end`` bound its braces). All three have defaults, so layouts written before
    them still decode, and a reader that does not know them ignores them (array-like structs
    drop trailing elements; an older reader's bracket check refuses a mapping span).
    """

    field: str | None
    start: int
    end: int
    slices: tuple[tuple[int, int], ...]
    counts: tuple[int, ...] = ()
    seal: str = ""
    mapping: bool = False
