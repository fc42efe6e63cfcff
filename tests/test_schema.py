"""msgspec summary types -> strict structured-output JSON schemas. Pure: no I/O, no model."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Iterator
from typing import Annotated, Any, Literal, NamedTuple, TypedDict

import msgspec
import pytest

import response_compaction as rc
from response_compaction._schema import schema_name, strict_json_schema
from tests.schemas import Summary

#: Everything a converted node may say; anything else (default, $ref, format, minimum,
#: uniqueItems, discriminator, ...) is either refused by strict mode or not promised by it.
ALLOWED_KEYS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "anyOf",
    "enum",
    "const",
    "description",
    "title",
}


class Inner(msgspec.Struct, frozen=True):
    name: str
    score: float | None = None


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Cat(msgspec.Struct, frozen=True, tag="cat"):
    lives: int


class Dog(msgspec.Struct, frozen=True, tag="dog"):
    good: bool


class Closed(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    flag: bool


class Rich(msgspec.Struct, frozen=True):
    title: Annotated[str, msgspec.Meta(min_length=1, description="What it is")]
    inner: Inner
    level: Level
    mode: Literal["fast", "slow"]
    size: Literal[1, 2, 3]
    pet: Cat | Dog
    tags: set[str]
    numbers: tuple[int, ...]
    when: datetime.datetime
    closed: Closed
    count: Annotated[int, msgspec.Meta(ge=0)] = 0
    inners: list[Inner] = []
    maybe: Inner | None = None
    color: Color = Color.RED
    optional_mode: Literal["a", "b"] | None = None
    literal_none: Literal["x", None] = None


@dataclasses.dataclass(frozen=True)
class Plain:
    a: int
    b: str = "x"


class Partial(TypedDict, total=False):
    a: int


class Node(msgspec.Struct, frozen=True):
    children: list[Node]


class Ping(msgspec.Struct, frozen=True):
    pong: Pong | None


class Pong(msgspec.Struct, frozen=True):
    ping: Ping | None


class WithDict(msgspec.Struct, frozen=True):
    meta: dict[str, int]


class WithAny(msgspec.Struct, frozen=True):
    anything: Any


class WithRaw(msgspec.Struct, frozen=True):
    raw: msgspec.Raw


class WithPair(msgspec.Struct, frozen=True):
    pair: tuple[int, str]


class Point(NamedTuple):
    x: int


class WithPoint(msgspec.Struct, frozen=True):
    point: Point


class WithMixed(msgspec.Struct, frozen=True):
    either: Literal[1, "one"]


class AsArray(msgspec.Struct, frozen=True, array_like=True):
    a: int


class Twice(msgspec.Struct, frozen=True):
    first: Inner
    second: Inner


def nodes(schema: Any) -> Iterator[dict[str, Any]]:
    """Every schema node, depth first."""
    if isinstance(schema, dict):
        yield schema
        for key, value in schema.items():
            if key == "properties":
                for child in value.values():
                    yield from nodes(child)
            elif key in ("items", "anyOf"):
                yield from nodes(value)
    elif isinstance(schema, list):
        for child in schema:
            yield from nodes(child)


def assert_strict(schema: dict[str, Any]) -> None:
    assert schema["type"] == "object"
    for node in nodes(schema):
        assert set(node) <= ALLOWED_KEYS, set(node) - ALLOWED_KEYS
        if node.get("type") == "object":
            assert node["additionalProperties"] is False
            assert node["required"] == list(node["properties"])
        if "enum" in node:
            assert node["type"] in ("string", "integer")
            kind = str if node["type"] == "string" else int
            assert all(type(v) is kind for v in node["enum"])


def test_struct_root_becomes_a_closed_object_with_every_field_required() -> None:
    """The shared Summary converts to exactly the strict object the API wants."""
    assert strict_json_schema(Summary) == {
        "title": "Summary",
        "type": "object",
        "properties": {
            "overview": {"type": "string"},
            "critical_facts": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["overview", "critical_facts"],
        "additionalProperties": False,
    }


def test_rich_schema_is_strict_everywhere() -> None:
    """Nested, optional, enum, union, set and constrained fields all come out strict."""
    schema = strict_json_schema(Rich)
    assert_strict(schema)
    props = schema["properties"]
    assert schema["required"] == list(Rich.__struct_fields__)  # defaults are required too
    assert props["inner"]["properties"]["score"] == {
        "anyOf": [{"type": "number"}, {"type": "null"}]
    }
    assert props["inners"]["items"]["properties"].keys() == {"name", "score"}
    assert props["maybe"]["anyOf"][1] == {"type": "null"}
    assert props["color"]["type"] == "string"
    assert sorted(props["color"]["enum"]) == ["blue", "red"]
    assert props["level"]["type"] == "integer"
    assert props["size"] == {"type": "integer", "enum": [1, 2, 3]}
    assert props["optional_mode"]["anyOf"] == [
        {"type": "string", "enum": ["a", "b"]},
        {"type": "null"},
    ]
    assert props["literal_none"]["anyOf"] == [{"type": "string", "enum": ["x"]}, {"type": "null"}]
    pets = props["pet"]["anyOf"]
    assert [p["properties"]["type"] for p in pets] == [
        {"type": "string", "enum": ["cat"]},
        {"type": "string", "enum": ["dog"]},
    ]
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["numbers"] == {"type": "array", "items": {"type": "integer"}}
    assert props["count"] == {"type": "integer"}  # the bound stays with msgspec's decoder
    assert props["title"] == {"type": "string", "description": "What it is"}
    assert props["closed"]["additionalProperties"] is False


def test_forbid_unknown_fields_struct_is_accepted() -> None:
    """A Struct that already forbids unknown fields is a closed object, not a free-form map."""
    assert strict_json_schema(Closed) == {
        "title": "Closed",
        "type": "object",
        "properties": {"flag": {"type": "boolean"}},
        "required": ["flag"],
        "additionalProperties": False,
    }


@pytest.mark.parametrize("schema", [Plain, Partial, Twice])
def test_other_object_types_convert(schema: Any) -> None:
    """Dataclasses, TypedDicts and a Struct reused (not recursively) convert strictly."""
    converted = strict_json_schema(schema)
    assert_strict(converted)


def test_a_reply_that_fits_the_sent_schema_still_meets_msgspec() -> None:
    """Constraints dropped from the sent schema are still checked by the decoder."""
    schema = strict_json_schema(Rich)
    assert "minimum" not in str(schema)
    reply = {
        "title": "t",
        "inner": {"name": "n", "score": None},
        "level": 1,
        "mode": "fast",
        "size": 2,
        "pet": {"type": "cat", "lives": 9},
        "tags": ["a"],
        "numbers": [1],
        "when": "2026-01-01T00:00:00Z",
        "closed": {"flag": True},
        "count": 3,
        "inners": [],
        "maybe": None,
        "color": "blue",
        "optional_mode": None,
        "literal_none": "x",
    }
    assert msgspec.convert(reply, Rich).count == 3
    with pytest.raises(msgspec.ValidationError, match="count"):
        msgspec.convert({**reply, "count": -1}, Rich)


def test_conversion_is_deterministic() -> None:
    """The same type converts to equal schemas every time (it is part of the cache key)."""
    assert strict_json_schema(Rich) == strict_json_schema(Rich)
    assert msgspec.json.encode(strict_json_schema(Rich)) == msgspec.json.encode(
        strict_json_schema(Rich)
    )


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        pytest.param(dict[str, int], "free-form", id="dict-root"),
        pytest.param(WithDict, "$.meta", id="dict-field"),
        pytest.param(WithAny, "$.anything", id="any-field"),
        pytest.param(WithRaw, "$.raw", id="raw-field"),
        pytest.param(Node, "recursive", id="recursive"),
        pytest.param(Ping, "recursive", id="mutually-recursive"),
        pytest.param(str, "object", id="string-root"),
        pytest.param(int, "object", id="int-root"),
        pytest.param(list[Summary], "object", id="array-root"),
        pytest.param(Summary | None, "object", id="optional-root"),
        pytest.param(Cat | Dog, "object", id="union-root"),
        pytest.param(WithPair, "$.pair", id="fixed-tuple"),
        pytest.param(WithPoint, "$.point", id="namedtuple"),
        pytest.param(AsArray, "prefixItems", id="array-like-struct"),
        pytest.param(WithMixed, "$.either", id="mixed-literal"),
        pytest.param(42, "not a msgspec type", id="not-a-type"),
        pytest.param(object, "not a msgspec type", id="object"),
        pytest.param([Summary], "must be a type", id="unhashable-value"),
    ],
)
def test_inexpressible_schemas_raise_schema_error(schema: Any, where: str) -> None:
    """A shape strict mode cannot express is a SchemaError (a ValueError) saying where."""
    with pytest.raises(rc.SchemaError, match=where.replace("$", r"\$")) as raised:
        strict_json_schema(schema)
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize(
    ("schema", "name"),
    [
        pytest.param(Summary, "Summary", id="plain"),
        pytest.param(type("Résumé v2", (), {}), "R_sum__v2", id="unsafe-characters"),
        pytest.param(type("A" * 80, (), {}), "A" * 64, id="too-long"),
        pytest.param(list[int], "list", id="generic-alias"),
        pytest.param(42, "summary", id="nameless"),
    ],
)
def test_schema_name_fits_the_api_pattern(schema: Any, name: str) -> None:
    """The response-format name is [A-Za-z0-9_-]{1,64}, derived from the type's name."""
    assert schema_name(schema) == name
