"""Canonical JSON: golden bytes, chunked encoding, accepted inputs, refused inputs."""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import response_compaction as rc
from response_compaction._canonical import Span, canonical_bytes, iter_canonical, to_exact_value
from response_compaction._stream import PIECE_BYTES, _Stream
from tests._store_support import (
    HYPOTHESIS,
    TEST_KEY,
    assert_nothing_stored,
    canonical,
    compact,
    entry_files,
    entry_path,
    hex_of,
    options,
    store_root,
)
from tests.schemas import Exact, Row, Summary, big_exact

pytestmark = pytest.mark.anyio


class Inner(msgspec.Struct):
    b: str
    a: int


class Outer(msgspec.Struct):
    zeta: list[Inner]
    alpha: dict[str, float]
    mid: None = None


# ----------------------------------------------------------------------------- golden vectors

GOLDEN: list[tuple[str, Any, bytes, str]] = [
    (
        "dict key order (code points, case, non-ASCII)",
        {"b": 1, "a": [True, None], "A": {"z": 1.5, "é": "x"}},
        b'{"A":{"z":1.5,"\xc3\xa9":"x"},"a":[true,null],"b":1}',
        "54ae0ae912fce371d76f2a42a6d28ec4341e1c20f2430aa958c4be536f6a8fcc",
    ),
    (
        "unicode and escapes",
        'q" b\\ c\x01 \x7f \u2028 é ☃ 😀 \t\n',
        b'"q\\" b\\\\ c\\u0001 \x7f \xe2\x80\xa8 \xc3\xa9 \xe2\x98\x83 \xf0\x9f\x98\x80 \\t\\n"',
        "ca2533277524a64ef85f4480c7dc1a61c4ed1142b708d771f72cc494fa1458cf",
    ),
    (
        "floats (shortest round trip, signed zero, extremes)",
        [0.1, 1e16, 1.0, -0.0, 1.5e-7, 5e-324, 1.7976931348623157e308],
        b"[0.1,1e16,1.0,-0.0,1.5e-7,5e-324,1.7976931348623157e308]",
        "87c6a307259b2884b3953f4721ee5fc9a6b74403dc3f9c973a53fcf055772165",
    ),
    (
        "nested structs, fields sorted by name",
        Outer(zeta=[Inner(b="x", a=1)], alpha={"b": 0.5, "a": -1e-7}),
        b'{"alpha":{"a":-1e-7,"b":0.5},"mid":null,"zeta":[{"a":1,"b":"x"}]}',
        "b2550d06950e67609000e31d6fe4b7016a92d9723fdbdd2952962492361aaff4",
    ),
    (
        "schema struct with defaults written out",
        Exact(rows=[Row(id=1, name="a")], total=1),
        b'{"rows":[{"id":1,"name":"a","score":null,"tags":[]}],"total":1}',
        "03d1791319a65e3e28fff0fae5b82fd9f34e88f39de2f734ce82f6955bcf0b20",
    ),
    (
        "astral keys sort after the BMP",
        {"\U0001f600": 1, "\uffff": 2, "a": 3, "Z": 0},
        b'{"Z":0,"a":3,"\xef\xbf\xbf":2,"\xf0\x9f\x98\x80":1}',
        "3de9d270786f19513c2f0cfe8cfe3da0acf0dbc819b4b6189ba73db141949329",
    ),
    (
        "integers at the 64-bit edges",
        [9223372036854775807, -9223372036854775808, 0, 18446744073709551615],
        b"[9223372036854775807,-9223372036854775808,0,18446744073709551615]",
        "43386e018d7d1de9bb7a7e147c88fc3a6298130ccd619e3b741453af041cc60a",
    ),
]


@pytest.mark.parametrize(
    ("value", "expected", "sha"), [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN]
)
@pytest.mark.parametrize("piece_bytes", [1, 64, 1 << 20])
def test_golden_vectors(value: Any, expected: bytes, sha: str, piece_bytes: int) -> None:
    """The canonical bytes (whole and chunked) and their sha256 equal hard-coded vectors."""
    data = b"".join(bytes(p) for p in iter_canonical(value, piece_bytes))
    assert data == expected
    assert canonical_bytes(value) == expected
    assert hashlib.sha256(data).hexdigest() == sha


async def test_golden_vector_through_the_store(harness: rc.Harness) -> None:
    """The stored file holds exactly the golden bytes; the receipt names their keyed digest."""
    _, value, expected, sha = GOLDEN[4]
    keyed = hmac.new(TEST_KEY, expected, hashlib.sha256).hexdigest()
    compacted = await compact(harness, value)
    receipt = compacted.receipt
    assert receipt.exact_digest == "sha256:" + keyed
    assert receipt.exact_ref == "rc1:" + keyed
    assert sha not in receipt.exact_digest + receipt.exact_ref
    assert receipt.exact_bytes == len(expected)
    root = store_root(harness.fs)
    assert entry_path(root, keyed).read_bytes() == expected


# ----------------------------------------------------------------------------- chunked encoding


class Node(msgspec.Struct):
    zz: Any
    aa: Any
    mm: Any = None


class Pair(msgspec.Struct, array_like=True):
    right: Any
    left: Any


class Renamed(msgspec.Struct, rename={"first": "z_first", "second": "a_second"}):
    first: Any
    second: Any


class Tagged(msgspec.Struct, tag="t"):
    body: Any


class Sparse(msgspec.Struct, omit_defaults=True):
    items: Any = None
    other: Any = None


_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(children, max_size=40)
        | st.dictionaries(st.text(), children, max_size=20)
        | st.tuples(children, children)
        | st.builds(Node, children, children, children)
        | st.builds(Pair, children, children)
        | st.builds(Renamed, children, children)
        | st.builds(Tagged, children)
        | st.builds(Sparse, children, children)
    )


_values = st.recursive(_leaves, _containers, max_leaves=80)


@HYPOTHESIS
@given(value=_values, piece_bytes=st.sampled_from([1, 7, 64]))
def test_chunked_encoding_is_byte_identical(value: Any, piece_bytes: int) -> None:
    """iter_canonical with small pieces concatenates to msgspec's whole sorted encoding."""
    data = b"".join(bytes(p) for p in iter_canonical(value, piece_bytes))
    assert data == msgspec.json.encode(value, order="sorted")


def test_large_values_are_really_chunked() -> None:
    """A big list is yielded as many small pieces, so the property above is not vacuous."""
    value = big_exact(2000)
    pieces = [bytes(p) for p in iter_canonical(value, 64)]
    assert len(pieces) > 100
    assert b"".join(pieces) == canonical(value)
    assert max(len(p) for p in pieces) < 2048


def test_a_small_value_of_short_containers_is_one_piece_without_a_layout() -> None:
    """Up to 16 items a container and 64 KB in all: one encoder call, nothing to slice."""
    value = Outer(zeta=[Inner(b=f"n{i}", a=i) for i in range(16)], alpha={"a": 1.0})
    layout: list[Span] = []
    pieces = [bytes(p) for p in iter_canonical(value, layout=layout)]
    assert pieces == [canonical(value)]
    assert layout == []


@pytest.mark.parametrize(
    ("value", "field"),
    [
        # 17 items: the walk slices and records it, however small.
        pytest.param(
            Outer(zeta=[Inner(b="x", a=i) for i in range(17)], alpha={}), "zeta", id="17-items"
        ),
        pytest.param([Inner(b="x", a=i) for i in range(17)], None, id="top-level-list"),
    ],
)
def test_a_long_container_is_streamed_with_its_layout(value: Any, field: str | None) -> None:
    layout: list[Span] = []
    pieces = [bytes(p) for p in iter_canonical(value, layout=layout)]
    assert len(pieces) > 1
    assert b"".join(pieces) == canonical(value)
    assert [span.field for span in layout] == [field]


class Wide(msgspec.Struct, rename={"items": "z_\u00eftems"}, tag="w"):
    items: tuple[str, ...]
    notes: list[str]
    meta: dict[str, str]
    text: str
    one: list[int]


class Packed(msgspec.Struct, array_like=True):
    items: list[str]
    n: int


_BIG = '\u00e9"q' * 16_000  # escaped when encoded: offsets count encoded bytes


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(Outer(zeta=[Inner(b=_BIG, a=i) for i in range(2)], alpha={}), id="field"),
        pytest.param([_BIG, "a", _BIG], id="top-level-list"),
        pytest.param(
            Wide(items=(_BIG, "b"), notes=["x", _BIG], meta={"k": _BIG}, text=_BIG, one=[1]),
            id="renamed-tagged",
        ),
        pytest.param(
            Wide(items=(), notes=[], meta={"k": _BIG, "j": "v"}, text="", one=[]), id="no-array"
        ),
        pytest.param(Packed(items=[_BIG, _BIG], n=1), id="array-like"),
        pytest.param({"a": [_BIG, _BIG], "b": _BIG}, id="dict"),
    ],
)
def test_a_large_value_of_short_containers_keeps_the_walk_s_layout(value: Any) -> None:
    """Over 64 KB, one call or not, the layout is the one the streamed walk records."""
    walked: list[Span] = []
    streamed = b"".join(bytes(p) for p in _Stream(PIECE_BYTES, walked, True).value(value, top=True))
    layout: list[Span] = []
    assert b"".join(bytes(p) for p in iter_canonical(value, layout=layout)) == streamed
    assert len(streamed) > 64 << 10
    assert layout == walked


def test_a_value_over_one_piece_keeps_the_walk_s_layout_however_small() -> None:
    """Only a value that fits one piece goes without a layout: with pieces of 64 bytes, the
    property tests' small values keep the layout the walk records."""
    value = Outer(zeta=[Inner(b=f"n{i}", a=i) for i in range(16)], alpha={"a": 1.0})
    walked: list[Span] = []
    streamed = b"".join(bytes(p) for p in _Stream(64, walked, True).value(value, top=True))
    layout: list[Span] = []
    pieces = [bytes(p) for p in iter_canonical(value, 64, layout)]
    assert b"".join(pieces) == streamed
    assert max(len(p) for p in pieces) <= 64
    assert layout == walked
    assert [span.field for span in layout] == ["zeta"]


class RawBeside(msgspec.Struct):
    body: msgspec.Raw
    by_id: dict[int, str]
    pair: list[int]
    text: str


class Lying(list[Any]):
    def __len__(self) -> int:
        return 3


@pytest.mark.parametrize(
    "value",
    [
        # One call of the whole would take a Raw through to_builtins (the int keys): refused.
        pytest.param(
            RawBeside(body=msgspec.Raw(b'{"ok":true}'), by_id={1: "a"}, pair=[1, 2], text=_BIG),
            id="raw-and-int-keys",
        ),
        # The Raw's spaces are not in its decoded member: offsets found from it would be short.
        pytest.param(
            RawBeside(body=msgspec.Raw(b"1\n"), by_id={}, pair=[1, 2], text=_BIG),
            id="raw-with-spaces",
        ),
    ],
)
def test_what_one_call_cannot_do_is_left_to_the_walk(value: Any) -> None:
    walked: list[Span] = []
    streamed = b"".join(bytes(p) for p in _Stream(PIECE_BYTES, walked, True).value(value, top=True))
    layout: list[Span] = []
    assert b"".join(bytes(p) for p in iter_canonical(value, layout=layout)) == streamed
    assert layout == walked
    assert [span.field for span in layout] == ["pair"]


def test_a_list_that_miscounts_itself_is_counted_by_its_items() -> None:
    """The span's count is what the encoder wrote, not what ``__len__`` says."""
    value = Lying([_BIG, 2, 3, 4, 5])
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(value, layout=layout))
    assert data == msgspec.json.encode(list(value))
    assert [span.counts for span in layout] == [(5,)]


class Five(msgspec.Struct):
    a: list[int]
    b: list[int]
    c: dict[str, int]
    d: tuple[int, ...]
    e: list[int]


def test_fields_of_one_item_count_as_the_walk_s_calls() -> None:
    """Five fields of one item each: the walk, which encodes each field in a call of its own."""
    five = Five(a=[1], b=[3], c={"x": 5}, d=(7,), e=[9])
    assert len(list(iter_canonical(five))) > 1


class IntKeyed(msgspec.Struct):
    a: Any
    by_id: dict[int, Any]
    g: Any = None


def test_int_keys_are_written_a_dict_at_a_time_as_the_walk_does() -> None:
    """One call would take the whole value through to_builtins and its walk for problems: the
    NaN beside an int-keyed dict is left to the schema as the caller asked (scan_nulls off),
    and a value refused for two reasons is refused for the one the walk meets first."""
    nan = IntKeyed(a=float("nan"), by_id={1: "x"})
    assert (
        b"".join(iter_canonical(nan, scan_nulls=False)) == b'{"a":null,"by_id":{"1":"x"},"g":null}'
    )
    twice = IntKeyed(a=None, by_id={0: [msgspec.Raw(b"1"), math.nan]}, g=["\ud800"])
    with pytest.raises(ValueError, match=re.escape("NaN or infinity at `$.by_id[...][1]`")):
        b"".join(iter_canonical(twice))


def test_many_short_fields_are_streamed_and_a_large_value_handed_on_in_pieces() -> None:
    """Five fields of two items: the walk (one call would hold the loop as five of its
    longest); four: one call. A large value of one call reaches the store a piece at a time."""
    five = Five(a=[1, 2], b=[3, 4], c={"x": 5, "y": 6}, d=(7, 8), e=[9, 10])
    assert len(list(iter_canonical(five))) > 1
    four = msgspec.structs.replace(five, e=[])
    assert [bytes(p) for p in iter_canonical(four)] == [canonical(four)]
    big = Outer(zeta=[Inner(b=_BIG, a=1)], alpha={})
    pieces = [bytes(p) for p in iter_canonical(big, 4096)]
    assert max(len(p) for p in pieces) <= 4096
    assert b"".join(pieces) == canonical(big)


class Overcounted(list[Any]):
    def __len__(self) -> int:
        return 100


class Undercounted(list[Any]):
    def __len__(self) -> int:
        return 0


class Misleading(dict[str, Any]):
    def __iter__(self) -> Iterator[str]:
        return iter(["a"])

    def __getitem__(self, key: str) -> Any:
        return "forged"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(Overcounted(range(30)), id="len-over"),  # the walk's slices ran dry forever
        pytest.param(Undercounted(range(30)), id="len-under"),
        pytest.param(Misleading({f"k{i:02d}": i for i in range(30)}), id="iter-and-getitem"),
        pytest.param(
            [Overcounted(range(30)), Misleading({f"k{i:02d}": i for i in range(20)})], id="inside"
        ),
    ],
)
def test_a_container_subclass_is_written_as_its_own_items(value: Any) -> None:
    """What the encoder writes (the container's own items), whatever its methods say."""
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(value, 64, layout))
    assert data == msgspec.json.encode(value, order="sorted")
    assert layout  # a span per array cut (or found): each counts the items its slices hold
    for span in layout:
        ends = (b"{", b"}") if span.mapping else (b"[", b"]")
        held = msgspec.json.decode(b",".join(data[a:b] for a, b in span.slices).join(ends))
        assert sum(span.counts) == len(held)


class _NullBeside(msgspec.Struct):
    a: Any


def test_a_null_beside_nan_looking_bytes_in_an_overcounted_list_is_kept() -> None:
    """The refusal walk (run on a null and a suspicious scan) reads the list's own items.

    Through the subclass's ``__len__`` it indexed past the end (IndexError), and a
    ``__len__`` of millions built a list that long in one step.
    """
    value = _NullBeside(a=Overcounted([None, b"\xcb\x7f\xf0"]))
    data = b"".join(bytes(p) for p in iter_canonical(value))
    assert data == msgspec.json.encode(value, order="sorted")


class _Forged(msgspec.Struct):
    a: Any
    b: Any = None

    def __getattribute__(self, name: str) -> Any:
        if name == "a":
            return ["forged"] * 10
        return super().__getattribute__(name)


@pytest.mark.parametrize(
    "items", [list(range(20)), ["x" * 40_000, "y" * 40_000]], ids=["walked", "one-call"]
)
def test_a_struct_is_written_as_its_own_slots_with_their_counts(items: list[Any]) -> None:
    """msgspec writes a struct's slots; a ``__getattribute__`` saying otherwise is not asked.

    Asked, the walk wrote the forged items and the one call's layout sealed their count
    against bytes holding the slot's (every part read of the field Broken).
    """
    value = _Forged(a=items)
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(value, PIECE_BYTES, layout))
    assert data == msgspec.json.encode(value, order="sorted")
    (span,) = layout
    assert sum(span.counts) == len(items)


async def test_a_struct_s_own_slots_are_read_in_parts(harness: rc.Harness) -> None:
    value = _Forged(a=["x" * 40_000, "y" * 40_000])
    compacted = await rc.response_compact(harness, value, Any, Summary, options())
    ref = compacted.receipt.exact_ref
    part = await rc.response_compaction_read_part(harness, ref, pointer="/a/1", max_bytes=256)
    assert isinstance(part, rc.Found)  # was Broken: the sealed layout did not match the bytes
    assert part.value.total_bytes == 40_002
    assert str(part.value.value).startswith("yyyy")


class _SortsItself(msgspec.Struct):
    rows: list[int]

    def __post_init__(self) -> None:
        self.rows = sorted(self.rows)


class _CountsItself(msgspec.Struct):
    rows: list[int]
    made: int = 0

    def __post_init__(self) -> None:
        self.made += 1


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(_SortsItself(rows=list(range(20))), id="refuses-a-placeholder"),
        pytest.param(_CountsItself(rows=list(range(20))), id="changes-a-field"),
        pytest.param(_SortsItself(rows=list(range(50_000))), id="large"),
    ],
)
def test_a_struct_with_a_post_init_is_written_as_it_is(value: Any) -> None:
    """The walk copied a struct with Raw placeholders for its containers, and the copy ran
    its ``__post_init__``: a TypeError out of the library, or a field counted twice."""
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(value, PIECE_BYTES, layout))
    assert data == msgspec.json.encode(value, order="sorted")
    assert [sum(span.counts) for span in layout] == ([len(value.rows)] if len(data) > 65536 else [])


async def test_an_overcounted_list_is_stored_and_read_back(harness: rc.Harness) -> None:
    value = Overcounted(range(30))
    compacted = await rc.response_compact(harness, value, list[int], Summary, options())
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, list[int])
    assert read == rc.Found(value=list(range(30)))


# ----------------------------------------------------------------------------- round trips


async def test_struct_round_trip(harness: rc.Harness) -> None:
    """A Struct value comes back equal, exact in the output and Found by its reference."""
    value = Exact(rows=[Row(id=1, name="a", tags=["x", "y"], score=0.25)], total=1)
    compacted = await compact(harness, value)
    assert compacted.output == rc.ExactOutput(value=value)
    assert compacted.receipt.exact_cache == "stored"
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
    assert read == rc.Found(value=value)


async def test_builtins_round_trip(harness: rc.Harness) -> None:
    """Builtins are converted to the schema, stored canonically, and read back as the struct."""
    raw = {"total": 2, "rows": [{"name": "b", "id": 2}, {"id": 1, "name": "a", "tags": ["t"]}]}
    expected = Exact(rows=[Row(id=2, name="b"), Row(id=1, name="a", tags=["t"])], total=2)
    compacted = await compact(harness, raw)
    assert compacted.output.value == expected
    assert compacted.receipt.exact_ref == "rc1:" + hex_of(expected)
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
    assert read == rc.Found(value=expected)


async def test_raw_round_trip(harness: rc.Harness) -> None:
    """Raw JSON with spaces and any key order is stored in canonical form and reads back."""
    raw = msgspec.Raw(b'{ "total" : 1, "rows" : [ { "name" : "\\u00e9", "id" : 7 } ] }')
    expected = Exact(rows=[Row(id=7, name="é")], total=1)
    compacted = await compact(harness, raw)
    assert compacted.output.value == expected
    root = store_root(harness.fs)
    assert entry_path(root, hex_of(expected)).read_bytes() == canonical(expected)
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
    assert read == rc.Found(value=expected)


async def test_three_input_forms_share_one_entry(harness: rc.Harness) -> None:
    """Struct, builtins and Raw of the same value name the same entry; later ones reuse it."""
    value = Exact(rows=[Row(id=3, name="c")], total=3)
    refs = []
    caches = []
    for form in (value, msgspec.to_builtins(value), msgspec.Raw(msgspec.json.encode(value))):
        compacted = await compact(harness, form)
        refs.append(compacted.receipt.exact_ref)
        caches.append(compacted.receipt.exact_cache)
    assert len(set(refs)) == 1
    assert caches == ["stored", "reused", "reused"]
    assert entry_files(store_root(harness.fs)) == {hex_of(value)}


async def test_large_round_trip_verified_in_a_worker_process(harness: rc.Harness) -> None:
    """A value above the in-process verify size (8 MiB) is retained and reads back equal."""
    value = big_exact(150_000)
    compacted = await compact(harness, value)
    assert compacted.receipt.exact_bytes >= 8 << 20
    assert compacted.output.kind == "fallback"
    assert compacted.receipt.fallback_reason == "no_llm"
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
    assert isinstance(read, rc.Found)
    assert read.value == value


# ----------------------------------------------------------------------------- refused inputs


_NOT_VALID: list[tuple[str, Any]] = [
    ("builtins out of range", {"rows": [], "total": -1}),
    ("builtins wrong type", {"rows": [{"id": "one", "name": "a"}], "total": 1}),
    ("builtins missing field", {"rows": []}),
    ("raw invalid json", msgspec.Raw(b'{"rows": [')),
    ("raw wrong shape", msgspec.Raw(b'{"rows": {}, "total": 1}')),
    ("struct built out of range", Exact(rows=[], total=-1)),
    ("struct with a wrongly typed field", Exact(rows=[Row(id="x", name="a")], total=0)),  # type: ignore[arg-type]
    ("other struct type", rc.Missing()),
    ("not json at all", object()),
]


@pytest.mark.parametrize("response", [v for _, v in _NOT_VALID], ids=[n for n, _ in _NOT_VALID])
async def test_invalid_input_raises_value_error_and_stores_nothing(
    harness: rc.Harness, response: Any
) -> None:
    """A response that does not validate raises ValueError and leaves no entry or temp file."""
    with pytest.raises(ValueError, match=r"\S"):
        await compact(harness, response)
    assert_nothing_stored(store_root(harness.fs))


_NON_FINITE: list[tuple[str, Any]] = [
    ("struct nan", Exact(rows=[Row(id=1, name="a", score=math.nan)], total=1)),
    ("struct inf", Exact(rows=[Row(id=1, name="a", score=math.inf)], total=1)),
    ("builtins -inf", {"rows": [{"id": 1, "name": "a", "score": -math.inf}], "total": 1}),
    ("raw overflow to inf", msgspec.Raw(b'{"rows":[{"id":1,"name":"a","score":1e999}],"total":1}')),
    (
        "nan deep in a chunked value",
        Exact(rows=[*big_exact(5000).rows, Row(id=-1, name="z", score=math.nan)], total=1),
    ),
]


@pytest.mark.parametrize("response", [v for _, v in _NON_FINITE], ids=[n for n, _ in _NON_FINITE])
async def test_nan_and_infinity_are_refused(harness: rc.Harness, response: Any) -> None:
    """NaN and infinities raise ValueError instead of being stored as null."""
    with pytest.raises(ValueError, match=r"NaN|infinity|out of range"):
        await compact(harness, response)
    assert_nothing_stored(store_root(harness.fs))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1.0, {"x": math.nan}]])
def test_canonical_bytes_refuses_non_finite(value: Any) -> None:
    """The pure encoder refuses non-finite floats anywhere, whole or chunked."""
    with pytest.raises(ValueError, match="NaN or infinity"):
        canonical_bytes(value)
    with pytest.raises(ValueError, match="NaN or infinity"):
        b"".join(iter_canonical([value] * 40, 1))


class WithRaw(msgspec.Struct):
    n: int
    x: None
    raw: msgspec.Raw


def test_null_next_to_a_raw_field_is_not_mistaken_for_nan() -> None:
    """A real null beside a Raw field encodes, even when other bytes look like a msgpack inf."""
    # 3414159360 is 0xcb7ff000: its msgpack form contains the bytes of a float64 infinity.
    value = msgspec.json.decode(b'{"n":3414159360,"x":null,"raw":[1,2]}', type=WithRaw)
    assert canonical_bytes(value) == b'{"n":3414159360,"raw":[1,2],"x":null}'


def test_null_with_inf_looking_bytes_is_kept() -> None:
    """None next to bytes that resemble a msgpack infinity still encodes to null."""
    value = [None, b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00"]
    assert canonical_bytes(value) == msgspec.json.encode(value)


class Keyed(msgspec.Struct):
    by_id: dict[int, str]
    weights: dict[float, int] = {}


async def test_non_str_keys_round_trip(harness: rc.Harness) -> None:
    """Dicts keyed by ints or floats are stored with keys sorted as JSON strings and read back."""
    value = Keyed(by_id={10: "ten", 9: "nine", -1: "minus"}, weights={1.5: 1, 0.25: 2})
    expected = b'{"by_id":{"-1":"minus","10":"ten","9":"nine"},"weights":{"0.25":2,"1.5":1}}'
    compacted = await rc.response_compact(harness, value, Keyed, Summary, options())
    keyed = hmac.new(TEST_KEY, expected, hashlib.sha256).hexdigest()
    assert compacted.receipt.exact_digest == "sha256:" + keyed
    root = store_root(harness.fs)
    assert entry_path(root, keyed).read_bytes() == expected
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Keyed)
    assert read == rc.Found(value=value)


@pytest.mark.parametrize("key", [math.nan, math.inf, -math.inf])
def test_non_finite_float_keys_are_refused(key: float) -> None:
    """A NaN or infinite dict key is refused like a NaN value, not written as a string."""
    with pytest.raises(ValueError, match="NaN or infinity"):
        canonical_bytes(Keyed(by_id={}, weights={key: 1}))


def test_chunked_non_str_keys_match_whole() -> None:
    """Int-keyed dicts inside a chunked value encode the same whole and in small pieces."""
    value = [Keyed(by_id={i: str(i), -i: "n"}) for i in range(50)]
    whole = canonical_bytes(value)
    assert b"".join(bytes(p) for p in iter_canonical(value, 16)) == whole
    assert whole.startswith(b'[{"by_id":{"0":"n"},"weights":{}},{"by_id":{"-1":"n","1":"1"}')


#: Over two runs of keys checked apart (a step of the loop between two runs).
MANY_KEYS = 140_000


@pytest.mark.parametrize("in_order", [True, False])
def test_a_large_dict_is_checked_in_runs_and_encodes_as_one_sorted_encoding(
    in_order: bool,
) -> None:
    """A dict of many keys, in code point order or in none, encodes as msgspec's whole does.

    Its keys are checked a run at a time, each run a piece of its own (empty: a step of the
    loop, nothing written), the last one too, so the object's encoding is a step apart.
    """
    keys = [f"k{i:06d}" for i in range(MANY_KEYS)]
    if not in_order:
        keys.reverse()
        keys[0], keys[MANY_KEYS // 2] = keys[MANY_KEYS // 2], keys[0]
    value = {key: i for i, key in enumerate(keys)}
    pieces = [bytes(p) for p in iter_canonical(value)]
    assert b"".join(pieces) == msgspec.json.encode(value, order="sorted")
    assert pieces[: pieces.index(b"{")] == [b""] * -(-MANY_KEYS // (1 << 16))


def test_a_dict_encoded_whole_is_a_step_apart_from_its_keys_checks() -> None:
    """20k keys (one run, encoded whole): an empty piece between the checks and the encoding.

    Checking 62k keys took 3-4 ms and encoding them 6-7: in one step, with what ran before it,
    they froze the loop for 15-27 ms.
    """
    value = {f"k{i:06d}": i for i in range(20_000)}
    pieces = [bytes(p) for p in iter_canonical(value)]
    assert pieces == [b"", msgspec.json.encode(value, order="sorted")]


def test_a_non_str_key_in_a_late_run_encodes_the_dict_whole() -> None:
    """An int key past the first run of a large dict: the whole dict as msgspec writes it."""
    value: dict[Any, int] = {f"k{i:06d}": i for i in range(MANY_KEYS)}
    value[7] = 7
    whole = msgspec.json.encode(msgspec.to_builtins(value, str_keys=True, order="sorted"))
    pieces = [bytes(p) for p in iter_canonical(value)]
    assert b"".join(pieces) == whole
    assert pieces[-1] == whole  # in one piece, after a step per run of keys checked


def test_to_exact_value_reports_msgspec_message() -> None:
    """The ValueError carries msgspec's own message naming the path that failed."""
    with pytest.raises(ValueError, match=r"\$\.total"):
        to_exact_value({"rows": [], "total": -5}, Exact)
