"""Sliced decoding of large exact values: same value and same validation as one whole decode."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import msgspec
import pytest

import response_compaction as rc
from response_compaction._canonical import Span, iter_canonical
from response_compaction._slices import decode_sliced, encode_layout
from response_compaction._store._verify import WHOLE_DECODE_BYTES
from tests._store_support import rewrite_layout, store_root, stored_layout
from tests.schemas import FALLBACK, Exact, Row, Summary, big_exact

pytestmark = pytest.mark.anyio

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}


class CountingCheckpoint:
    """A checkpoint that counts its calls (also used by test_slices_mapping)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        await anyio.lowlevel.checkpoint()


class Bounded(msgspec.Struct, frozen=True):
    rows: Annotated[list[Row], msgspec.Meta(max_length=10)]
    total: int


class Checked(msgspec.Struct, frozen=True):
    rows: list[Row]
    total: int

    def __post_init__(self) -> None:
        if self.total != len(self.rows):
            raise ValueError("total does not match the rows")


def _encoded(value: object, piece_bytes: int = 4096) -> tuple[bytes, tuple[Span, ...]]:
    spans: list[Span] = []
    data = b"".join(iter_canonical(value, piece_bytes, layout=spans))
    return data, tuple(spans)


async def test_a_recorded_layout_decodes_slice_by_slice_to_the_same_value() -> None:
    """Each slice decodes on its own, a checkpoint after its decode and its join: same value."""
    value = big_exact(5000)
    data, spans = _encoded(value)
    assert len(spans) == 1
    assert spans[0].field == "rows"
    assert len(spans[0].slices) > 10
    checkpoint = CountingCheckpoint()
    assert await decode_sliced(data, Exact, spans, checkpoint) == value
    assert checkpoint.calls == 2 * len(spans[0].slices)  # after each decode, after each join


async def test_a_top_level_list_decodes_in_slices() -> None:
    """A list at the top level is sliced too."""
    rows = big_exact(3000).rows
    data, spans = _encoded(rows)
    assert spans[0].field is None
    checkpoint = CountingCheckpoint()
    assert await decode_sliced(data, list[Row], spans, checkpoint) == rows
    assert checkpoint.calls == 2 * len(spans[0].slices)


async def test_a_length_bound_on_the_list_is_checked_by_a_whole_decode() -> None:
    """A constrained list is not sliced: the bound is checked exactly as a whole decode would."""
    data, spans = _encoded(big_exact(2000))
    checkpoint = CountingCheckpoint()
    with pytest.raises(ValueError, match="length"):
        await decode_sliced(data, Bounded, spans, checkpoint)
    assert checkpoint.calls == 0


async def test_a_struct_with_post_init_is_decoded_whole() -> None:
    """__post_init__ sees the real rows, never an emptied skeleton."""
    value = big_exact(2000)
    data, spans = _encoded(value)
    checkpoint = CountingCheckpoint()
    decoded = await decode_sliced(data, Checked, spans, checkpoint)
    assert decoded == Checked(rows=value.rows, total=value.total)
    assert checkpoint.calls == 0


async def test_a_wrong_layout_falls_back_to_the_whole_decode() -> None:
    """A cut that is not at element boundaries never yields a wrong value."""
    value = big_exact(2000)
    data, spans = _encoded(value)
    span = spans[0]
    middle = (span.start + span.end) // 2
    forged = (
        Span(
            span.field, span.start, span.end, ((span.start + 1, middle), (middle + 1, span.end - 1))
        ),
    )
    assert await decode_sliced(data, Exact, forged, CountingCheckpoint()) == value


@pytest.mark.parametrize(
    ("data", "schema", "mapping"),
    [(b"[1, ,2,3]", list[int], False), (b'{"a":1, ,"b":2}', dict[str, int], True)],
)
async def test_a_slice_of_blanks_is_judged_by_the_whole_decode(
    data: bytes, schema: Any, mapping: bool
) -> None:
    """A slice holding only whitespace (a ``msgspec.Raw`` item of blanks is written as it is)
    leaves a document that is not JSON: refused, never read as the other slices' items."""
    comma = data.index(b",")
    blank = (comma + 1, comma + 2)
    slices = ((1, comma), blank, (blank[1] + 1, len(data) - 1))
    spans = (Span(None, 0, len(data), slices, mapping=mapping),)
    with pytest.raises(ValueError, match="malformed"):
        await decode_sliced(data, schema, spans, CountingCheckpoint())


async def test_invalid_content_reports_msgspecs_whole_document_error() -> None:
    """Slices that do not validate give the same error a whole decode gives."""
    value = big_exact(2000)
    data, spans = _encoded(value)

    class Strict(msgspec.Struct):
        rows: list[Annotated[Row, msgspec.Meta()]]
        total: Annotated[int, msgspec.Meta(lt=0)]

    with pytest.raises(ValueError, match=r"\$\.total"):
        await decode_sliced(data, Strict, spans, CountingCheckpoint())


async def test_large_values_read_back_exactly_through_the_store(harness: rc.Harness) -> None:
    """A value over the whole-decode size is stored with a layout and reads back Found."""
    value = big_exact(40_000)
    compacted = await rc.response_compact(harness, value, Exact, Summary, OPTIONS)
    assert compacted.receipt.exact_bytes > WHOLE_DECODE_BYTES
    found = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
    assert found == rc.Found(value=value)


async def test_a_tampered_layout_in_the_index_cannot_change_the_value(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """The layout is a cutting hint over digest-checked bytes: forging it changes nothing."""
    value = big_exact(40_000)
    compacted = await rc.response_compact(harness, value, Exact, Summary, OPTIONS)
    hex_digest = compacted.receipt.exact_ref.removeprefix("rc1:")
    root = store_root(workspace)
    forged = encode_layout([Span("rows", 8, 40, ((9, 20), (21, 39)))])
    rewrite_layout(root, hex_digest, forged)
    found = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
    assert found == rc.Found(value=value)
    rewrite_layout(root, hex_digest, b"garbage")
    found = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
    assert found == rc.Found(value=value)


async def test_a_large_exact_output_is_verified_in_slices_and_equal(harness: rc.Harness) -> None:
    """With a threshold above its size, a multi-MB value comes back as the exact output, equal."""
    value = big_exact(40_000)
    options = {**OPTIONS, "summarize_above_bytes": 16_000_000}
    compacted = await rc.response_compact(harness, value, Exact, Summary, options)
    assert compacted.receipt.exact_bytes > WHOLE_DECODE_BYTES
    assert compacted.output == rc.ExactOutput(value=value)


class TwoLists(msgspec.Struct, frozen=True):
    first: list[str]
    second: list[str]


async def test_a_layout_with_swapped_field_names_cannot_swap_the_fields(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """Swapping two fields' names in a stored layout still reads the true value (read sliced)."""
    value = TwoLists(
        first=[f"first-{i:06d}" for i in range(150_000)],
        second=[f"second-{i:06d}" for i in range(150_000)],
    )
    compacted = await rc.response_compact(harness, value, TwoLists, Summary, OPTIONS)
    assert compacted.receipt.exact_bytes > WHOLE_DECODE_BYTES
    hex_digest = compacted.receipt.exact_digest.removeprefix("sha256:")
    root = store_root(workspace)
    spans = msgspec.json.decode(stored_layout(root, hex_digest), type=tuple[Span, ...])
    assert sorted(str(span.field) for span in spans) == ["first", "second"]
    swapped = [
        Span("second" if s.field == "first" else "first", s.start, s.end, s.slices) for s in spans
    ]
    rewrite_layout(root, hex_digest, encode_layout(swapped))
    found = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, TwoLists)
    assert found == rc.Found(value=value)


class IntLists(msgspec.Struct, frozen=True):
    a: list[int]
    b: list[int]


async def test_a_span_moved_onto_a_field_whose_value_looks_like_the_marker_changes_nothing(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """A forged span naming ``b`` over ``a``'s items is refused even when ``b`` holds ``[0]``."""
    value = IntLists(a=list(range(400_000)), b=[0])
    compacted = await rc.response_compact(harness, value, IntLists, Summary, OPTIONS)
    assert compacted.receipt.exact_bytes > WHOLE_DECODE_BYTES
    hex_digest = compacted.receipt.exact_ref.removeprefix("rc1:")
    root = store_root(workspace)
    (span,) = msgspec.json.decode(stored_layout(root, hex_digest), type=tuple[Span, ...])
    assert span.field == "a"
    forged = encode_layout([Span("b", span.start, span.end, span.slices)])
    rewrite_layout(root, hex_digest, forged)
    found = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, IntLists)
    assert found == rc.Found(value=value)


async def test_a_top_level_span_over_a_nested_array_changes_nothing(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """For a top-level list schema, a forged span over a nested array is not the whole value."""
    value = [{"nested": [{"i": i} for i in range(300_000)]}, {"z": 1}]
    schema = list[dict[str, Any]]
    compacted = await rc.response_compact(harness, value, schema, Summary, OPTIONS)
    assert compacted.receipt.exact_bytes > WHOLE_DECODE_BYTES
    data = msgspec.json.encode(value, order="sorted")
    start = data.index(b"[", 1)
    end = data.index(b"]", start) + 1
    forged = encode_layout([Span(None, start, end, ((start + 1, end - 1),))])
    hex_digest = compacted.receipt.exact_ref.removeprefix("rc1:")
    rewrite_layout(store_root(workspace), hex_digest, forged)
    found = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, schema)
    assert found == rc.Found(value=value)


async def test_a_span_naming_a_field_but_pointing_at_a_nested_array_changes_nothing() -> None:
    """A span that names a top-level field but cuts an array nested elsewhere is not believed."""

    class Outer(msgspec.Struct, frozen=True):
        rows: list[int]
        other: dict[str, list[int]]

    value = Outer(rows=[], other={"rows": [1, 2, 3]})
    data = msgspec.json.encode(value, order="sorted")
    start = data.index(b"[1,2,3]")
    forged = (Span("rows", start, start + 7, ((start + 1, start + 6),)),)
    assert await decode_sliced(data, Outer, forged, CountingCheckpoint()) == value
