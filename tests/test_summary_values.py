"""What a model may answer that its schema takes but the agent must not get: rungs, never crashes.

The real openai client over real HTTP to the scripted server, on asyncio and trio. Pydantic
takes ``1e999`` (infinity) for a float, which canonical JSON refuses; grounding looks fields
up by their Python names, also where a Struct renames them or the schema is pydantic's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

import response_compaction as rc
from response_compaction._options import resolve_options
from tests.fake_openai import FakeOpenAI, Reply, fake_openai, summary_reply
from tests.test_coverage import harness_for

pydantic = pytest.importorskip("pydantic")

pytestmark = pytest.mark.anyio


class Hit(msgspec.Struct, frozen=True):
    id: int
    code: str


class Hits(msgspec.Struct, frozen=True):
    hits: list[Hit]


class Scored(pydantic.BaseModel):  # type: ignore[name-defined,misc]
    overview: str
    score: float


class Named(pydantic.BaseModel):  # type: ignore[name-defined,misc]
    overview: str
    codes: list[str]


class Camel(msgspec.Struct, frozen=True, rename="camel"):
    overview: str
    error_codes: list[str]


VALUE = Hits(hits=[Hit(id=i, code=f"ERR-{i:04d}") for i in range(2000)])
INVENTED = ["ERR-9999x", "acct_77x1"]  # in no hit
FOUND = ["ERR-0042"]


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with fake_openai() as fake:
        yield fake


async def compact(harness: rc.Harness, schema: Any, fallback: Any, **options: Any) -> Any:
    opts = {"fallback": fallback, "ladder": "main", "summarize_above_bytes": 1000, **options}
    return await rc.response_compact(harness, VALUE, Hits, schema, opts)


def outcomes(compacted: Any) -> list[tuple[str, str]]:
    return [(a.route, a.outcome) for a in compacted.receipt.attempts]


@pytest.mark.parametrize("coverage", ["head", "full"])
async def test_an_infinite_float_is_an_invalid_rung_not_a_crash(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, coverage: str
) -> None:
    """``1e999`` validates as a pydantic float; the rung is invalid and the next one answers."""
    server.script("a", Reply(content='{"overview": "ok", "score": 1e999}'))
    server.script("b", summary_reply({"overview": "fine", "score": 0.5}))
    fallback = Scored(overview="fallback", score=0.0)
    async with harness_for(workspace, server, ["a", "b"]) as harness:
        compacted = await compact(harness, Scored, fallback, coverage=coverage)
    assert compacted.output.kind == "summarized"
    assert compacted.output.value == Scored(overview="fine", score=0.5)
    assert ("a", "invalid") in outcomes(compacted)


async def test_only_infinite_floats_give_the_fallback(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    server.script("a", Reply(content='{"overview": "ok", "score": -1e999}'))
    fallback = Scored(overview="fallback", score=0.0)
    async with harness_for(workspace, server, ["a"]) as harness:
        compacted = await compact(harness, Scored, fallback)
    assert (compacted.output.kind, compacted.receipt.fallback_reason) == ("fallback", "invalid")
    assert compacted.output.value == fallback


@pytest.mark.parametrize(
    ("schema", "field", "fallback"),
    [
        (Named, "codes", Named(overview="fallback", codes=[])),
        (Camel, "error_codes", Camel(overview="fallback", error_codes=[])),
    ],
)
async def test_grounding_checks_pydantic_and_renamed_fields(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, schema: Any, field: str, fallback: Any
) -> None:
    """Invented codes make the rung ungrounded; codes copied from the data are taken."""
    wire = "errorCodes" if schema is Camel else field
    server.script("a", summary_reply({"overview": "x", wire: INVENTED}))
    server.script("b", summary_reply({"overview": "x", wire: FOUND}))
    async with harness_for(workspace, server, ["a", "b"]) as harness:
        compacted = await compact(harness, schema, fallback, grounded=[field])
    assert outcomes(compacted) == [("a", "ungrounded"), ("b", "ok")]
    assert getattr(compacted.output.value, field) == FOUND


def test_grounded_names_a_pydantic_summary_s_fields() -> None:
    fallback = {"overview": "f", "codes": []}
    with pytest.raises(ValueError, match="grounded"):
        resolve_options({"fallback": fallback, "ladder": "m", "grounded": ["nope"]}, Named)
    resolve_options({"fallback": fallback, "ladder": "m", "grounded": ["codes"]}, Named)


def test_the_wire_names_are_what_the_model_is_asked_for() -> None:
    """The renamed schema really is camelCase on the wire (what the test above sends)."""
    assert json.loads(msgspec.json.encode(Camel(overview="o", error_codes=[]))) == {
        "overview": "o",
        "errorCodes": [],
    }


class Partial(msgspec.Struct, frozen=True):
    overview: str
    ids: list[str] | msgspec.UnsetType = msgspec.UNSET


async def test_a_grounded_field_the_reply_left_out_has_nothing_to_check(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """An UNSET field is no identifier: the summary is taken, not a crash."""
    server.script("a", summary_reply({"overview": "rows"}))
    fallback = Partial(overview="fallback", ids=[])
    async with harness_for(workspace, server, ["a"]) as harness:
        compacted = await compact(harness, Partial, fallback, grounded=["ids"])
    assert compacted.output.value == Partial(overview="rows")


@pytest.mark.parametrize(
    "shortened",
    [["ERR-004"], ["RR-0042"], ["ERR-00"]],
    ids=["cut-end", "cut-start", "cut-both"],
)
async def test_a_shortened_identifier_is_not_grounded(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, shortened: list[str]
) -> None:
    """Found as part of a longer one (``ERR-004`` inside ``ERR-0042``) it passed."""
    server.script("a", summary_reply({"overview": "x", "codes": shortened}))
    server.script("b", summary_reply({"overview": "x", "codes": FOUND}))
    fallback = Named(overview="fallback", codes=[])
    async with harness_for(workspace, server, ["a", "b"]) as harness:
        compacted = await compact(harness, Named, fallback, grounded=["codes"])
    assert outcomes(compacted) == [("a", "ungrounded"), ("b", "ok")]


async def test_many_invented_identifiers_are_counted_only_so_far(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """Each is a scan of the data: 20,000 invented ones took 86 s on 7 MB, past any budget.
    One already makes the rung ungrounded; the count stops at ten, each counted once."""
    invented = [f"zz{i}q" for i in range(3000)] * 2
    server.script("a", summary_reply({"overview": "x", "codes": invented}))
    fallback = Named(overview="fallback", codes=[])
    async with harness_for(workspace, server, ["a"]) as harness:
        compacted = await compact(harness, Named, fallback, grounded=["codes"])
    (attempt,) = compacted.receipt.attempts
    assert (attempt.outcome, attempt.error) == ("ungrounded", "10+ identifiers not in the data")


class Strict(msgspec.Struct, frozen=True):
    overview: str

    def __post_init__(self) -> None:
        if self.overview.startswith("boom"):
            raise KeyError(self.overview)


async def test_a_schema_raising_any_exception_is_an_invalid_rung(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """Only ValueError was: a KeyError from the schema's own check crashed the compaction,
    carrying the reply's text."""
    server.script("a", summary_reply({"overview": "boom SECRET-REPLY"}))
    server.script("b", summary_reply({"overview": "fine"}))
    async with harness_for(workspace, server, ["a", "b"]) as harness:
        compacted = await compact(harness, Strict, Strict(overview="fallback"))
    assert outcomes(compacted) == [("a", "invalid"), ("b", "ok")]
    assert compacted.receipt.attempts[0].error == "KeyError"
    assert compacted.output.value == Strict(overview="fine")
