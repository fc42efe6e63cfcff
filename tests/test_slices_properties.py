"""Properties of sliced decoding: for any lists and dicts, the layout gives the whole decode."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from response_compaction._canonical import Span, iter_canonical
from response_compaction._part import part_of
from response_compaction._part_index import index_document
from response_compaction._profile import decode_canonical
from response_compaction._slices import decode_sliced

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=60)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)


class Holder(msgspec.Struct, frozen=True):
    items: list[Any]
    labels: dict[str, Any]
    note: str = ""


@settings(max_examples=150, deadline=None)
@given(
    items=st.lists(values, max_size=40),
    labels=st.dictionaries(st.text(max_size=20), values, max_size=40),
    as_struct=st.booleans(),
    piece_bytes=st.integers(min_value=1, max_value=400),
)
def test_a_recorded_layout_decodes_to_the_whole_decode(
    items: list[Any], labels: dict[str, Any], as_struct: bool, piece_bytes: int
) -> None:
    """Slices of lists and dicts, top-level or fields, decode to what one decode gives."""
    value: Any = Holder(items=items, labels=labels) if as_struct else labels
    schema: Any = Holder if as_struct else dict[str, Any]
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(value, piece_bytes, layout))
    whole = msgspec.json.decode(data, type=schema)
    calls = 0

    async def checkpoint() -> None:
        nonlocal calls
        calls += 1
        await anyio.lowlevel.checkpoint()

    assert anyio.run(decode_sliced, data, schema, tuple(layout), checkpoint) == whole
    assert calls == 2 * sum(len(span.slices) for span in layout)  # after each decode and join
    assert decode_canonical(data, layout) == msgspec.json.decode(data)
    node = anyio.run(index_document, data, layout, "prop", anyio.lowlevel.checkpoint)
    for where in ("/labels", "/items", "") if as_struct else ("",):
        assert part_of(node, where, max_bytes=600) == part_of(data, where, max_bytes=600)
