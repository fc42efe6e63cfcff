"""Schemas from the ecosystem: pydantic v2 models, dataclasses and TypedDicts, exact and summary."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
import sys
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import msgspec
import openai
import pytest
from pydantic import BaseModel, Field, field_validator

import response_compaction as rc
from response_compaction._canonical import canonical_bytes
from response_compaction._schema import strict_json_schema
from tests._store_support import entry_files, store_root
from tests.fake_openai import FakeOpenAI, fake_openai, summary_reply

pytestmark = pytest.mark.anyio

WHEN = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)


class RowP(BaseModel):
    id: int
    name: str
    score: float | None = None
    page_id: str = Field(default="p", alias="pageId")


class PageP(BaseModel):
    rows: list[RowP]
    total: Annotated[int, Field(ge=0)]
    at: dt.datetime


class RowS(msgspec.Struct, frozen=True, rename={"page_id": "pageId"}):
    id: int
    name: str
    score: float | None = None
    page_id: str = "p"


class PageS(msgspec.Struct, frozen=True):
    rows: list[RowS]
    total: Annotated[int, msgspec.Meta(ge=0)]
    at: dt.datetime


class SummaryP(BaseModel):
    overview: str
    critical_facts: list[str]


class SummaryS(msgspec.Struct, frozen=True):
    overview: str
    critical_facts: list[str]


class LooseSummaryP(BaseModel):
    overview: str
    counts: dict[str, int]


@dataclasses.dataclass(frozen=True)
class RowD:
    id: int
    name: str


class SummaryTD(TypedDict):
    overview: str
    critical_facts: list[str]


FALLBACK_P = SummaryP(overview="retained", critical_facts=[])


def page_data(rows: int) -> dict[str, Any]:
    return {
        "rows": [
            {"id": i, "name": f"n{i}", "score": i / 3 if i % 2 else None, "pageId": f"p{i % 5}"}
            for i in range(rows)
        ],
        "total": rows,
        "at": WHEN,
    }


def options(fallback: Any = FALLBACK_P, **more: Any) -> dict[str, Any]:
    return {"fallback": fallback, "ladder": "main", **more}


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with fake_openai() as fake:
        yield fake


async def test_pydantic_exact_schema_round_trips(harness: rc.Harness) -> None:
    """A BaseModel exact schema is validated by pydantic and read back as an equal model."""
    page = PageP.model_validate(page_data(2000))
    compacted = await rc.response_compact(harness, page, PageP, SummaryP, options())
    assert compacted.output.kind == "fallback"
    assert compacted.output.value == FALLBACK_P
    found = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, PageP)
    assert isinstance(found, rc.Found)
    assert found.value == page

    small = await rc.response_compact(harness, page_data(2), PageP, SummaryP, options())
    assert small.output.kind == "exact"
    assert small.output.value == PageP.model_validate(page_data(2))


async def test_pydantic_and_msgspec_bytes_are_identical(harness: rc.Harness) -> None:
    """Equal data under a BaseModel and under a Struct gives the same canonical bytes."""
    data = page_data(300)
    by_model = await rc.response_compact(harness, data, PageP, SummaryP, options())
    fallback_s = SummaryS(overview="retained", critical_facts=[])
    by_struct = await rc.response_compact(harness, data, PageS, SummaryS, options(fallback_s))
    assert by_model.receipt.exact_digest == by_struct.receipt.exact_digest
    assert by_struct.receipt.exact_cache == "reused"
    page = PageP.model_validate(data)
    assert canonical_bytes(page) == canonical_bytes(msgspec.convert(data, PageS))


async def test_raw_json_is_validated_by_pydantic(harness: rc.Harness) -> None:
    """msgspec.Raw JSON goes through pydantic's JSON validation (an ISO datetime string)."""
    raw = msgspec.Raw(b'{"rows":[],"total":0,"at":"2026-01-02T03:04:05.678Z"}')
    compacted = await rc.response_compact(harness, raw, PageP, SummaryP, options())
    assert compacted.output.value == PageP(rows=[], total=0, at=WHEN)


async def test_invalid_value_names_the_path_not_the_content(harness: rc.Harness) -> None:
    """A value pydantic refuses raises ValueError with the path, no content, nothing stored."""
    data = page_data(1)
    data["rows"][0]["id"] = "SECRET-TOKEN"
    with pytest.raises(ValueError, match=r"\$\.rows\[0\]\.id") as info:
        await rc.response_compact(harness, data, PageP, SummaryP, options())
    assert "SECRET" not in str(info.value)
    assert entry_files(store_root(harness.fs)) == set()


class Strict(BaseModel, extra="forbid"):
    tags: dict[str, int]
    code: str

    @field_validator("code")
    @classmethod
    def known(cls, value: str) -> str:
        if value != "ok":
            raise ValueError(f"unknown code {value}")  # quotes the input, as validators do
        return value


@pytest.mark.parametrize(
    ("data", "where", "what"),
    [
        ({"tags": {"alice@example.com": "SECRET"}, "code": "ok"}, "$.tags[...]", "valid integer"),
        ({"tags": {}, "code": "SECRET"}, "$.code", "invalid (value_error)"),
        ({"tags": {}, "code": "ok", "SECRET": 1}, "$[...]", "Extra inputs"),
    ],
)
async def test_pydantic_errors_quote_no_value_or_key(
    harness: rc.Harness, data: dict[str, Any], where: str, what: str
) -> None:
    """Custom validators, dict keys and extra keys from the document never reach the message."""
    with pytest.raises(ValueError, match=re.escape(f"{what}")) as info:
        await rc.response_compact(harness, data, Strict, SummaryP, options())
    message = str(info.value)
    assert f"at `{where}`" in message
    assert "SECRET" not in message
    assert "alice" not in message


class Ledger(BaseModel):
    accounts: dict[int, int]
    ids: list[uuid.UUID]


@pytest.mark.parametrize(
    ("data", "where", "what"),
    [
        # pydantic puts an int key of a dict in the path as it puts an index: the account
        # number 48213377 was printed as an index (adversarial review, 2026-12-04).
        ({"accounts": {48213377: "x"}, "ids": []}, "$.accounts[...]", "valid integer"),
        ({"accounts": {}, "ids": ["Kx9-not-a-uuid"]}, "$.ids[0]", "invalid (uuid_parsing)"),
    ],
)
async def test_pydantic_errors_quote_no_int_key_and_no_character(
    harness: rc.Harness, data: dict[str, Any], where: str, what: str
) -> None:
    """An int dict key is ``[...]``, a list index stays one; a bad UUID's character is not shown."""
    with pytest.raises(ValueError, match=re.escape(what)) as info:
        await rc.response_compact(harness, data, Ledger, SummaryP, options())
    message = str(info.value)
    assert f"at `{where}`" in message
    assert "48213377" not in message
    assert "`K`" not in message


async def test_nan_in_a_model_is_refused(harness: rc.Harness) -> None:
    """A NaN inside a pydantic model is refused, as it is from a Struct."""
    data = page_data(1)
    data["rows"][0]["score"] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        await rc.response_compact(harness, data, PageP, SummaryP, options())


async def test_tampered_content_that_pydantic_refuses_reads_broken(harness: rc.Harness) -> None:
    """Bytes that still hash-check but no longer fit the model read as Broken (no content)."""
    raw = msgspec.Raw(b'{"rows":[],"total":-1,"at":"2026-01-02T03:04:05Z"}')
    ref = (await rc.response_compact(harness, raw, Any, SummaryP, options())).receipt.exact_ref
    read = await rc.response_compaction_read_exact(harness, ref, PageP)
    assert isinstance(read, rc.Broken)
    assert "-1" not in read.detail


async def test_pydantic_summary_from_the_model(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A BaseModel summary schema: strict schema sent, reply validated into the model, cached."""
    server.script("small", summary_reply({"overview": "rows", "critical_facts": ["a"]}))
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="t") as client:
        harness = rc.Harness(fs=workspace, llm=rc.OpenAICatalog(client, {"main": ["small"]}))
        first = await rc.response_compact(harness, page_data(600), PageP, SummaryP, options())
        again = await rc.response_compact(harness, page_data(600), PageP, SummaryP, options())
    assert first.output == rc.SummarizedOutput(
        value=SummaryP(overview="rows", critical_facts=["a"])
    )
    assert again.output == first.output
    assert again.receipt.summary_cache == "hit"
    sent = server.bodies("small")[0]["response_format"]["json_schema"]
    assert sent["strict"] is True
    assert sent["schema"]["additionalProperties"] is False
    assert sent["schema"]["required"] == ["overview", "critical_facts"]


def test_strict_schema_matches_the_struct_one() -> None:
    """A model's strict schema is the equivalent Struct's, titles aside."""

    def untitled(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: untitled(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [untitled(v) for v in node]
        return node

    assert untitled(strict_json_schema(SummaryP)) == untitled(strict_json_schema(SummaryS))


@pytest.mark.parametrize("schema", [LooseSummaryP, dict[str, int]])
async def test_strict_mode_is_checked_without_a_model(harness: rc.Harness, schema: Any) -> None:
    """A summary schema strict mode refuses fails with llm=None too, before anything is stored."""
    fallback: Any = {"overview": "x", "counts": {}} if schema is LooseSummaryP else {}
    with pytest.raises(rc.SchemaError):
        await rc.response_compact(harness, page_data(1), PageP, schema, options(fallback))
    assert entry_files(store_root(harness.fs)) == set()


async def test_unknown_ladder_is_refused_for_small_responses_too(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """With a catalog, an unknown ladder raises LookupError even when no summary is needed."""
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="t") as client:
        harness = rc.Harness(fs=workspace, llm=rc.OpenAICatalog(client, {"main": ["small"]}))
        for rows in (1, 600):
            with pytest.raises(LookupError, match="nosuch"):
                await rc.response_compact(
                    harness, page_data(rows), PageP, SummaryP, options(ladder="nosuch")
                )
    assert server.count() == 0


async def test_fallback_is_validated_by_pydantic(harness: rc.Harness) -> None:
    """A fallback the summary model refuses raises ValueError naming the fallback option."""
    with pytest.raises(ValueError, match=r"fallback: .*\$\.critical_facts"):
        await rc.response_compact(
            harness, page_data(1), PageP, SummaryP, options({"overview": "x"})
        )
    opts = rc.CompactionOptions(fallback=FALLBACK_P, ladder="main", summarize_above_bytes=0)
    compacted = await rc.response_compact(harness, page_data(1), PageP, SummaryP, opts)
    assert compacted.output.value == FALLBACK_P


async def test_a_fallback_function_with_a_pydantic_summary_schema(harness: rc.Harness) -> None:
    """A callable fallback is called with the profile (given in a mapping or the struct) and
    what it returns is validated by pydantic, naming the path."""

    def made(profile: rc.Profile) -> SummaryP:
        return SummaryP(overview=f"{profile.record_count} rows", critical_facts=[])

    opts: Any
    for opts in (
        options(made, summarize_above_bytes=0),
        rc.CompactionOptions[SummaryP](fallback=made, ladder="main", summarize_above_bytes=0),
    ):
        compacted = await rc.response_compact(harness, page_data(3), PageP, SummaryP, opts)
        assert compacted.output == rc.FallbackOutput(
            value=SummaryP(overview="3 rows", critical_facts=[])
        )
    plain = options(lambda _p: {"overview": "o", "critical_facts": ["f"]}, summarize_above_bytes=0)
    compacted = await rc.response_compact(harness, page_data(3), PageP, SummaryP, plain)
    assert compacted.output.value == SummaryP(overview="o", critical_facts=["f"])
    wrong = options(lambda _p: {"overview": "o"}, summarize_above_bytes=0)
    with pytest.raises(ValueError, match=r"fallback function.*\$\.critical_facts"):
        await rc.response_compact(harness, page_data(3), PageP, SummaryP, wrong)
    altered = SummaryP(overview="o", critical_facts=[])
    altered.overview = {"SECRET": 1}  # type: ignore[assignment] # not checked by pydantic
    with pytest.raises(ValueError, match=r"fallback function.*\$\.overview") as info:
        await rc.response_compact(
            harness,
            page_data(3),
            PageP,
            SummaryP,
            options(lambda _p: altered, summarize_above_bytes=0),
        )
    assert "SECRET" not in str(info.value)


async def test_a_field_assigned_a_wrong_type_is_refused_without_a_warning_quoting_it(
    harness: rc.Harness, recwarn: pytest.WarningsRecorder
) -> None:
    """pydantic does not check assignments: the read-back refuses the value, and no serializer
    warning (which quotes the value) is raised on the way."""
    page = PageP.model_validate(page_data(1))
    page.rows[0].name = 12345678  # type: ignore[assignment]
    page.rows[0].id = "SECRET-TOKEN"  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"\$\.rows\[0\]") as info:
        await rc.response_compact(harness, page, PageP, SummaryP, options())
    assert "SECRET" not in str(info.value)
    assert [str(w.message) for w in recwarn] == []
    assert entry_files(store_root(harness.fs)) == set()


async def test_dataclass_and_typeddict_schemas(harness: rc.Harness) -> None:
    """Dataclasses (exact) and TypedDicts (summary) work through msgspec, round trip included."""
    rows = [RowD(id=i, name=f"n{i}") for i in range(2000)]
    fallback: SummaryTD = {"overview": "retained", "critical_facts": []}
    compacted = await rc.response_compact(harness, rows, list[RowD], SummaryTD, options(fallback))
    assert compacted.output.value == fallback
    found = await rc.response_compaction_read_exact(
        harness, compacted.receipt.exact_ref, list[RowD]
    )
    assert isinstance(found, rc.Found)
    assert found.value == rows
    assert sorted(strict_json_schema(SummaryTD)["required"]) == ["critical_facts", "overview"]


async def test_missing_extra_is_a_clear_value_error(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without pydantic v2, a model schema raises ValueError naming the extra, not TypeError."""
    monkeypatch.setitem(sys.modules, "pydantic", None)
    with pytest.raises(ValueError, match=r"exact_schema .*response-compaction\[pydantic\]"):
        await rc.response_compact(
            harness,
            page_data(1),
            PageP,
            SummaryS,
            options(SummaryS(overview="", critical_facts=[])),
        )
    with pytest.raises(ValueError, match=r"summary_schema .*response-compaction\[pydantic\]"):
        await rc.response_compact(harness, page_data(1), PageS, SummaryP, options({}))


async def test_large_list_of_models_round_trips(harness: rc.Harness) -> None:
    """``list[Model]`` over the worker-verify size (8 MiB) is stored, verified and read back."""
    rows = [RowP.model_validate(row) for row in page_data(140_000)["rows"]]
    compacted = await rc.response_compact(harness, rows, list[RowP], SummaryP, options())
    assert compacted.receipt.exact_bytes > 8 << 20
    found = await rc.response_compaction_read_exact(
        harness, compacted.receipt.exact_ref, list[RowP]
    )
    assert isinstance(found, rc.Found)
    assert found.value == rows


async def test_agent_text_and_json_of_pydantic_outputs(harness: rc.Harness) -> None:
    """to_agent_text/to_agent_json encode pydantic outputs (by alias), exact and fallback."""
    rows = [RowP(id=i, name=f"row {i}", pageId="q") for i in range(3)]
    fallback = SummaryP(overview="not summarized", critical_facts=[])
    options = {"ladder": "cheap", "fallback": fallback}
    small = await rc.response_compact(harness, rows, list[RowP], SummaryP, options)
    assert small.output.kind == "exact"
    expected = [row.model_dump(by_alias=True) for row in rows]
    assert (
        small.to_agent_text().splitlines()[1]
        == "value: " + msgspec.json.encode(expected, order="sorted").decode()
    )
    assert small.to_agent_json()["value"] == expected
    big = await rc.response_compact(harness, rows * 2000, list[RowP], SummaryP, options)
    assert big.output.kind == "fallback"
    text = big.to_agent_text()
    assert text.splitlines()[1] == 'fallback: {"critical_facts":[],"overview":"not summarized"}'
    assert big.to_agent_json()["value"] == {"overview": "not summarized", "critical_facts": []}
