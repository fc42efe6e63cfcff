"""Decoding a large exact value in slices, so reading it back never freezes the event loop.

msgspec holds the GIL while it decodes: a 90 MB document is one multi-second stall of the
caller's loop, whichever thread runs it. When the writer streamed a long array in slices it
recorded where each slice's elements lie (a :class:`Span` per array). The reader decodes
each slice on its own (``[`` + elements + ``]`` as ``list[T]``), yields to the loop between
slices, decodes the rest of the document with those arrays emptied, and puts the items back.
A large string-keyed object is streamed in sorted key slices the same way: its span says
``mapping``, each slice is decoded as ``{`` + members + ``}`` against the field's
``dict[str, V]``, and the slices are merged in order.

This is only done where it provably gives the same value and the same validation as one
whole decode: the array is the top-level value or a field of a top-level struct, its type is a
plain ``list[T]`` or ``dict[str, V]`` (no length or key constraints), the struct has no
``__post_init__``, and the spans tile the array exactly with commas between them. Anything
else is decoded whole. A span is a cutting hint over bytes that were already digest-checked,
never a source of data: a wrong hint makes a slice fail to decode, and then the whole
document is decoded instead.

A layout is stored in the index, which an attacker may rewrite, so a span's *field name* is
checked too: the document with each cut array replaced by a numbered marker is decoded as
``dict[str, Raw]``, and each named top-level field must hold exactly its own marker (a span
naming the wrong field, or pointing at a nested array, fails this). Slice boundaries need no
such check: a cut anywhere but between two elements of that array leaves a slice with an open
string or bracket, which does not decode.

The writer also records how many items each slice holds. A count cannot be checked without
decoding the slice, so counts are believed only from a *sealed* layout: the store signs each
span with its key, bound to the entry (:func:`seal_layout`), and :func:`open_layout` keeps
the counts of the spans whose seal verifies. :func:`decode_layout` (the cutting hint) never
keeps them.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi

from ._canonical import Span, decode_exact

__all__ = [
    "Landed",
    "Sign",
    "Span",
    "decode_layout",
    "decode_sliced",
    "encode_layout",
    "open_layout",
    "plain_container",
    "seal_layout",
    "share_decodes",
    "type_info",
]

#: The store's keyed signature of a message bound to one entry, as hex.
Sign = Callable[[bytes], str]


_LAYOUT_ENCODER = msgspec.json.Encoder()
_LAYOUT_DECODER = msgspec.json.Decoder(tuple[Span, ...])
_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])
#: Numbers the field markers start from: rare in real data, so the fast path is kept.
_MARKER = 7_355_608_000_000_000_000


def encode_layout(spans: Sequence[Span]) -> bytes:
    """The layout as stored beside an entry."""
    return _LAYOUT_ENCODER.encode(tuple(spans))


def decode_layout(data: bytes | None) -> tuple[Span, ...]:
    """The stored layout as a cutting hint (no counts); an unreadable one is no layout."""
    return tuple(_hint(span) for span in _decoded(data))


def seal_layout(spans: Sequence[Span], sign: Sign) -> bytes:
    """The layout as stored beside an entry, each span sealed by ``sign``."""
    return encode_layout([msgspec.structs.replace(s, seal=sign(_signed(s))) for s in spans])


def open_layout(data: bytes | None, sign: Sign) -> tuple[Span, ...]:
    """The stored layout, with item counts kept only where the span's seal verifies.

    An unsealed span (an older writer's), a wrong seal, or counts that cannot describe the
    slices leave a hint without counts: the reader counts the items itself.
    """
    opened = []
    for span in _decoded(data):
        plausible = len(span.counts) == len(span.slices) and all(n > 0 for n in span.counts)
        if span.seal and plausible and hmac.compare_digest(sign(_signed(span)), span.seal):
            opened.append(msgspec.structs.replace(span, seal=""))
        else:
            opened.append(_hint(span))
    return tuple(opened)


def _decoded(data: bytes | None) -> tuple[Span, ...]:
    if not data:
        return ()
    try:
        return _LAYOUT_DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return ()


def _hint(span: Span) -> Span:
    return Span(span.field, span.start, span.end, span.slices, mapping=span.mapping)


def _signed(span: Span) -> bytes:
    """What a span's seal covers: every field but the seal.

    ``mapping`` is covered only when set, so seals made before it existed still verify.
    """
    fields = (span.field, span.start, span.end, span.slices, span.counts)
    return _LAYOUT_ENCODER.encode((*fields, True) if span.mapping else fields)


@dataclass(frozen=True, slots=True)
class _Cut:
    attr: str | None  # struct attribute to put the items back into; None for the top level
    span: Span
    item_list_type: Any  # list[T], or dict[str, V] for a mapping span


# ``mi.type_info`` evaluates the schema's annotations anew each call (about 0.2 ms for a small
# struct): more than storing a 2 KB value costs, paid by every compaction. Types are immutable.
type_info = functools.lru_cache(maxsize=256)(mi.type_info)


def plain_container(info: mi.Type) -> bool | None:
    """True for a plain ``dict[str, V]``, False for a plain ``list[T]``, None otherwise.

    Plain: slices decoded apart and joined are the same as one decode of the container. A
    length bound applies to the whole, not to a slice; a key constraint or a key type other
    than ``str`` (keys may merge across slices) is left to the whole decode too.
    """
    if isinstance(info, mi.ListType):
        mapping = False
    elif isinstance(info, mi.DictType) and info.key_type == mi.StrType():
        mapping = True
    else:
        return None
    return mapping if info.min_length is None and info.max_length is None else None


def _plain(info: mi.Type, span: Span) -> bool:
    """Whether ``info`` is the plain container kind ``span`` records."""
    return plain_container(info) is span.mapping


@functools.lru_cache(maxsize=256)
def _list_decoder(list_type: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(list_type)


def _plan(
    data: bytes | memoryview, schema: Any, spans: tuple[Span, ...], *, landed: bool = True
) -> list[_Cut] | None:
    """The cut containers in byte order, or None: the document is decoded whole."""
    # landed=False: the bytes are still landing; each slice's marks are checked as it lands.
    if not spans:
        return None
    cuts: list[_Cut] = []
    info = type_info(schema)
    if isinstance(info, mi.StructType):
        cls = info.cls
        if info.array_like or hasattr(cls, "__post_init__"):
            return None
        by_name = {f.encode_name: f for f in info.fields}
        types = {f.name: f.type for f in msgspec.structs.fields(cls)}
        for span in spans:
            field = by_name.get(span.field) if span.field is not None else None
            if field is None or not _plain(field.type, span):
                return None
            cuts.append(_Cut(field.name, span, types[field.name]))
    elif len(spans) == 1 and spans[0].field is None and _plain(info, spans[0]):
        # The top-level array is the whole document: a span over a nested array is not it.
        if spans[0].start != 0 or spans[0].end != len(data):
            return None
        cuts.append(_Cut(None, spans[0], schema))
    else:
        return None
    cuts.sort(key=lambda c: c.span.start)
    previous_end = 0
    for cut in cuts:
        laid = _tiles(data, cut.span) if landed else _shaped(cut.span, len(data))
        if not laid or cut.span.start < previous_end:
            return None
        previous_end = cut.span.end
    return cuts


def _tiles(data: bytes | memoryview, span: Span) -> bool:
    """Whether ``span``'s slices tile its container in ``data`` exactly, commas between."""
    return _shaped(span, len(data)) and all(_marked(data, span, i) for i in range(len(span.slices)))


def _shaped(span: Span, size: int) -> bool:
    """Whether the slices follow each other from just inside ``start`` to just inside ``end``."""
    start, end, slices = span.start, span.end, span.slices
    if not slices or not (0 <= start < end <= size):
        return False
    expected = start + 1
    for a, b in slices:
        if a != expected or b <= a:
            return False
        expected = b + 1
    return expected == end


def _marked(data: bytes | memoryview, span: Span, i: int) -> bool:
    """Whether slice ``i`` ends at a comma (the last at the closing bracket), no byte past."""
    # ... and whether the first begins just after the opening bracket.
    a, b = span.slices[i]
    opening, closing = b"{}" if span.mapping else b"[]"
    if i == 0 and data[a - 1] != opening:
        return False
    return data[b] == (closing if b == span.end - 1 else ord(","))


async def decode_sliced(
    data: bytes | memoryview,
    schema: Any,
    spans: tuple[Span, ...],
    checkpoint: Callable[[], Awaitable[None]],
    landed: Landed | None = None,
) -> Any:
    """Decode ``data`` against ``schema``, slice by slice where the layout allows.

    Same result and the same ``ValueError`` cases as :func:`decode_exact` on the whole.
    ``landed``: the bytes are still landing (a read under way); no byte is looked at before
    ``await landed(end)`` has returned for an ``end`` past it.
    """
    landed = landed or _landed_already
    cuts = _plan(data, schema, spans, landed=landed is _landed_already)
    if cuts is None:
        await landed(len(data))
        return decode_exact(data, schema)
    view = memoryview(data)
    items: dict[str | None, list[Any] | dict[str, Any]] = {}
    try:
        for cut in cuts:
            items[cut.attr] = await _decode_cut(view, cut, checkpoint, landed)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        # Either the data is invalid (the whole decode says so, with msgspec's message) or
        # the hint was wrong (the whole decode is right).
        await landed(len(data))
        return decode_exact(data, schema)
    if None in items:
        return items[None]
    await landed(len(data))
    if not _placed_where_named(view, cuts):
        return decode_exact(data, schema)  # a forged layout: only the whole decode is right
    empty = [b"{}" if cut.span.mapping else b"[]" for cut in cuts]
    outer = decode_exact(_outer(view, cuts, empty.__getitem__), schema)
    return msgspec.structs.replace(outer, **{str(k): v for k, v in items.items()})


#: Waits until the first ``end`` bytes of the document have landed.
Landed = Callable[[int], Awaitable[None]]


async def _landed_already(end: int) -> None:  # the bytes were all there from the start
    pass


async def _decode_cut(
    view: memoryview, cut: _Cut, checkpoint: Callable[[], Awaitable[None]], landed: Landed
) -> list[Any] | dict[str, Any]:
    """One cut container, decoded a slice at a time with the loop's turn in between.

    Members of an object decoded apart and merged in order make the same dict as one decode
    (a repeated key keeps its first place and its last value either way).
    """
    decoder = _list_decoder(cut.item_list_type)
    opening, closing = (b"{", b"}") if cut.span.mapping else (b"[", b"]")
    merged: list[Any] | dict[str, Any] = {} if cut.span.mapping else []
    marked = landed is _landed_already  # else each slice's marks are checked as it lands
    for i, (a, b) in enumerate(cut.span.slices):
        if not marked:
            await landed(b + 1)
            if not _marked(view, cut.span, i):
                raise msgspec.DecodeError("a slice is not where its layout says")  # caught
        decoded = _some(decoder.decode(b"".join((opening, view[a:b], closing))))
        # Growing the whole is a step of its own: at 345k keys a dict's resize, at 2.7M
        # items a list's copy, took 12-15 ms in one C call, beside a 4 ms slice decode.
        await checkpoint()
        if isinstance(merged, dict):
            merged.update(decoded)
        else:
            merged.extend(decoded)
        await checkpoint()
    return merged


def _some(decoded: Any) -> Any:
    """``decoded``, unless it is empty: a slice holds one element or more.

    A slice of whitespace alone (a ``msgspec.Raw`` item of blanks is written as it is)
    decodes as an empty container, but leaves ``[1, ,2]`` in the document, which is not
    JSON: only the whole decode may judge it.
    """
    if not decoded:
        raise msgspec.DecodeError("a slice holds no element")  # caught: the whole decode runs
    return decoded


def _outer(view: memoryview, ordered: list[_Cut], placeholder: Callable[[int], bytes]) -> bytes:
    parts: list[bytes | memoryview] = []
    position = 0
    for i, cut in enumerate(ordered):
        parts += [view[position : cut.span.start], placeholder(i)]
        position = cut.span.end
    parts.append(view[position:])
    return b"".join(parts)


def _placed_where_named(view: memoryview, ordered: list[_Cut]) -> bool:
    """Whether each cut array is the whole value of the top-level field its span names.

    A marker must occur exactly once in the marked bytes: a field whose own value is the
    marker's text (``"b": [0]``) would otherwise vouch for a span moved onto it.
    """
    markers = [b"[%d]" % (_MARKER + i) for i in range(len(ordered))]
    marked = _outer(view, ordered, markers.__getitem__)
    try:
        fields = _TOP_LEVEL.decode(marked)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return False
    return all(
        marked.count(markers[i]) == 1 and bytes(fields.get(str(cut.span.field), b"")) == markers[i]
        for i, cut in enumerate(ordered)
    )


def share_decodes(
    data: bytes, schema: Any, spans: tuple[Span, ...], share: int, shares: int
) -> list[Any] | None:
    """Share ``share`` (of ``shares``) of a sliced decode of ``data``: what it decoded, or None.

    For verifying one document in several processes at once. The slices of every cut array
    are dealt out in byte order into ``shares`` runs of about equal work; share 0 also checks
    where the arrays lie and decodes the rest of the document. Every share succeeding is
    exactly :func:`decode_sliced` succeeding without falling back to a whole decode, so the
    whole decode succeeds too. None: this share failed, or the document cannot be cut; then
    only a whole decode says whether (and why) the document is invalid. What was decoded is
    returned to be freed after the reply (freeing 10 MB of small structs took 25 ms).
    """
    cuts = _plan(data, schema, spans)
    if cuts is None:
        return None
    view = memoryview(data)
    ordered = cuts  # in byte order
    decoded: list[Any] = []
    try:
        for cut, a, b in _dealt(ordered, len(data), share, shares):
            # Consecutive slices of one array, commas between (``_tiles``): one decode.
            ends = (b"{", b"}") if cut.span.mapping else (b"[", b"]")
            decoder = _list_decoder(cut.item_list_type)
            decoded.append(_some(decoder.decode(b"".join((ends[0], view[a:b], ends[1])))))
        if share == 0 and ordered[0].attr is not None:  # a struct: its fields, as decode_sliced
            if not _placed_where_named(view, ordered):
                return None
            empty = [b"{}" if cut.span.mapping else b"[]" for cut in ordered]
            decoded.append(decode_exact(_outer(view, ordered, empty.__getitem__), schema))
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, ValueError):
        return None
    return decoded


def _dealt(ordered: list[_Cut], size: int, share: int, shares: int) -> list[tuple[_Cut, int, int]]:
    """Share ``share``'s byte ranges: whole slices, merged where they follow in one array.

    Share 0's quota starts with the bytes outside the slices, counted twice (it decodes them
    twice: the placement check and the outer document); each slice goes to the share its
    middle byte falls in.
    """
    sliced = sum(b - a for cut in ordered for a, b in cut.span.slices)
    before = 2 * (size - sliced)
    total = before + sliced
    ranges: list[tuple[_Cut, int, int]] = []
    for cut in ordered:
        for a, b in cut.span.slices:
            mine = min(shares - 1, (before + (b - a) // 2) * shares // total) == share
            before += b - a
            if not mine:
                continue
            if ranges and ranges[-1][0] is cut and ranges[-1][2] + 1 == a:
                ranges[-1] = (cut, ranges[-1][1], b)  # the comma between them is taken in
            else:
                ranges.append((cut, a, b))
    return ranges
