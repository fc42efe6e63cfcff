"""JSON text inside a value (``msgspec.Raw`` as a field, item or dict value) is stored canonical.

Written as given, ``1,"rows":[]`` in a field added a member after it and a read returned
``rows=[]``; ``{"a": 1, "a": 2}`` stored a key twice; spaces and ``1e15`` made a part's ``json``
differ from its value's (found by an adversarial review, 2026-12-04).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import pytest

import response_compaction as rc
from tests._store_support import assert_nothing_stored, store_root
from tests.schemas import FALLBACK, Summary

pytestmark = pytest.mark.anyio

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap", "summarize_above_bytes": 1}
SECRET = b"sk-live-4f9a"


class Tail(msgspec.Struct, frozen=True):
    rows: list[int]
    z: msgspec.Raw


class Doc(msgspec.Struct, frozen=True):
    payload: msgspec.Raw


class Items(msgspec.Struct, frozen=True):
    items: list[msgspec.Raw]


REFUSED: list[tuple[str, Any, Any, str]] = [
    ("a field's text adds a member", Tail([1, 2, 3], msgspec.Raw(b'1,"rows":[]')), Tail,
     "is not one JSON value at `$.z`"),
    ("a dict value's text adds a member", {"b": "real", "c": msgspec.Raw(b'1,"b":"x"')}, dict,
     "is not one JSON value at `$[...]`"),
    ("an item's text adds an item", Items([msgspec.Raw(b"1"), msgspec.Raw(b'2,"' + SECRET + b'"')]),
     Items, "is not one JSON value at `$.items[1]`"),
    ("a key named twice", Doc(msgspec.Raw(b'{"k": "' + SECRET + b'", "k": 2}')), Doc,
     "names one key twice in an object at `$.payload`"),
    ("not JSON", Doc(msgspec.Raw(b"{" + SECRET)), Doc, "is not one JSON value at `$.payload`"),
    ("a number out of range", Doc(msgspec.Raw(b"[1e999]")), Doc, "is not one JSON value"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "schema", "message"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
async def test_json_text_that_would_change_the_value_is_refused_and_nothing_stored(
    harness: rc.Harness, value: Any, schema: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=r"holds a msgspec\.Raw that") as caught:
        await rc.response_compact(harness, value, schema, Summary, OPTIONS)
    assert message in str(caught.value)
    assert SECRET.decode() not in str(caught.value)
    assert_nothing_stored(store_root(harness.fs))


async def test_json_text_is_stored_canonical_and_every_read_agrees(harness: rc.Harness) -> None:
    given = Doc(msgspec.Raw(b'{"b": 1,  "a": [1e15, "\\u00e9"]}'))
    out = await rc.response_compact(harness, given, Doc, Summary, OPTIONS)
    canonical = msgspec.json.encode(msgspec.json.decode(bytes(given.payload)), order="sorted")
    assert canonical == b'{"a":[1000000000000000.0,"\xc3\xa9"],"b":1}'
    found = await rc.response_compaction_read_exact(harness, out.receipt.exact_ref, Doc)
    assert isinstance(found, rc.Found)
    assert found.value == Doc(msgspec.Raw(canonical))
    ref = out.receipt.exact_ref
    part = await rc.response_compaction_read_part(harness, ref, pointer="/payload")
    assert isinstance(part, rc.Found)
    assert part.value.json.encode() == canonical == msgspec.json.encode(part.value.value)


async def test_canonical_text_inside_is_kept_as_the_same_object(harness: rc.Harness) -> None:
    items = [msgspec.Raw(b"%d" % i) for i in range(3_000)]  # past the on-loop node budget
    items.append(msgspec.Raw(b'{"a":[1,2]}'))
    given = Items(items)
    out = await rc.response_compact(harness, given, Items, Summary, OPTIONS)
    found = await rc.response_compaction_read_exact(harness, out.receipt.exact_ref, Items)
    assert isinstance(found, rc.Found)
    assert found.value == given
    part = await rc.response_compaction_read_part(
        harness, out.receipt.exact_ref, pointer="/items", start=2_999, stop=3_001
    )
    assert isinstance(part, rc.Found)
    assert part.value.value == [2999, {"a": [1, 2]}]
    assert part.value.total_items == 3_001


async def test_a_deep_value_under_any_is_walked_as_deep_as_the_encoder_goes(
    harness: rc.Harness,
) -> None:
    """The walk takes one frame per level: with two (comprehensions), 500 levels were refused."""
    value: Any = "leaf"
    for _ in range(900):
        value = [value]
    value = [value, msgspec.Raw(b"[1, 2]")]
    out = await rc.response_compact(harness, value, Any, Summary, OPTIONS)
    found = await rc.response_compaction_read_exact(harness, out.receipt.exact_ref, Any)
    assert isinstance(found, rc.Found)
    assert isinstance(found.value, list)
    assert found.value[1] == [1, 2]


class Pair(NamedTuple):
    left: int
    right: Any


async def test_json_text_in_a_named_tuple_is_made_canonical(harness: rc.Harness) -> None:
    """A named tuple is rebuilt from its fields (``type(t)(items)`` raised TypeError)."""
    given = [Pair(1, msgspec.Raw(b"[1, 2]"))]
    out = await rc.response_compact(harness, given, Any, Summary, OPTIONS)
    found = await rc.response_compaction_read_exact(harness, out.receipt.exact_ref, Any)
    assert isinstance(found, rc.Found)
    expected: Any = [[1, [1, 2]]]
    assert found.value == expected
