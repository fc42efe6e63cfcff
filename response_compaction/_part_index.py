"""Where the items of a large array lie, so a part of it is found without scanning it all.

When the writer streamed a long array in slices it recorded each slice's byte range and item
count (a :class:`Span`). That record lives in the index, outside the digest: unsealed, it is
only a hint, used after these checks against the bytes and ignored when any fails. Sealed
with the store's key (see below), its slices and counts are the writer's own, and only the
cheap checks are kept: the tiling, the field's placement, and each slice that is decoded to
show an item holding the items counted.

- The array's position: the top-level array spans the whole document; a field's array is
  replaced by a placeholder found nowhere else and the outer object is decoded: the field's
  value must be that placeholder, so the span is exactly the field's value, not text inside a
  string or another field.
- The slices tile the array with one comma between them, and each ``[`` + slice + ``]``
  decodes as a list. A JSON parser is in the same state after ``[`` as at the array's first
  item, so a slice that decodes on its own holds whole items (a cut inside a string or a
  nested value leaves it unbalanced; a cut inside a number is impossible next to a comma).

Which item a slice starts with needs the items of every slice before it counted. A span that
carries ``counts`` (only the store's :func:`~._slices.open_layout` leaves them, when the store's
key sealed them to this entry, or the writer's own in-memory layout) gives them at once, with
no slice decoded: the writer encoded exactly those items, and nothing is shown unless the
bytes verify. A slice decoded to show an item is checked against its count all the same (it
costs nothing more; a mismatch is :class:`LayoutMismatchError`, a row forged with the key).
Without counts each slice is decoded as ``list[Raw]`` (about a millisecond a megabyte), with the
caller's checkpoint in between, so the event loop never waits on a long scan; those counts are
a pure function of the bytes and the span, so they are remembered per digest.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import re
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import overload

import msgspec
from msgspec import Raw

from ._canonical import Span
from ._forks import new_lock_in_child
from ._slices import _tiles

__all__ = [
    "BigArray",
    "LayoutMismatchError",
    "Node",
    "RootObject",
    "forget_counts",
    "index_document",
    "remember",
]

_LIST = msgspec.json.Decoder(list[Raw])
_DICT = msgspec.json.Decoder(dict[str, Raw])
_PLACEHOLDER = 7_355_608_000_000_000_000  # an int64 no canonical writer puts next to "["
_PLACEHOLDERS = re.compile(rb"\[%d\d{12}\]" % (_PLACEHOLDER // 10**12))  # any of them
_Where = tuple[str, str | None, int, int, tuple[tuple[int, int], ...]]
_COUNTS: collections.OrderedDict[_Where, tuple[int, ...]] = collections.OrderedDict()
_COUNTS_LOCK = threading.Lock()
_COUNTS_KEPT = 64
new_lock_in_child(globals(), "_COUNTS_LOCK")


class LayoutMismatchError(msgspec.DecodeError):
    """A slice does not hold the number of items its layout says (a forged sealed layout)."""


@dataclass(slots=True)
class BigArray:
    """A checked array inside the document: its slices and the items before each slice's end."""

    view: memoryview
    start: int
    end: int
    slices: tuple[tuple[int, int], ...]
    ends: tuple[int, ...]
    _cached: tuple[int, list[Raw]] = field(default=(-1, []))

    @property
    def size(self) -> int:
        """The array's size in bytes."""
        return self.end - self.start

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def raw_bytes(self) -> bytes:
        """The array's JSON (only ever asked for when it fits a part)."""
        return bytes(self.view[self.start : self.end])

    def items(self) -> _Items:
        """The items as a sequence that decodes one slice at a time."""
        return _Items(self)

    def item(self, index: int) -> Raw:
        """Item ``index``, decoding only the slice that holds it."""
        k = bisect.bisect_right(self.ends, index)
        before = self.ends[k - 1] if k else 0
        if self._cached[0] != k:
            a, b = self.slices[k]
            items = _LIST.decode(b"".join((b"[", self.view[a:b], b"]")))
            if len(items) != self.ends[k] - before:
                raise LayoutMismatchError("a slice does not hold the items its layout says")
            self._cached = (k, items)
        return self._cached[1][index - before]


class _Items(Sequence[Raw]):
    def __init__(self, array: BigArray) -> None:
        self._array = array

    def __len__(self) -> int:
        return len(self._array)

    @overload
    def __getitem__(self, index: int) -> Raw: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Raw]: ...
    def __getitem__(self, index: int | slice) -> Raw | Sequence[Raw]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._array.item(index)


@dataclass(frozen=True, slots=True)
class RootObject:
    """The top-level object, its large array fields as :class:`BigArray`, the rest as Raw."""

    members: dict[str, Raw | BigArray]
    size: int


Node = bytes | memoryview | Raw | BigArray | RootObject


async def index_document(
    data: bytes | memoryview,
    spans: Sequence[Span],
    hex_digest: str,
    checkpoint: Callable[[], Awaitable[None]],
) -> Node:
    """The document as a node whose large arrays can be read in slices, or ``data`` itself.

    A span's ``counts``, when it has them, are believed: pass only spans the store opened
    (sealed counts) or the writer's own. ``data`` may still be unverified: nothing learned
    from it is remembered until :func:`remember` is called for its digest.
    """
    # An object's members are not items: a mapping span only serves a whole decode.
    spans = [span for span in spans if not span.mapping]
    if not spans:
        return data
    view = memoryview(data)
    arrays: list[BigArray] = []
    for span in spans:
        if not _tiles(data, span):
            return data
        ends = await _item_ends(view, span, hex_digest, checkpoint)
        if ends is None:
            return data
        arrays.append(BigArray(view, span.start, span.end, span.slices, ends))
    if len(spans) == 1 and spans[0].field is None:
        whole = spans[0].start == 0 and spans[0].end == len(data)
        return arrays[0] if whole else data
    root = _root_object(data, spans, arrays)
    return data if root is None else root


async def _item_ends(
    view: memoryview, span: Span, hex_digest: str, checkpoint: Callable[[], Awaitable[None]]
) -> tuple[int, ...] | None:
    if span.counts:
        if len(span.counts) != len(span.slices):
            return None
        return tuple(itertools.accumulate(span.counts))
    with _COUNTS_LOCK:
        known = _COUNTS.get(_where(hex_digest, span))
    if known is not None:
        return known
    ends: list[int] = []
    total = 0
    for a, b in span.slices:
        try:
            total += len(_LIST.decode(b"".join((b"[", view[a:b], b"]"))))
        except msgspec.DecodeError:
            return None
        ends.append(total)
        await checkpoint()
    return tuple(ends)


def remember(hex_digest: str, node: Node) -> None:
    """Keep the item counts learned from bytes that have now verified against ``hex_digest``."""
    arrays = [node] if isinstance(node, BigArray) else []
    if isinstance(node, RootObject):
        arrays = [m for m in node.members.values() if isinstance(m, BigArray)]
    with _COUNTS_LOCK:
        for array in arrays:
            key = _where(hex_digest, _span_of(array, node))
            _COUNTS[key] = array.ends
            _COUNTS.move_to_end(key)
        while len(_COUNTS) > _COUNTS_KEPT:
            _COUNTS.popitem(last=False)


def forget_counts() -> None:
    """Forget every remembered count, as a fresh process starts (a seam for tests)."""
    with _COUNTS_LOCK:
        _COUNTS.clear()


def _where(hex_digest: str, span: Span) -> _Where:
    return (hex_digest, span.field, span.start, span.end, span.slices)


def _span_of(array: BigArray, node: Node) -> Span:
    name = None
    if isinstance(node, RootObject):
        name = next(k for k, v in node.members.items() if v is array)
    return Span(name, array.start, array.end, array.slices)


def _root_object(
    data: bytes | memoryview, spans: Sequence[Span], arrays: list[BigArray]
) -> RootObject | None:
    ordered = sorted(zip(spans, arrays, strict=True), key=lambda pair: pair[0].start)
    parts: list[bytes | memoryview] = []
    view = memoryview(data)
    position = 0
    placeholders: dict[str, tuple[bytes, BigArray]] = {}
    for i, (span, array) in enumerate(ordered):
        if span.field is None or span.start < position or span.field in placeholders:
            return None
        placeholder = b"[%d]" % (_PLACEHOLDER + i)
        placeholders[span.field] = (placeholder, array)
        parts += [view[position : span.start], placeholder]
        position = span.end
    parts.append(view[position:])
    outer = b"".join(parts)
    try:
        decoded = _DICT.decode(outer)
    except msgspec.DecodeError:
        return None
    members: dict[str, Raw | BigArray] = dict(decoded)
    for name, (placeholder, array) in placeholders.items():
        value = decoded.get(name)
        if value is None or bytes(value) != placeholder:
            return None
        members[name] = array
    # Each read back as its field's value and none found anywhere else in the outer bytes:
    # each span is exactly that value (not text inside a string, not another field). One
    # pass for all: a count per placeholder was quadratic (40,000 forged spans, unverified
    # bytes, held the event loop 20 s).
    if len(_PLACEHOLDERS.findall(outer)) != len(placeholders):
        return None
    return RootObject(members=members, size=len(data))
