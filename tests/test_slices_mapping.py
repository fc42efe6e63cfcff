"""Sliced decoding of large dicts: a mapping span reads back the same value as a whole decode."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

import anyio
import msgspec
import pytest

import response_compaction as rc
from response_compaction._canonical import Span, iter_canonical
from response_compaction._part import part_of
from response_compaction._part_index import RootObject, index_document
from response_compaction._profile import decode_canonical
from response_compaction._slices import (
    decode_layout,
    decode_sliced,
    encode_layout,
    open_layout,
    seal_layout,
)
from response_compaction._store._verify import WHOLE_DECODE_BYTES
from tests._store_support import rewrite_layout, store_root, stored_layout
from tests.schemas import FALLBACK, Summary
from tests.test_slices import CountingCheckpoint

pytestmark = pytest.mark.anyio

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}


class Strings(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    words: list[str]
    labels: dict[str, str]


class TwoMaps(msgspec.Struct, frozen=True):
    first: dict[str, int]
    second: dict[str, int]


class BoundedMap(msgspec.Struct, frozen=True):
    labels: Annotated[dict[str, str], msgspec.Meta(max_length=10)]


class ShortKeys(msgspec.Struct, frozen=True):
    labels: dict[Annotated[str, msgspec.Meta(max_length=3)], str]


def strings(count: int) -> Strings:
    return Strings(
        source='s\u00e9"\\',
        words=[f"w{i}" for i in range(count)],
        labels={f"key-{i:07d}\u00e9": f'label "{i}"' for i in range(count)},
    )


def _encoded(value: object, piece_bytes: int = 4096) -> tuple[bytes, tuple[Span, ...]]:
    spans: list[Span] = []
    data = b"".join(iter_canonical(value, piece_bytes, layout=spans))
    return data, tuple(spans)


def _mapping_span(spans: tuple[Span, ...]) -> Span:
    (span,) = [s for s in spans if s.mapping]
    return span


async def test_a_dict_field_decodes_slice_by_slice_to_the_same_value() -> None:
    """The writer records a mapping span for a struct's dict field; each slice is a checkpoint."""
    value = strings(5000)
    data, spans = _encoded(value)
    labels = _mapping_span(spans)
    assert labels.field == "labels"
    assert len(labels.slices) > 10
    assert sum(labels.counts) == 5000
    checkpoint = CountingCheckpoint()
    decoded = await decode_sliced(data, Strings, spans, checkpoint)
    assert decoded == value
    assert list(decoded.labels) == sorted(value.labels)  # the canonical (sorted) order
    assert checkpoint.calls == 2 * sum(len(s.slices) for s in spans)  # decode, merge


async def test_a_top_level_dict_decodes_in_slices() -> None:
    """A string-keyed dict at the top level is sliced too."""
    value = {f"k{i:06d}": i for i in range(4000)}
    data, spans = _encoded(value)
    span = _mapping_span(spans)
    assert (span.field, span.start, span.end) == (None, 0, len(data))
    checkpoint = CountingCheckpoint()
    assert await decode_sliced(data, dict[str, int], spans, checkpoint) == value
    assert checkpoint.calls == 2 * len(span.slices) > 2


async def test_a_dict_that_fits_one_slice_records_no_span() -> None:
    """Only a dict the writer actually cut gets a span, so small layouts stay small."""
    _, spans = _encoded({"a": 1, "b": 2})
    assert spans == ()


async def test_constrained_dicts_are_checked_by_a_whole_decode() -> None:
    """A length bound on the dict or a key constraint is checked exactly as a whole decode."""
    data, spans = _encoded(strings(2000))
    checkpoint = CountingCheckpoint()
    with pytest.raises(ValueError, match="length"):
        await decode_sliced(data, BoundedMap, spans, checkpoint)
    with pytest.raises(ValueError, match="length"):
        await decode_sliced(data, ShortKeys, spans, checkpoint)
    assert checkpoint.calls == 0


async def test_forged_mapping_spans_give_the_whole_decode() -> None:
    """Wrong field, swapped fields, a span moved or cut mid-member, a flag dropped: same value."""
    value = TwoMaps(
        first={f"a{i:05d}": i for i in range(3000)}, second={f"b{i:05d}": -i for i in range(3000)}
    )
    data, spans = _encoded(value)
    first, second = sorted(spans, key=lambda s: s.start)
    assert (first.field, second.field, first.mapping, second.mapping) == (
        "first",
        "second",
        True,
        True,
    )
    middle = (first.start + first.end) // 2
    forgeries = [
        (Span("second", first.start, first.end, first.slices, mapping=True),),
        (
            Span("second", first.start, first.end, first.slices, mapping=True),
            Span("first", second.start, second.end, second.slices, mapping=True),
        ),
        (Span("first", first.start + 1, first.end, first.slices[1:], mapping=True),),
        (Span("first", first.start, first.end, first.slices),),  # no longer says mapping
        (
            Span(
                "first",
                first.start,
                first.end,
                ((first.start + 1, middle), (middle + 1, first.end - 1)),
                mapping=True,
            ),
        ),
    ]
    for forged in forgeries:
        assert await decode_sliced(data, TwoMaps, forged, CountingCheckpoint()) == value


async def test_a_mapping_span_naming_a_field_but_over_a_nested_dict_changes_nothing() -> None:
    """A span over a dict nested in another field is not the named field's value."""

    class Outer(msgspec.Struct, frozen=True):
        labels: dict[str, int]
        other: dict[str, dict[str, int]]

    value = Outer(labels={}, other={"labels": {"x": 1, "y": 2}})
    data = msgspec.json.encode(value, order="sorted")
    start = data.index(b'{"x"')
    end = data.index(b"}", start) + 1
    mid = data.index(b",", start)
    forged = (Span("labels", start, end, ((start + 1, mid), (mid + 1, end - 1)), mapping=True),)
    assert await decode_sliced(data, Outer, forged, CountingCheckpoint()) == value


async def test_old_layouts_and_old_seals_still_read() -> None:
    """A layout written before ``mapping`` decodes, and its seal still verifies."""

    def sign(message: bytes) -> str:
        return hmac.new(b"k" * 32, message, hashlib.sha256).hexdigest()

    old = msgspec.json.encode([["rows", 8, 40, [[9, 20], [21, 39]], [3, 4]]])
    (span,) = decode_layout(old)
    assert (span.field, span.slices, span.mapping) == ("rows", ((9, 20), (21, 39)), False)
    # The seal an older store made covers the five fields it knew.
    seal = sign(msgspec.json.encode(["rows", 8, 40, [[9, 20], [21, 39]], [3, 4]]))
    sealed_old = msgspec.json.encode([["rows", 8, 40, [[9, 20], [21, 39]], [3, 4], seal]])
    assert open_layout(sealed_old, sign)[0].counts == (3, 4)
    mapping = Span("labels", 8, 40, ((9, 20), (21, 39)), (3, 4), mapping=True)
    (opened,) = open_layout(seal_layout([mapping], sign), sign)
    assert (opened.counts, opened.mapping) == ((3, 4), True)
    # The seal covers the flag: a span sealed as an array cannot be passed off as a mapping.
    as_array = msgspec.structs.replace(mapping, mapping=False)
    flipped = msgspec.json.decode(seal_layout([as_array], sign), type=tuple[Span, ...])
    forged = encode_layout([msgspec.structs.replace(flipped[0], mapping=True)])
    (opened,) = open_layout(forged, sign)
    assert (opened.counts, opened.mapping) == ((), True)
    assert decode_layout(encode_layout([mapping]))[0].mapping


async def test_read_part_leaves_mapping_spans_to_the_whole_scan() -> None:
    """index_document cuts only arrays; a part of the dict equals the whole scan's part."""
    value = strings(3000)
    data, spans = _encoded(value)
    node = await index_document(data, spans, "mapping", anyio.lowlevel.checkpoint)
    assert isinstance(node, RootObject)
    assert isinstance(node.members["labels"], msgspec.Raw)
    for where in ("/labels", "/words", "/labels/key-0000007\u00e9", ""):
        assert part_of(node, where, max_bytes=2000) == part_of(data, where, max_bytes=2000)
    assert decode_canonical(data, spans) == msgspec.json.decode(data)


async def test_a_large_dict_round_trips_through_the_store(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """Read sliced, the exact output and read_exact are equal, and the index holds the span."""
    value = strings(120_000)
    options = {**OPTIONS, "summarize_above_bytes": 16_000_000}
    compacted = await rc.response_compact(harness, value, Strings, Summary, options)
    assert compacted.receipt.exact_bytes > WHOLE_DECODE_BYTES
    assert compacted.output == rc.ExactOutput(value=value)
    found = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Strings)
    assert found == rc.Found(value=value)
    hex_digest = compacted.receipt.exact_ref.removeprefix("rc1:")
    span = _mapping_span(decode_layout(stored_layout(store_root(workspace), hex_digest)))
    assert span.field == "labels"
    assert len(span.slices) > 1


async def test_a_forged_mapping_span_in_the_index_cannot_change_the_value(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """Swapping two dict fields' names in the stored layout still reads the true value."""
    value = TwoMaps(
        first={f"a{i:06d}": i for i in range(150_000)},
        second={f"b{i:06d}": -i for i in range(150_000)},
    )
    compacted = await rc.response_compact(harness, value, TwoMaps, Summary, OPTIONS)
    assert compacted.receipt.exact_bytes > WHOLE_DECODE_BYTES
    hex_digest = compacted.receipt.exact_ref.removeprefix("rc1:")
    root = store_root(workspace)
    spans = decode_layout(stored_layout(root, hex_digest))
    assert sorted((str(s.field), s.mapping) for s in spans) == [
        ("first", True),
        ("second", True),
    ]
    names = {"first": "second", "second": "first"}
    swapped = [Span(names[str(s.field)], s.start, s.end, s.slices, mapping=True) for s in spans]
    rewrite_layout(root, hex_digest, encode_layout(swapped))
    found = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, TwoMaps)
    assert found == rc.Found(value=value)
