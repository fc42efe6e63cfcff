"""Workloads: typed msgspec schemas and deterministic generators sized by canonical bytes.

The schemas live at module level so that the library's pool workers can import them by
reference (the library verifies large values in a worker process). Every generator is seeded:
the same name and size give the same bytes on every run and every machine.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = [
    "SHAPES",
    "Chapter",
    "Document",
    "Group",
    "Leaf",
    "Row",
    "Rows",
    "Section",
    "Strings",
    "Summary",
    "Workload",
    "build",
    "canonical",
    "small_responses",
]

MB = 1_000_000


# ----------------------------------------------------------------------------- list of rows


class Row(msgspec.Struct, frozen=True, kw_only=True):
    """One row of a query result: the shape of most large tool responses."""

    id: int
    name: str
    email: str
    score: float
    active: bool
    created_at: str
    tags: list[str]
    manager_id: int | None


class Rows(msgspec.Struct, frozen=True, kw_only=True):
    """A query result: a little metadata and one long list of rows."""

    query: str
    total: int
    next_cursor: str | None
    rows: list[Row]


# ----------------------------------------------------------------------------- deeply nested


class Leaf(msgspec.Struct, frozen=True, kw_only=True):
    """The innermost level: a measurement."""

    key: str
    value: float
    count: int
    flags: list[bool]


class Group(msgspec.Struct, frozen=True, kw_only=True):
    """Level 3: leaves under a weighted group."""

    name: str
    weight: float
    leaves: list[Leaf]


class Section(msgspec.Struct, frozen=True, kw_only=True):
    """Level 2: groups and free-form string attributes."""

    title: str
    attrs: dict[str, str]
    groups: list[Group]


class Chapter(msgspec.Struct, frozen=True, kw_only=True):
    """Level 1: sections."""

    id: int
    sections: list[Section]


class Document(msgspec.Struct, frozen=True, kw_only=True):
    """The root: structs within lists within structs, five levels deep."""

    title: str
    revision: int
    chapters: list[Chapter]


# ----------------------------------------------------------------------------- small strings


class Strings(msgspec.Struct, frozen=True, kw_only=True):
    """Many short strings (some needing escapes or non-ASCII) and a string-to-string map."""

    source: str
    words: list[str]
    labels: dict[str, str]


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    """The summary schema every case passes (never produced: the harness has no model)."""

    text: str


# ----------------------------------------------------------------------------- generators


def _rows(count: int, seed: int) -> Rows:
    rng = random.Random(seed)
    tags = ["alpha", "beta", "gamma", "delta", "eu-west", "us-east", "vip", "trial", "churn"]
    first = ["ada", "grace", "alan", "edsger", "barbara", "donald", "frances", "ken", "liskov"]
    rows = [
        Row(
            id=seed * 10_000_000 + i,
            name=f"{rng.choice(first).title()} {rng.choice(first).title()}-{i}",
            email=f"user{i}.{seed}@example.com",
            score=round(rng.random() * 1000, 3),
            active=rng.random() < 0.8,
            created_at=f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:00Z",
            tags=rng.sample(tags, 1 + i % 3),
            manager_id=None if i % 7 == 0 else rng.randrange(1, 1 + max(i, 1)),
        )
        for i in range(count)
    ]
    return Rows(query=f"users?seed={seed}&order=id", total=count, next_cursor=None, rows=rows)


_ROW_BYTES = 187  # canonical bytes per row, measured; sizes are checked after building


def _document(chapters: int, seed: int) -> Document:
    rng = random.Random(seed)

    def leaf(i: int) -> Leaf:
        return Leaf(
            key=f"m{i}",
            value=round(rng.random(), 6),
            count=rng.randrange(1000),
            flags=[rng.random() < 0.5 for _ in range(3)],
        )

    return Document(
        title=f"report {seed}",
        revision=seed,
        chapters=[
            Chapter(
                id=c,
                sections=[
                    Section(
                        title=f"section {c}.{s}",
                        attrs={"owner": f"team-{s}", "status": "final", "c": str(c)},
                        groups=[
                            Group(
                                name=f"g{g}",
                                weight=round(rng.random(), 4),
                                leaves=[leaf(k) for k in range(8)],
                            )
                            for g in range(8)
                        ],
                    )
                    for s in range(8)
                ],
            )
            for c in range(chapters)
        ],
    )


_CHAPTER_BYTES = 38_300


_ODD = ['"quoted"', "tab\there", "line\nbreak", "café", "naïve", "日本", "🙂", "back\\slash"]


def _strings(count: int, seed: int) -> Strings:
    rng = random.Random(seed)
    letters = string.ascii_lowercase
    pool = ["".join(rng.choices(letters, k=rng.randrange(3, 10))) for _ in range(4096)]
    pool += _ODD
    words = [f"{pool[rng.randrange(len(pool))]}{i:x}" for i in range(count)]
    labels = {f"k{i:07d}": pool[i % len(pool)] for i in range(count // 10)}
    return Strings(source=f"tokens {seed}", words=words, labels=labels)


_STRING_BYTES = 16


@dataclass(frozen=True, slots=True)
class Shape:
    """A workload family: its schema and how to build a value of about ``n`` bytes."""

    name: str
    schema: type[msgspec.Struct]
    make: Callable[[int, int], Any]
    unit_bytes: int
    what: str


SHAPES: dict[str, Shape] = {
    "rows": Shape("rows", Rows, _rows, _ROW_BYTES, "list of typed rows (8 fields)"),
    "nested": Shape(
        "nested", Document, _document, _CHAPTER_BYTES, "5 levels: struct/list/struct/list/..."
    ),
    "strings": Shape(
        "strings", Strings, _strings, _STRING_BYTES, "short strings + str->str map, some escaped"
    ),
}


@dataclass(frozen=True, slots=True)
class Workload:
    """A built value, its schema and its canonical bytes (what every peer stores)."""

    shape: str
    target_bytes: int
    schema: type[msgspec.Struct]
    value: Any
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)


_ENCODER = msgspec.json.Encoder(order="sorted")


def canonical(value: Any) -> bytes:
    """The library's canonical form: msgspec JSON, keys sorted, no whitespace."""
    return _ENCODER.encode(value)


def build(shape: str, target_bytes: int, seed: int = 1) -> Workload:
    """A value of ``shape`` whose canonical JSON is about ``target_bytes``."""
    spec = SHAPES[shape]
    units = max(1, round(target_bytes / spec.unit_bytes))
    value = spec.make(units, seed)
    data = canonical(value)
    return Workload(shape, target_bytes, spec.schema, value, data)


def small_responses(count: int, size: int = 2_000, seed: int = 7) -> list[Rows]:
    """``count`` distinct responses of about ``size`` canonical bytes each."""
    per = max(1, round(size / _ROW_BYTES))
    return [_rows(per, seed * 1_000_000 + i) for i in range(count)]
