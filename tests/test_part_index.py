"""Large arrays read through the writer's layout: the hint is checked, never trusted."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio.lowlevel
import msgspec
import pytest

import response_compaction as rc
from response_compaction._canonical import Span, iter_canonical
from response_compaction._part import part_of
from response_compaction._part_index import BigArray, RootObject, index_document
from response_compaction._slices import decode_layout, encode_layout
from tests.schemas import FALLBACK, Exact, Row, Summary, big_exact

pytestmark = pytest.mark.anyio

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}


def encoded(value: Any, piece_bytes: int = 2000) -> tuple[bytes, list[Span]]:
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(value, piece_bytes, layout))
    return data, layout


async def index(data: bytes, spans: list[Span]) -> Any:
    return await index_document(data, spans, "test-" + str(id(spans)), anyio.lowlevel.checkpoint)


async def test_struct_field_arrays_become_big_arrays() -> None:
    """A checked field span is read slice by slice, and parts equal the plain scan's parts."""
    value = big_exact(500)
    data, spans = encoded(value)
    assert len(spans) == 1
    assert len(spans[0].slices) > 3
    node = await index(data, spans)
    assert isinstance(node, RootObject)
    rows = node.members["rows"]
    assert isinstance(rows, BigArray)
    assert len(rows) == 500
    for kwargs in (
        {"pointer": "/rows", "start": 0, "max_bytes": 1000},
        {"pointer": "/rows", "start": 333, "max_bytes": 700},
        {"pointer": "/rows/499/name"},
        {"pointer": "", "max_bytes": 256},
        {"pointer": "/total"},
    ):
        assert part_of(node, **kwargs) == part_of(data, **kwargs), kwargs


async def test_top_level_array_becomes_a_big_array() -> None:
    """A top-level array's span must cover the whole document."""
    value = [Row(id=i, name="r" * (i % 7)) for i in range(300)]
    data, spans = encoded(value)
    node = await index(data, spans)
    assert isinstance(node, BigArray)
    assert part_of(node, "/250") == part_of(data, "/250")
    assert part_of(node, start=290, max_bytes=300) == part_of(data, start=290, max_bytes=300)
    moved = [msgspec.structs.replace(spans[0], start=1)]
    assert await index(data, moved) is data


async def test_a_span_inside_a_string_is_refused() -> None:
    """A hint naming an array-looking text inside a string is not taken as the field."""
    data = b'{"a":"[1,2]","rows":[]}'
    inside = data.index(b"[1,2]")
    fake = Span("rows", inside, inside + 5, ((inside + 1, inside + 4),))
    assert await index(data, [fake]) is data
    other = Span("a", inside, inside + 5, ((inside + 1, inside + 4),))
    assert await index(data, [other]) is data


async def test_slices_cut_inside_items_are_refused() -> None:
    """Slices that do not fall between whole items make the hint unusable."""
    value = big_exact(100)
    data, spans = encoded(value)
    span = spans[0]
    (a, b), rest = span.slices[0], span.slices[1:]
    comma_inside = data.index(b",", a + 1)  # a comma inside the first row
    bad = Span(span.field, span.start, span.end, ((a, comma_inside), (comma_inside + 1, b), *rest))
    assert await index(data, [bad]) is data


async def test_wrong_layout_in_the_index_still_reads_right(
    harness: rc.Harness, tmp_path: Path
) -> None:
    """A layout row rewritten on disk is ignored: the part comes from the bytes."""
    value = big_exact(3000)
    compacted = await rc.response_compact(harness, value, Exact, Summary, OPTIONS)
    ref = compacted.receipt.exact_ref
    expected = await rc.response_compaction_read_part(harness, ref, pointer="/rows", start=1234)
    index_path = tmp_path / "ws" / "response-compaction-v1" / "index.sqlite3"
    bogus = msgspec.json.encode([Span("rows", 0, 40, ((1, 20), (21, 39)))])
    with sqlite3.connect(index_path) as conn:
        conn.execute("UPDATE entries SET layout = ? WHERE kind = 'exact'", (bogus,))
    conn.close()
    got = await rc.response_compaction_read_part(harness, ref, pointer="/rows", start=1234)
    assert got == expected
    assert isinstance(got, rc.Found)
    assert got.value.value[0] == msgspec.to_builtins(value.rows[1234])


async def test_paging_a_large_struct_entry(harness: rc.Harness) -> None:
    """Every row of a multi-slice entry comes back once, in order, page by page."""
    value = big_exact(20000)
    compacted = await rc.response_compact(harness, value, Exact, Summary, OPTIONS)
    ref = compacted.receipt.exact_ref
    seen: list[Any] = []
    start: Any = 0
    while start is not msgspec.UNSET:
        result = await rc.response_compaction_read_part(
            harness, ref, pointer="/rows", start=start, max_bytes=65536
        )
        assert isinstance(result, rc.Found)
        assert len(result.value.json.encode()) <= 65536
        seen.extend(result.value.value)
        start = result.value.next_start
    assert seen == msgspec.to_builtins(value.rows)


async def test_the_loop_gets_a_turn_after_every_slice() -> None:
    """Counting a large array's items awaits the checkpoint once per slice, never less."""
    data, written = encoded(big_exact(2000), piece_bytes=4000)
    spans = list(decode_layout(encode_layout(written)))  # a hint: no counts to believe
    turns = 0

    async def checkpoint() -> None:
        nonlocal turns
        turns += 1
        await anyio.lowlevel.checkpoint()

    node = await index_document(data, spans, "turns", checkpoint)
    assert isinstance(node, RootObject)
    assert turns == len(spans[0].slices) > 10
    assert max(b - a for a, b in spans[0].slices) < 3 * 4000


def _tiny_arrays(count: int) -> tuple[bytes, list[Span]]:
    """A document of ``count`` one-item arrays, and a (forged) span for every one of them."""
    members = [b'"%d":[0]' % i for i in range(count)]
    data = b"{" + b",".join(members) + b"}"
    spans, position = [], 1
    for i, member in enumerate(members):
        start = position + member.index(b"[")
        spans.append(Span(str(i), start, start + 3, ((start + 1, start + 2),)))
        position += len(member) + 1
    return data, spans


@pytest.mark.timeout(60)
async def test_many_forged_spans_are_indexed_in_one_pass_over_the_document() -> None:
    """100,000 spans (a forged row's layout, before its bytes are verified, on the loop).

    Each placeholder used to be counted over the whole document: quadratic, 40,000 spans held
    the event loop 20 s and these would take minutes (the bound is a hang detector only).
    """
    data, spans = _tiny_arrays(100_000)
    node = await index(data, spans)
    assert isinstance(node, RootObject)
    assert len(node.members) == 100_000
    for pointer in ("/0", "/77777", "/99999/0"):
        assert part_of(node, pointer=pointer) == part_of(data, pointer=pointer)


@pytest.mark.parametrize("inside", [b"[7355608000000000000]", b"[7355608000000000001]"])
async def test_a_placeholder_lookalike_in_the_document_refuses_the_spans(inside: bytes) -> None:
    """The spans stand only if their placeholders appear nowhere else: else a plain scan."""
    data, spans = _tiny_arrays(2)
    data = data[:-1] + b',"z":"' + inside + b'"}'
    assert await index(data, spans) == data
