"""Values canonical JSON would silently change are refused; unusual but exact ones are kept."""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import uuid
from typing import Any
from unittest import mock

import msgspec
import pytest

import response_compaction as rc
from response_compaction._canonical import canonical_bytes, iter_canonical
from tests._store_support import assert_nothing_stored, store_root
from tests.schemas import FALLBACK, Summary

pytestmark = pytest.mark.anyio

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}


async def _compact(harness: rc.Harness, value: Any, schema: Any) -> rc.Compacted[Any, Any]:
    return await rc.response_compact(harness, value, schema, Summary, OPTIONS)


class FloatPair(msgspec.Struct, frozen=True):
    pair: tuple[float, float]


# ----------------------------------------------------------------------------- finding 3

_NON_FINITE_IN_TUPLES: list[tuple[str, Any, Any, str]] = [
    ("tuple under Any", (1.0, math.nan), Any, "`$[1]`"),
    ("tuple in a dict", {"a": (math.inf,)}, dict, "`$[...][0]`"),
    ("tuple in a list", [[0.5], (-math.inf, 1.0)], list, "`$[1][0]`"),
    ("set in a list", [{math.nan}], list, "`$[0][...]`"),
    ("frozenset under Any", frozenset({math.inf}), Any, "`$[...]`"),
    ("typed float tuple", (math.nan, 1.0), tuple[float, float], "`$[0]`"),
    ("struct field tuple", FloatPair(pair=(1.0, math.inf)), FloatPair, "`$.pair[1]`"),
    ("deep in tuples", ((((math.nan,),),),), Any, "`$[0][0][0][0]`"),
]


@pytest.mark.parametrize(
    ("value", "schema", "path"),
    [c[1:] for c in _NON_FINITE_IN_TUPLES],
    ids=[c[0] for c in _NON_FINITE_IN_TUPLES],
)
async def test_non_finite_in_tuples_and_sets_is_refused(
    harness: rc.Harness, value: Any, schema: Any, path: str
) -> None:
    """NaN or infinity inside a tuple or set raises ValueError naming its path; nothing stored."""
    with pytest.raises(ValueError, match="NaN or infinity") as caught:
        await _compact(harness, value, schema)
    assert path in str(caught.value)
    assert "null" not in str(caught.value)
    assert_nothing_stored(store_root(harness.fs))


@pytest.mark.parametrize("piece_bytes", [1, 1 << 20])
def test_pure_encoder_refuses_non_finite_in_tuples(piece_bytes: int) -> None:
    """The encoder refuses a NaN in a tuple whole and in pieces, never writing null."""
    value = [(float(i), 0.5) for i in range(40)] + [(1.0, math.nan)]
    with pytest.raises(ValueError, match=r"NaN or infinity at `\$\[40\]\[1\]`"):
        b"".join(iter_canonical(value, piece_bytes))


# ----------------------------------------------------------------------------- finding 4

_COLLIDING: list[tuple[str, Any, Any, str]] = [
    ("int and str", {1: "a", "1": "b"}, Any, "`$`"),
    ("float and str", {1.5: "a", "1.5": "b"}, dict, "`$`"),
    ("nested in a list", [{"x": 1}, {2: "a", "2": "b"}], list, "`$[1]`"),
    ("nested in a dict", {"outer": {0: 1, "0": 2}}, Any, "`$[...]`"),
    ("typed keys", {1: "a", "1": "b"}, dict[int | str, str], "`$`"),
]


@pytest.mark.parametrize(
    ("value", "schema", "path"), [c[1:] for c in _COLLIDING], ids=[c[0] for c in _COLLIDING]
)
async def test_colliding_keys_are_refused(
    harness: rc.Harness, value: Any, schema: Any, path: str
) -> None:
    """Keys that become one JSON key raise ValueError naming the object's path, not the key."""
    with pytest.raises(ValueError, match="same JSON string") as caught:
        await _compact(harness, value, schema)
    message = str(caught.value)
    assert path in message
    assert "1.5" not in message
    assert "'1'" not in message
    assert_nothing_stored(store_root(harness.fs))


async def test_mixed_keys_that_do_not_collide_are_kept(harness: rc.Harness) -> None:
    """An int key and a different str key are both stored and read back as JSON keys."""
    compacted = await _compact(harness, {1: "a", "2": "b", 1.5: "c"}, Any)
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Any)
    expected: dict[str, Any] = {"1": "a", "1.5": "c", "2": "b"}
    assert read == rc.Found[Any](value=expected)


class Weights(msgspec.Struct, frozen=True):
    w: dict[float, str]


class Tagged(msgspec.Struct, frozen=True, array_like=True, tag=True):
    n: int
    w: dict[float, str]


_MERGED_BY_SCHEMA: list[tuple[str, Any, Any, str]] = [
    ("float spellings", msgspec.Raw(b'{"1.0": "a", "1": "b"}'), dict[float, str], "`$`"),
    ("exponent", msgspec.Raw(b'{"w": {"1e0": "a", "1": "b"}}'), Weights, "`$.w`"),
    ("signed zero", msgspec.Raw(b'[{"w": {"-0.0": "a", "0": "b"}}]'), list[Weights], "`$[0].w`"),
    ("array-like", msgspec.Raw(b'["Tagged", 1, {"1.5": "a", "15e-1": "b"}]'), Tagged, "`$.w`"),
    (
        "uuid spellings",
        {str(uuid.UUID(int=5)): "a", uuid.UUID(int=5).hex: "b"},
        dict[uuid.UUID, str],
        "`$`",
    ),
]


@pytest.mark.parametrize(
    ("value", "schema", "path"),
    [c[1:] for c in _MERGED_BY_SCHEMA],
    ids=[c[0] for c in _MERGED_BY_SCHEMA],
)
async def test_keys_the_schema_reads_as_one_are_refused(
    harness: rc.Harness, value: Any, schema: Any, path: str
) -> None:
    """Distinct keys that the schema's key type parses to one key raise ValueError; none lost."""
    with pytest.raises(ValueError, match="reads as one key") as caught:
        await _compact(harness, value, schema)
    assert path in str(caught.value)
    assert_nothing_stored(store_root(harness.fs))


async def test_distinct_parsed_keys_are_kept(harness: rc.Harness) -> None:
    """Float keys that stay distinct after parsing are stored and read back."""
    raw = msgspec.Raw(b'{"w": {"1.0": "a", "2": "b", "-1.5": "c"}}')
    compacted = await _compact(harness, raw, Weights)
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Weights)
    assert read == rc.Found(value=Weights(w={1.0: "a", 2.0: "b", -1.5: "c"}))


# ----------------------------------------------------------------------------- finding 5


class Total(msgspec.Struct, frozen=True):
    total: int
    rows: list[Any] = []


_DUPLICATED: list[tuple[str, bytes, Any, str]] = [
    ("top level", b'{"a": 1, "a": 2}', Any, "`$`"),
    ("struct field", b'{"total": 1, "rows": [], "total": 2}', Total, "`$`"),
    ("deep", b'[1, {"x": {"b": 1, "c": [{"d": 1, "d": 1}]}}]', Any, "`$[1][...][...][0]`"),
    ("escaped spelling", b'{"pin": 1, "\\u0070in": 2}', dict[str, int], "`$`"),
]


@pytest.mark.parametrize(
    ("data", "schema", "path"), [c[1:] for c in _DUPLICATED], ids=[c[0] for c in _DUPLICATED]
)
async def test_duplicate_keys_in_raw_json_are_refused(
    harness: rc.Harness, data: bytes, schema: Any, path: str
) -> None:
    """JSON text naming one key twice raises ValueError with the object's path; nothing stored."""
    with pytest.raises(ValueError, match="names one key twice") as caught:
        await _compact(harness, msgspec.Raw(data), schema)
    assert path in str(caught.value)
    assert "pin" not in str(caught.value)
    assert_nothing_stored(store_root(harness.fs))


async def test_raw_json_with_distinct_keys_is_kept(harness: rc.Harness) -> None:
    """Equal values under distinct keys, and equal keys in different objects, are accepted."""
    data = b'{"a": {"k": 1}, "b": {"k": 1}, "c": [{"k": 2}, {"k": 2}]}'
    compacted = await _compact(harness, msgspec.Raw(data), Any)
    assert compacted.output.value == msgspec.json.decode(data)


# ----------------------------------------------------------------------------- finding 17


class Node(msgspec.Struct, frozen=True):
    id: int
    parent: int | None


@pytest.mark.parametrize(
    ("value", "schema"),
    [
        ({"id": 2**64, "parent": None}, Any),
        (Node(id=2**64, parent=None), Node),
        (Node(id=-(2**70), parent=10**40), Node),
        ([None, 10**300, -(10**300), None], list[int | None]),
    ],
    ids=["dict", "struct", "negative", "list"],
)
async def test_integers_beyond_64_bits_are_stored_exactly(
    harness: rc.Harness, value: Any, schema: Any
) -> None:
    """Integers beyond 64 bits next to null are stored exactly and read back equal."""
    compacted = await _compact(harness, value, schema)
    assert compacted.output.value == value
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, schema)
    assert read == rc.Found(value=value)


def _nested(depth: int, make: Any) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = make(value)
    return value


_DEEP: list[tuple[str, Any]] = [
    ("lists 1000", _nested(1000, lambda v: [v])),
    ("dicts 5000", _nested(5000, lambda v: {"k": v})),
    ("pairs 3000", _nested(3000, lambda v: [v, 1])),
    ("raw 100000", msgspec.Raw(b"[" * 100_000 + b"]" * 100_000)),
]


@pytest.mark.parametrize("value", [c[1] for c in _DEEP], ids=[c[0] for c in _DEEP])
async def test_deep_nesting_is_refused_with_value_error(harness: rc.Harness, value: Any) -> None:
    """Nesting beyond the recursion limit raises ValueError, not RecursionError; nothing stored."""
    with pytest.raises(ValueError, match="nests too deeply"):
        await _compact(harness, value, Any)
    assert_nothing_stored(store_root(harness.fs))


async def test_moderate_nesting_round_trips(harness: rc.Harness) -> None:
    """Two hundred levels of nesting are stored and read back equal."""
    value = _nested(200, lambda v: {"k": [v]})
    compacted = await _compact(harness, value, Any)
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Any)
    assert read == rc.Found(value=value)


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"note": "a\ud800b"}, "string that is not valid Unicode (a lone surrogate) at `$[...]`"),
        ({"a\udfff": 1}, "key that is not valid Unicode (a lone surrogate) in the object at `$`"),
        ([1, {2: "\ud800"}], "at `$[1][...]`"),
    ],
    ids=["value", "key", "non-str-keyed dict"],
)
async def test_lone_surrogates_are_refused_with_a_path(
    harness: rc.Harness, value: Any, path: str
) -> None:
    """A lone surrogate in a string or key raises ValueError naming where, not what."""
    with pytest.raises(ValueError, match="not valid Unicode") as caught:
        await _compact(harness, value, Any)
    assert path in str(caught.value)
    assert "\ud800" not in str(caught.value)
    assert_nothing_stored(store_root(harness.fs))


def test_unencodable_values_raise_value_error() -> None:
    """A set mixing types JSON cannot sort raises ValueError, not TypeError."""
    with pytest.raises(ValueError, match="cannot be encoded as JSON"):
        canonical_bytes({"s": {1, "a"}, 2: 0})


# ----------------------------------------------------------------------------- what is written


class _HiddenValues(dict[str, Any]):
    def values(self) -> Any:
        return [0.0 for _ in dict.values(self)]


class _HiddenItems(list[Any]):
    def __getitem__(self, index: Any) -> Any:
        return 0.0


class _HiddenKeys(dict[Any, Any]):
    def __iter__(self) -> Any:
        return iter(["a", "b"])


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        pytest.param([_HiddenValues(v=math.nan)], "NaN or infinity at `$[0][...]`", id="values"),
        pytest.param({"a": _HiddenItems([math.nan])}, "NaN or infinity at `$[...][0]`", id="items"),
        pytest.param(
            [_HiddenKeys({1: "one", "1": "also one"})], "same JSON string in the object", id="keys"
        ),
    ],
)
async def test_what_a_subclass_hides_is_refused_as_the_encoder_writes_it(
    harness: rc.Harness, value: Any, problem: str
) -> None:
    """The refusal walk reads a container's own items, as msgspec writes them.

    Walked through the subclass's methods, the NaN was not seen and was stored as ``null``
    (read back Found with None), and the two keys that become one were stored as one.
    """
    with pytest.raises(ValueError, match=re.escape(problem)):
        await _compact(harness, value, Any)
    assert_nothing_stored(store_root(harness.fs))


class _Box(msgspec.Struct):
    a: Any


@pytest.mark.parametrize(
    "value",
    [mock.MagicMock(spec=list), _Box(a=mock.MagicMock(spec=dict))],
    ids=["list", "dict-field"],
)
async def test_an_object_that_only_claims_to_be_a_container_is_a_value_error(
    harness: rc.Harness, value: Any
) -> None:
    """A mock passes ``isinstance(x, list)``; the encoder goes by type: a ValueError."""
    with pytest.raises(ValueError, match="MagicMock is unsupported"):
        await _compact(harness, value, Any)
    assert_nothing_stored(store_root(harness.fs))


@dataclasses.dataclass
class _IntKeyed:
    x: dict[int, int]


class _BesideAList(msgspec.Struct):
    a: Any
    b: list[int]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(_BesideAList(a=_IntKeyed(x={1: 2}), b=[1, 2]),
                     {"a": {"x": {"1": 2}}, "b": [1, 2]}, id="beside-a-list"),
        pytest.param([msgspec.Raw(b"1"), {1: 2}], [1, {"1": 2}], id="beside-a-raw"),
    ],
)  # fmt: skip
async def test_int_keys_beside_a_walked_field_or_a_raw_are_kept(
    harness: rc.Harness, value: Any, expected: Any
) -> None:
    """A Raw (the walk's placeholder for a field, or the caller's) beside int keys was refused."""
    compacted = await _compact(harness, value, Any)
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Any)
    assert read == rc.Found[Any](value=expected)


class _RawItems(dict[str, Any]):
    def values(self) -> Any:
        return [msgspec.Raw(b" 2")]

    def items(self) -> Any:
        return [("b", msgspec.Raw(b" 2"))]


class _RawIter(list[Any]):
    def __iter__(self) -> Any:
        return iter([msgspec.Raw(b" 2")])


class _RawAttr(msgspec.Struct):
    x: Any

    def __getattribute__(self, name: str) -> Any:
        if name == "x":
            return msgspec.Raw(b" 2")
        return super().__getattribute__(name)


class _OwnMake(tuple[Any, ...]):
    @classmethod
    def _make(cls, items: Any) -> Any:
        return ("other",)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(_RawItems({"a": 1}), {"a": 1}, id="dict-items"),
        pytest.param(_RawIter([1]), [1], id="list-iter"),
        pytest.param(_RawAttr(x=1), {"x": 1}, id="struct-getattribute"),
        pytest.param(_OwnMake((msgspec.Raw(b" 1"),)), [1], id="tuple-make"),
    ],
)
async def test_the_raw_walk_keeps_what_the_encoder_writes(
    harness: rc.Harness, value: Any, expected: Any
) -> None:
    """The walk that makes Raws canonical rebuilt containers from a subclass's methods (a
    named tuple's ``_make``): what they showed was stored, not the caller's items."""
    compacted = await _compact(harness, value, Any)
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Any)
    assert read == rc.Found[Any](value=expected)


class _MeasuresItsRaw(msgspec.Struct):
    raw: Any
    size: int = 0

    def __post_init__(self) -> None:
        self.size = len(bytes(self.raw)) if isinstance(self.raw, msgspec.Raw) else -1


async def test_a_struct_holding_a_raw_is_not_remade_through_its_post_init(
    harness: rc.Harness,
) -> None:
    """Its Raw made canonical, the struct was copied and the copy ran ``__post_init__`` on the
    new text: ``size`` 13 was stored where the value handed in says 18."""
    value = _MeasuresItsRaw(raw=msgspec.Raw(b' {"b": 1,  "a": 2}'))
    compacted = await _compact(harness, value, Any)
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Any)
    assert read == rc.Found[Any](value={"raw": {"a": 2, "b": 1}, "size": 18})


@dataclasses.dataclass
class _Holder:
    a: Any


class _RawMember(enum.Enum):
    TWICE = msgspec.Raw(b'{"q":1,"q":2}')


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        pytest.param(_Holder(a=msgspec.Raw(b'1,"b":2')), "is not one JSON value", id="member"),
        pytest.param(_Holder(a=msgspec.Raw(b'{"q":1,"q":2}')), "names one key twice", id="twice"),
        pytest.param([_RawMember.TWICE], "names one key twice", id="enum"),
    ],
)
async def test_a_raw_in_a_dataclass_or_an_enum_is_checked(
    harness: rc.Harness, value: Any, problem: str
) -> None:
    """msgspec writes a Raw inside these as it is: ``1,"b":2`` added a member to the dataclass."""
    with pytest.raises(ValueError, match=problem):
        await _compact(harness, value, Any)
    assert_nothing_stored(store_root(harness.fs))
    spaced = await _compact(harness, _Holder(a=msgspec.Raw(b' {"q": 1}')), Any)
    read = await rc.response_compaction_read_exact(harness, spaced.receipt.exact_ref, Any)
    assert read == rc.Found[Any](value={"a": {"q": 1}})


class _SlicesHide(list[Any]):
    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: Any) -> Any:
        return [] if isinstance(index, slice) else 0.0


class _NanMember(enum.Enum):
    A = math.nan


_NAN_MEMBER: Any = _NanMember.A  # the caller's struct, unvalidated: it may hold anything


class _Optional(msgspec.Struct):
    x: float | None


class _Optionals(msgspec.Struct):
    xs: list[float | None]


class _ShowsZero(msgspec.Struct):
    x: float | None

    def __getattribute__(self, name: str) -> Any:
        if name == "x":
            return 0.0
        return super().__getattribute__(name)


class _NoFields(msgspec.Struct):
    x: Any

    def __getattribute__(self, name: str) -> Any:
        if name in ("__struct_fields__", "__struct_encode_fields__"):
            return ()
        return super().__getattribute__(name)


@pytest.mark.parametrize(
    ("value", "schema"),
    [
        pytest.param(_SlicesHide([math.nan, 1]), Any, id="narrowed-slices"),
        pytest.param(_Optional(x=_NAN_MEMBER), _Optional, id="enum-of-nan"),
        pytest.param(_Optionals(xs=[_NAN_MEMBER]), _Optionals, id="enum-of-nan-in-list"),
        pytest.param(_ShowsZero(x=math.nan), _ShowsZero, id="getattribute"),
        pytest.param(_NoFields(x=math.nan), Any, id="no-fields-shown"),
    ],
)
async def test_a_nan_hidden_from_the_checks_is_refused(
    harness: rc.Harness, value: Any, schema: Any
) -> None:
    """Each was stored as ``null`` and read back Found with None (the value handed in held a
    NaN): the checks read what a subclass or an enum showed, not what msgspec writes."""
    with pytest.raises(ValueError, match="NaN or infinity"):
        await _compact(harness, value, schema)
    assert_nothing_stored(store_root(harness.fs))


class _OneKeyShown(dict[str, int]):
    def __len__(self) -> int:
        return 1

    def values(self) -> Any:
        return [1]


_UUID = "c0a80101-0000-4000-8000-000000000001"


@pytest.mark.parametrize(
    ("value", "schema"),
    [
        pytest.param(_OneKeyShown({_UUID: 1, _UUID.upper(): 2}), dict[uuid.UUID, int], id="dict"),
        pytest.param(({_UUID: 1, _UUID.upper(): 2},), list[dict[uuid.UUID, int]], id="tuple"),
    ],
)
async def test_keys_the_schema_merges_are_refused_whatever_the_container(
    harness: rc.Harness, value: Any, schema: Any
) -> None:
    with pytest.raises(ValueError, match="reads as one key"):
        await _compact(harness, value, schema)
    assert_nothing_stored(store_root(harness.fs))


async def test_a_string_the_walk_was_not_shown_is_refused_without_its_text(
    harness: rc.Harness,
) -> None:
    """The encoder's UnicodeEncodeError (it holds the whole text) was raised as it was."""
    with pytest.raises(ValueError, match="not valid Unicode") as caught:
        await _compact(harness, _NoFields(x="sk-SECRET-\ud800"), Any)
    assert "SECRET" not in repr(caught.value.args)
