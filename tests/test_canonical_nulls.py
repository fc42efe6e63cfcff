"""A schema that refuses null everywhere lets the encoder skip its NaN scan, never the refusal."""

from __future__ import annotations

import enum
import math
from typing import Any, Literal, Optional

import msgspec
import pytest

import response_compaction as rc
from response_compaction._canonical import iter_canonical
from response_compaction._nulls import null_places, null_refused, nulls_left_to_schema
from response_compaction._store._oneshot import CHECK_HERE_BYTES, SMALL_BYTES
from tests._store_support import entry_files, index_rows, store_root, temp_files
from tests.schemas import FALLBACK, Summary

pytestmark = pytest.mark.anyio

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}


class Floats(msgspec.Struct, frozen=True):
    name: str
    values: list[float]
    labels: dict[str, str]


class Closed(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    x: float


class Open(msgspec.Struct, frozen=True):
    x: float


class OpenWithExtra(Open, frozen=True):
    extra: float


class ClosedWithExtra(Closed, frozen=True):
    extra: float


class HoldsClosed(msgspec.Struct, frozen=True):
    items: list[Closed]


class HoldsOpen(msgspec.Struct, frozen=True):
    items: list[Open]


class Pair(msgspec.Struct, frozen=True, array_like=True):
    a: int


class Tree(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    n: int
    kids: list[Tree]


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


_SCHEMAS: list[tuple[str, Any, bool]] = [
    ("strings and floats", Floats, True),
    ("list of str", list[str], True),
    ("dict of float", dict[str, float], True),
    ("tuple of floats", tuple[float, float], True),
    ("union without None", int | str, True),
    ("literal", Literal["a", 1], True),
    ("enum", Colour, True),
    ("recursive closed struct", Tree, True),
    ("closed struct below the top", list[Closed], True),
    ("holder of closed structs", HoldsClosed, True),
    ("optional", Optional[str], False),  # noqa: UP045 - the spelling users write
    ("None in a union", int | None, False),
    ("literal None", Literal["a", None], False),
    ("Any", Any, False),
    ("Raw", msgspec.Raw, False),
    ("open struct below the top", list[Open], False),
    ("holder of open structs", HoldsOpen, False),
    ("array-like struct", Pair, False),
    ("object", object, False),
]


@pytest.mark.parametrize(
    ("schema", "expected"), [c[1:] for c in _SCHEMAS], ids=[c[0] for c in _SCHEMAS]
)
def test_which_schemas_refuse_null_everywhere(schema: Any, expected: bool) -> None:
    """Only a schema where no position takes null and nothing is skipped answers True."""
    assert null_refused(schema) is expected


def test_a_subclass_instance_is_not_left_to_its_schema() -> None:
    """The top-level value must be of the schema's own type: a subclass's extra fields skip."""
    assert nulls_left_to_schema(Open(x=1.0), Open)
    assert not nulls_left_to_schema(OpenWithExtra(x=1.0, extra=2.0), Open)
    assert not nulls_left_to_schema(Open(x=1.0), Optional[Open])  # noqa: UP045


def test_without_the_scan_a_nan_is_written_as_null() -> None:
    """What the switch changes: the encoder no longer refuses, the schema must."""
    value = Floats(name="n", values=[1.0, math.nan], labels={})
    assert b"null" in b"".join(iter_canonical(value, scan_nulls=False))
    with pytest.raises(ValueError, match=r"NaN or infinity at `\$\.values\[1\]`"):
        b"".join(iter_canonical(value))


def _floats(count: int, bad_at: int, bad: float) -> Floats:
    values = [i / 7 for i in range(count)]
    values[bad_at] = bad
    return Floats(name="f", values=values, labels={f"k{i}": "v" for i in range(count // 10)})


@pytest.mark.parametrize(
    ("count", "bad_at", "bad"),
    [
        (3, 1, math.nan),
        (6_000, 4_321, math.nan),
        (120_000, 99_999, math.inf),
        (120_000, 7, -math.inf),
    ],
    ids=["small", "small, checked beside its fsync", "medium inf", "medium -inf"],
)
async def test_nan_under_a_null_refusing_schema_is_refused_by_name(
    harness: rc.Harness, count: int, bad_at: int, bad: float
) -> None:
    """The read-back refuses the null and the error names the NaN's path; nothing is kept.

    A small value is checked by the put's thread before its fsync, or from some KB by a
    helper beside it: both refuse.
    """
    if count == 6_000:
        size = len(msgspec.json.encode(_floats(count, bad_at, 0.5)))
        assert CHECK_HERE_BYTES < size <= SMALL_BYTES
    with pytest.raises(ValueError, match=rf"NaN or infinity at `\$\.values\[{bad_at}\]`"):
        await rc.response_compact(harness, _floats(count, bad_at, bad), Floats, Summary, OPTIONS)
    root = store_root(harness.fs)
    assert entry_files(root) == set()
    assert temp_files(root) == []
    assert index_rows(root) == set()


@pytest.mark.parametrize(
    ("value", "schema"),
    [
        (OpenWithExtra(x=1.0, extra=math.nan), Open),
        (HoldsClosed(items=[ClosedWithExtra(x=1.0, extra=math.nan)]), HoldsClosed),
        (HoldsOpen(items=[OpenWithExtra(x=1.0, extra=math.nan)]), HoldsOpen),
    ],
    ids=["top-level subclass", "closed subclass below", "open subclass below"],
)
async def test_a_nan_in_fields_a_schema_would_skip_is_refused(
    harness: rc.Harness, value: Any, schema: Any
) -> None:
    """A NaN in a field the decoder ignores is still refused, never stored as null.

    A struct instance is taken as it is, so a subclass may sit where its base is expected.
    """
    with pytest.raises(ValueError, match="NaN or infinity"):
        await rc.response_compact(harness, value, schema, Summary, OPTIONS)
    assert entry_files(store_root(harness.fs)) == set()


# ----------------------------------------------------------------------------- null places


class Record(msgspec.Struct, frozen=True):
    id: int
    score: float
    tags: list[str]
    manager: int | None = None


class RecordWithExtra(Record, frozen=True):
    extra: float = 0.0


class Table(msgspec.Struct, frozen=True):
    query: str
    rows: list[Record]
    by_name: dict[str, Record]
    note: str | None = None


class Hiding(list[Any]):
    """A list whose iteration shows nothing: the encoder writes its items all the same."""

    def __iter__(self) -> Any:
        return iter(())


def _table(**changes: Any) -> Table:
    rows = [Record(id=i, score=i / 3, tags=["a"], manager=None if i % 2 else i) for i in range(50)]
    fields: dict[str, Any] = {"query": "q", "rows": rows, "by_name": {"r": rows[0]}}
    return Table(**{**fields, **changes})


def test_the_places_where_null_validates_are_looked_at_and_nothing_else() -> None:
    """A table of flat records is checked in its optional fields only, and refused from the
    skipped scan as soon as one of them (or an unexpected record type) holds a NaN."""
    assert null_places(Table) is not None
    assert nulls_left_to_schema(_table(), Table)
    assert nulls_left_to_schema(_table(rows=[Record(id=1, score=math.nan, tags=[])]), Table)
    for changed in (
        _table(note=math.nan),
        _table(rows=[Record(id=1, score=0.5, tags=[], manager=math.inf)]),  # type: ignore[arg-type]
        _table(by_name={"x": Record(id=1, score=0.5, tags=[], manager=math.nan)}),  # type: ignore[arg-type]
        _table(rows=[RecordWithExtra(id=1, score=0.5, tags=[], extra=math.nan)]),
        _table(rows=None),  # not the schema's shape: scanned (and refused by validation)
        _table(rows=Hiding([Record(id=1, score=0.5, tags=[], manager=math.nan)])),  # type: ignore[arg-type]
    ):
        assert not nulls_left_to_schema(changed, Table)


class Nested(msgspec.Struct, frozen=True):
    rows: list[list[int | None]]


class Loose(msgspec.Struct, frozen=True):
    rows: list[Open]
    anything: Any = None


@pytest.mark.parametrize("schema", [Nested, Loose, list[Record]], ids=["nested", "Any", "list"])
def test_shapes_the_places_do_not_cover_keep_the_scan(schema: Any) -> None:
    assert null_places(schema) is None


_TABLE_NANS = [
    ("optional field", _table(rows=[Record(id=1, score=0.5, tags=[], manager=math.nan)])),  # type: ignore[arg-type]
    ("required float", _table(rows=[Record(id=1, score=math.nan, tags=[])])),
    ("subclass field", _table(rows=[RecordWithExtra(id=1, score=0.5, tags=[], extra=math.inf)])),
    ("top-level optional", _table(note=-math.inf)),
]


@pytest.mark.parametrize("value", [v for _, v in _TABLE_NANS], ids=[n for n, _ in _TABLE_NANS])
async def test_a_nan_anywhere_in_a_table_is_refused_by_name(
    harness: rc.Harness, value: Table
) -> None:
    """Scanned or left to the schema, a NaN in a table of records is refused and named."""
    with pytest.raises(ValueError, match=r"NaN or infinity at `\$\.(rows\[0\]|note)"):
        await rc.response_compact(harness, value, Table, Summary, OPTIONS)
    assert entry_files(store_root(harness.fs)) == set()
