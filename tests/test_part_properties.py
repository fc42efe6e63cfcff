"""Properties of parts: for any value, pointer, window and bound, the part fits and is true."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from response_compaction._canonical import Span, iter_canonical
from response_compaction._encoding import line_safe
from response_compaction._part import CUT_MARKER, part_of, walk
from response_compaction._part_index import BigArray, Node, RootObject, index_document

_ENCODE = msgspec.json.Encoder(order="sorted").encode

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=300)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.text(max_size=40), inner),
    max_leaves=60,
)


def paths(value: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    found = [prefix]
    if isinstance(value, list):
        for i, item in enumerate(value):
            found += paths(item, (*prefix, i))
    elif isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    return found


def pointer_of(path: tuple[str | int, ...]) -> str:
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in path)


def node_at(value: Any, path: tuple[str | int, ...]) -> Any:
    for token in path:
        value = value[token]
    return value


@settings(max_examples=300, deadline=None)
@given(
    value=values,
    pick=st.integers(min_value=0),
    max_bytes=st.integers(min_value=256, max_value=3000),
    start=st.none() | st.integers(min_value=0, max_value=15),
    length=st.none() | st.integers(min_value=0, max_value=15),
)
def test_every_part_fits_parses_and_equals_the_slice(
    value: Any, pick: int, max_bytes: int, start: int | None, length: int | None
) -> None:
    """The JSON fits the bound, parses to ``value``, and is exactly the window of the node."""
    data = _ENCODE(value)
    all_paths = paths(value)
    path = all_paths[pick % len(all_paths)]
    stop = None if length is None else (start or 0) + length
    part = part_of(data, pointer_of(path), start=start, stop=stop, max_bytes=max_bytes)
    node = node_at(value, path)

    assert len(part.json.encode()) <= max_bytes
    assert msgspec.json.decode(part.json) == part.value
    assert part.json.encode() == line_safe(_ENCODE(part.value))  # U+0085 etc. escaped
    assert part.total_bytes == len(_ENCODE(node))
    if part.complete:
        assert part.value == node
    if not isinstance(node, list | dict | str):
        assert part.complete
        assert part.value == node
        return
    assert isinstance(part.start, int)
    assert isinstance(part.stop, int)
    size = len(node)
    first = min(start or 0, size)
    assert part.start == first
    assert part.stop >= first
    if part.stop < size:
        assert part.next_start == part.stop
    else:
        assert part.next_start is msgspec.UNSET
    wanted_end = size if stop is None else max(first, min(stop, size))
    assert part.stop <= wanted_end
    if first < wanted_end:
        assert part.stop > first  # every call makes progress
    if isinstance(node, str):
        shown = part.value.removesuffix(CUT_MARKER) if part.stop < size else part.value
        assert shown == node[part.start : part.stop]
        return
    assert part.total_items == size
    if isinstance(node, list):
        items = node[part.start : part.stop]
        keys: list[Any] = list(range(part.start, part.stop))
    else:
        keys = sorted(node)[part.start : part.stop]
        items = [node[k] for k in keys]
    if not part.outline:
        expected = items if isinstance(node, list) else dict(zip(keys, items, strict=True))
        assert part.value == expected
        return
    assert len(part.value) == len(items)
    for entry, key, item in zip(part.value, keys, items, strict=True):
        assert entry["bytes"] == len(_ENCODE(item))
        if isinstance(node, list):
            assert entry["index"] == key
        elif not entry["key"].endswith(CUT_MARKER):
            assert entry["key"] == key
        if isinstance(item, list):
            assert (entry["type"], entry["items"]) == ("array", len(item))
        elif isinstance(item, dict):
            assert (entry["type"], entry["keys"]) == ("object", len(item))


class Holder(msgspec.Struct):
    items: list[Any]
    note: str = ""


@settings(max_examples=100, deadline=None)
@given(
    items=st.lists(values, min_size=2, max_size=60),
    as_struct=st.booleans(),
    start=st.none() | st.integers(min_value=0, max_value=70),
    max_bytes=st.integers(min_value=256, max_value=2000),
    piece_bytes=st.integers(min_value=1, max_value=400),
)
def test_layout_path_gives_the_same_parts(
    items: list[Any], as_struct: bool, start: int | None, max_bytes: int, piece_bytes: int
) -> None:
    """Reading through the checked layout gives exactly the part a whole scan gives."""
    value: Any = Holder(items=items) if as_struct else items
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(value, piece_bytes, layout))
    node = anyio.run(index_document, data, layout, "prop", anyio.lowlevel.checkpoint)
    # A usable layout exercises the slices (the writer records none when it had to descend
    # into an item bigger than a piece).
    assert isinstance(node, bytes) == (not layout)
    pointer = "/items" if as_struct else ""
    for where in (pointer, pointer + "/1", ""):
        plain = part_of(data, where, start=start, max_bytes=max_bytes)
        assert part_of(node, where, start=start, max_bytes=max_bytes) == plain


def _flat(node: Node) -> bytes:
    assert not isinstance(node, BigArray | RootObject)  # a walk in plain bytes finds bytes
    return bytes(node)


def _walked(data: bytes, tokens: list[str], slack: int) -> bytes | str:
    try:
        return _flat(walk(data, tokens, slack=slack)[0])
    except LookupError as error:
        return f"LookupError: {error}"


@settings(max_examples=300, deadline=None)
@given(
    value=values,
    pick=st.integers(min_value=0),
    extra=st.lists(st.sampled_from(["0", "1", "a", "", "01", "~"]), max_size=3),
    share=st.floats(min_value=0, max_value=5),
)
def test_a_walk_in_the_decoded_value_finds_what_the_raw_steps_find(
    value: Any, pick: int, extra: list[str], share: float
) -> None:
    """Past its allowance a walk goes on in the decoded value: same node, same LookupError.

    The allowance is ``share`` times the value's size: the switch happens at any depth.
    """
    data = _ENCODE(value)
    found = paths(value)
    tokens = [str(t) for t in found[pick % len(found)]] + extra
    raw_steps = _walked(data, tokens, slack=1 << 62)
    slack = int(share * len(data)) - 4 * len(data)
    assert _walked(data, tokens, slack=slack) == raw_steps
    if isinstance(raw_steps, bytes) and not extra:
        assert raw_steps == _ENCODE(node_at(value, found[pick % len(found)]))


def test_a_deep_pointer_scans_a_bounded_multiple_of_the_value() -> None:
    """Each raw step scans its node's subtree: 900 levels into 0.9 MB scanned 810 MB (1.5 s)."""
    value: Any = "x" * 900_000
    for level in range(900):
        value = {"k": value, "n": level} if level % 2 else [level, value]
    tokens = ["k" if level % 2 else "1" for level in reversed(range(900))]
    data = _ENCODE(value)
    node, scanned = walk(data, tokens)
    assert _flat(node) == _ENCODE("x" * 900_000)
    assert scanned < 6 * len(data)
