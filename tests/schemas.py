"""Module-level schemas shared by tests (module level so worker processes can load them)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec


class Row(msgspec.Struct, frozen=True):
    id: int
    name: str
    tags: list[str] = []
    score: float | None = None


class Exact(msgspec.Struct, frozen=True):
    rows: list[Row]
    total: Annotated[int, msgspec.Meta(ge=0)]


class Summary(msgspec.Struct, frozen=True):
    overview: str
    critical_facts: list[str]


FALLBACK = Summary(overview="Exact response retained.", critical_facts=[])


def big_exact(rows: int, name_len: int = 20) -> Exact:
    """An Exact value of about ``rows * (name_len + 40)`` canonical bytes."""
    return Exact(rows=[Row(id=i, name="n" * name_len, tags=["a"]) for i in range(rows)], total=rows)


class Ticket(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A schema whose refusals used to quote the response: an enum-like field, no extra keys."""

    state: Literal["open", "closed"]
    pin: Annotated[int, msgspec.Meta(ge=0)] = 0
