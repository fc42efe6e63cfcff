"""Summaries about the whole response: profile, coverage, fitting the route, grounding, failures.

The real openai client over real HTTP to the scripted server, on asyncio and trio. What the
model was shown is asserted on the requests the server received. Nothing sleeps: hung
requests wait on events. Budgets that cut hung calls are tested in ``test_budget`` on a loop
clock the test moves.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import msgspec
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import response_compaction as rc
from response_compaction._ladder import HEAD_WORDING
from response_compaction._prompt import prompt_bytes, system_prompt
from tests.fake_openai import FakeOpenAI, Reply, Status, fake_openai, summary_reply
from tests.schemas import FALLBACK, Summary

pytestmark = pytest.mark.anyio

GOOD: dict[str, Any] = {"overview": "Log search hits.", "critical_facts": ["mostly INFO"]}
LEVELS = ("INFO", "INFO", "INFO", "WARN", "ERROR")


class Hit(msgspec.Struct, frozen=True):
    id: int
    level: str
    msg: str
    latency_ms: float | None = None


class Search(msgspec.Struct, frozen=True):
    hits: list[Hit]
    took_ms: int


def search(n: int, *, rare_at: int | None = None, msg_len: int = 40) -> Search:
    """``n`` hits with known counts: level cycles through LEVELS, every 10th latency is null."""
    hits = [
        Hit(
            id=i,
            level="FATAL" if i == rare_at else LEVELS[i % len(LEVELS)],
            msg=f"event {i} " + "x" * msg_len,
            latency_ms=None if i % 10 == 0 else float(i % 1000) / 4,
        )
        for i in range(n)
    ]
    return Search(hits=hits, took_ms=17)


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with fake_openai() as fake:
        yield fake


@asynccontextmanager
async def harness_for(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, routes: list[str], **catalog: Any
) -> AsyncIterator[rc.Harness]:
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="test") as client:
        yield rc.Harness(fs=workspace, llm=rc.OpenAICatalog(client, {"main": routes}, **catalog))


async def compact(
    harness: rc.Harness, value: Search, **options: Any
) -> rc.Compacted[Search, Summary]:
    opts: dict[str, object] = {"fallback": FALLBACK, "ladder": "main", **options}
    return await rc.response_compact(harness, value, Search, Summary, opts)


def user_prompt(body: dict[str, Any]) -> str:
    return str(next(m["content"] for m in body["messages"] if m["role"] == "user"))


def record_lines(prompt: str) -> dict[int, Any]:
    """The ``[i] {json}`` record lines of a prompt, each parsed (so none was cut mid-value)."""
    return {
        int(m.group(1)): json.loads(m.group(2))
        for m in re.finditer(r"^\[(\d+)\] (\{.*\})$", prompt, re.MULTILINE)
    }


def attempts(receipt: rc.Receipt) -> list[rc.Attempt]:
    assert isinstance(receipt.attempts, tuple)
    return list(receipt.attempts)


# --------------------------------------------------------------------------- the profile


async def test_profile_counts_are_exact_and_reach_a_fallback_function(
    workspace: rc.LocalWorkspace,
) -> None:
    """The profile a fallback function receives counts every level, null and extreme exactly."""
    value = search(12_345)
    seen: list[rc.Profile] = []

    def fallback(profile: rc.Profile) -> Summary:
        seen.append(profile)
        level = next(f for f in profile.fields if f.path == "$.hits[*].level")
        assert isinstance(level.values, dict)
        return Summary(overview=f"{level.values['ERROR']} ERROR", critical_facts=[])

    harness = rc.Harness(fs=workspace, llm=None)
    compacted = await compact(harness, value, fallback=fallback)
    assert compacted.output.kind == "fallback"
    assert compacted.output.value == Summary(overview="2469 ERROR", critical_facts=[])
    assert compacted.receipt.fallback_reason == "no_llm"
    (profile,) = seen
    fields = {f.path: f for f in profile.fields}
    assert profile.complete is True
    assert profile.records == "$.hits"
    assert profile.record_count == 12_345
    assert {a.path: a.items for a in profile.arrays} == {"$.hits": 12_345}
    want = {lv: sum(1 for h in value.hits if h.level == lv) for lv in set(LEVELS)}
    assert fields["$.hits[*].level"].values == want
    latency = fields["$.hits[*].latency_ms"]
    assert latency.nulls == sum(1 for h in value.hits if h.latency_ms is None) == 1235
    assert latency.min == 0.25
    assert latency.max == 999 / 4
    assert fields["$.hits[*].id"].min == 0
    assert fields["$.hits[*].id"].max == 12_344
    assert fields["$.took_ms"].types == {"integer": 1}
    assert fields["$.hits[*].msg"].values is msgspec.UNSET  # high cardinality: not counted


async def test_rare_values_are_spotlighted_in_the_profile(workspace: rc.LocalWorkspace) -> None:
    """A level seen once in 5,000 records is listed as rare; common ones are not."""
    seen: list[rc.Profile] = []

    def fallback(profile: rc.Profile) -> Summary:
        seen.append(profile)
        return FALLBACK

    await compact(rc.Harness(fs=workspace, llm=None), search(5000, rare_at=4321), fallback=fallback)
    level = next(f for f in seen[0].fields if f.path == "$.hits[*].level")
    assert level.rare == ("FATAL",)


# --------------------------------------------------------------------------- coverage


async def test_sampled_prompt_has_profile_tail_and_rare_records_whole(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """Sampled coverage shows the profile first and whole records: head, tail and the rare one."""
    value = search(20_000, rare_at=13_579)
    server.script("m", summary_reply(GOOD))
    async with harness_for(workspace, server, ["m"]) as harness:
        compacted = await compact(harness, value)
    assert compacted.output.kind == "summarized"
    prompt = user_prompt(server.bodies("m")[0])
    assert prompt.index("PROFILE") < prompt.index("RECORDS")
    assert '"ERROR" 3999' in prompt  # an exact count, computed in code (one ERROR is FATAL)
    assert 'RARE: "FATAL"' in prompt
    lines = record_lines(prompt)
    assert {0, 19_999, 13_579} <= set(lines)
    for index, record in lines.items():
        assert record == msgspec.to_builtins(value.hits[index])
    assert len(lines) > 20  # evenly spaced records fill the rest
    spread = sorted(lines)
    assert max(b - a for a, b in itertools.pairwise(spread)) < 20_000 // 8
    receipt = compacted.receipt
    assert isinstance(receipt.covered_bytes, int)
    assert receipt.covered_bytes < receipt.exact_bytes
    assert len(prompt.encode()) < 8192 * 3.2  # fits the default 8K context


async def test_sampled_prompt_shows_the_records_holding_numeric_extremes(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A latency far above the rest, mid-array, is in the profile's max and shown whole."""
    value = search(20_000)
    outlier = msgspec.structs.replace(value.hits[12_345], latency_ms=98_765.0)
    value.hits[12_345] = outlier
    server.script("m", summary_reply(GOOD))
    async with harness_for(workspace, server, ["m"]) as harness:
        compacted = await compact(harness, value)
    assert compacted.output.kind == "summarized"
    prompt = user_prompt(server.bodies("m")[0])
    assert "98765" in prompt[: prompt.index("RECORDS (")]  # the profile's max
    lines = record_lines(prompt)
    assert lines[12_345] == msgspec.to_builtins(outlier)


async def test_full_coverage_puts_every_record_of_5mb_in_some_prompt(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """Full coverage maps every record of a 5 MB response, then reduces, within max_model_calls."""
    value = search(60_000, msg_len=40)
    server.script("m", summary_reply(GOOD))
    contexts = {"m": 1_000_000}
    async with harness_for(workspace, server, ["m"], context_tokens=contexts) as harness:
        compacted = await compact(
            harness,
            value,
            coverage="full",
            max_model_calls=8,
            timeout_ms=120_000,
            shown_bytes=1_500_000,
        )
    receipt = compacted.receipt
    assert receipt.exact_bytes > 5_000_000
    assert compacted.output.kind == "summarized"
    bodies = server.bodies("m")
    assert 2 <= len(bodies) <= 8
    seen: set[int] = set()
    for body in bodies[:-1]:
        lines = record_lines(user_prompt(body))
        for index, record in lines.items():
            assert record == msgspec.to_builtins(value.hits[index])
        seen |= set(lines)
    assert seen == set(range(60_000))
    reduce_prompt = user_prompt(bodies[-1])
    assert "PART SUMMARIES" in reduce_prompt
    assert "in no part summary" not in reduce_prompt
    calls = [a.call for a in attempts(receipt)]
    assert calls == ["map"] * (len(bodies) - 1) + ["reduce"]
    assert receipt.covered_bytes == receipt.exact_bytes


async def test_full_coverage_respects_max_model_calls_and_says_what_it_missed(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """When the records need more chunks than calls allow, the reduce names the uncovered runs."""
    value = search(3000)
    server.script("m", summary_reply(GOOD))
    async with harness_for(workspace, server, ["m"]) as harness:
        compacted = await compact(harness, value, coverage="full", max_model_calls=4)
    assert compacted.output.kind == "summarized"
    assert server.count("m") == 4
    assert "in no part summary" in user_prompt(server.bodies("m")[-1])
    covered = compacted.receipt.covered_bytes
    assert isinstance(covered, int)
    assert 0 < covered < compacted.receipt.exact_bytes
    # The largest single prompt's bytes of the value (it was the reduce's total, covered).
    maps = [len(user_prompt(body).encode()) for body in server.bodies("m")[:-1]]
    shown = compacted.receipt.shown_bytes
    assert isinstance(shown, int)
    assert 0 < shown <= max(maps) < covered


@pytest.mark.parametrize("under", [0, 60, 150, 400])
async def test_a_head_near_the_context_fit_leaves_room_for_its_wording(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, under: int
) -> None:
    """shown_bytes just under what the context fits: the head and its wording went ~190
    bytes past the fit. Now the prompt stays within it and shows shown_bytes when it can."""
    fit = prompt_bytes(
        context_tokens=4096, token_bound=1024, shown_bytes=1 << 30, system=system_prompt("")
    )
    shown = fit - under
    server.script("m", summary_reply(GOOD))
    async with harness_for(workspace, server, ["m"], context_tokens={"m": 4096}) as harness:
        compacted = await compact(harness, search(3000), coverage="head", shown_bytes=shown)
    assert len(user_prompt(server.bodies("m")[0]).encode()) <= fit
    covered = compacted.receipt.covered_bytes
    assert covered == (shown if under >= HEAD_WORDING else fit - HEAD_WORDING)


async def test_full_coverage_with_every_record_too_big_for_a_prompt_asks_one_sampled_prompt(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """No record fitted a map prompt: the fallback came back with 0 model calls."""
    server.script("m", summary_reply(GOOD))
    async with harness_for(workspace, server, ["m"], context_tokens={"m": 4096}) as harness:
        compacted = await compact(harness, search(40, msg_len=20_000), coverage="full")
    assert compacted.output.kind == "summarized"
    assert [(a.call, a.outcome) for a in attempts(compacted.receipt)] == [(msgspec.UNSET, "ok")]
    assert "$.hits" in user_prompt(server.bodies("m")[0])


async def test_a_map_call_that_overflows_is_retried_on_half_its_records(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A map overflow gets one retry on the first half; the reduce says what stayed uncovered."""
    overflow = Status(400, error={"type": "exceed_context_size_error"})
    server.script("m", summary_reply(GOOD), overflow, summary_reply(GOOD))
    async with harness_for(workspace, server, ["m"]) as harness:
        compacted = await compact(harness, search(2000), coverage="full", max_model_calls=16)
    assert compacted.output.kind == "summarized"
    calls = [(a.call, a.outcome) for a in attempts(compacted.receipt)]
    assert calls.count(("map", "error")) == 1
    assert calls.count(("retry", "ok")) == 1
    # The server answers in arrival order, so the second request to arrive overflowed.
    bodies = server.bodies("m")
    whole = record_lines(user_prompt(bodies[1]))
    retried = next(
        lines
        for lines in (record_lines(user_prompt(b)) for b in bodies[2:])
        if lines and set(lines) < set(whole)
    )
    assert sorted(retried) == sorted(whole)[: len(whole) // 2]
    assert "in no part summary" in user_prompt(bodies[-1])


# --------------------------------------------------------------------------- fitting the route

OVERFLOWS = [
    pytest.param(
        {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 4096},
        "HTTP 400 exceed_context_size_error",
        id="llama.cpp",
    ),
    pytest.param(
        {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"},
        "HTTP 400 invalid_request_error",
        id="openai",
    ),
    pytest.param(
        {
            "message": "This model's maximum context length is 4096 tokens.",
            "type": "BadRequestError",
        },
        "HTTP 400 BadRequestError",
        id="vllm",
    ),
]


@pytest.mark.parametrize(("error", "shown"), OVERFLOWS)
async def test_context_overflow_gets_one_smaller_retry_on_the_same_rung(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, error: dict[str, Any], shown: str
) -> None:
    """An overflow reply is retried once, smaller, on the same rung, as its own attempt."""
    server.script("m", Status(400, error=error), summary_reply(GOOD))
    async with harness_for(workspace, server, ["m", "spare"]) as harness:
        compacted = await compact(harness, search(5000))
    assert compacted.output.kind == "summarized"
    first, second = attempts(compacted.receipt)
    assert (first.route, first.outcome, first.error) == ("m", "error", shown)
    assert (second.route, second.outcome, second.call) == ("m", "ok", "retry")
    sizes = [len(user_prompt(b).encode()) for b in server.bodies("m")]
    assert sizes[1] < sizes[0] * 0.9
    assert server.count("spare") == 0


@pytest.mark.parametrize(("instructions", "retries"), [("", 1), ("x" * 25_000, 0)])
async def test_a_second_overflow_moves_down_the_ladder(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, instructions: str, retries: int
) -> None:
    """Only one smaller retry per rung: a second overflow goes to the next rung. Instructions
    that leave the smallest prompt get none (it would be the very request refused)."""
    overflow = Status(400, error={"type": "exceed_context_size_error"})
    server.script("m", overflow)
    server.script("big", summary_reply(GOOD))
    async with harness_for(workspace, server, ["m", "big"]) as harness:
        compacted = await compact(harness, search(5000), instructions=instructions)
    assert [(a.route, a.outcome) for a in attempts(compacted.receipt)] == [
        *[("m", "error")] * (1 + retries),
        ("big", "ok"),
    ]
    assert server.count("m") == 1 + retries


async def test_context_tokens_size_the_prompt_per_route(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A route with a bigger context gets a bigger prompt; the default fits an 8K model."""
    server.script("small", Status(500))
    server.script("large", summary_reply(GOOD))
    contexts = {"large": 32_000}
    async with harness_for(workspace, server, ["small", "large"], context_tokens=contexts) as h:
        await compact(h, search(20_000))
    small = len(user_prompt(server.bodies("small")[0]).encode())
    large = len(user_prompt(server.bodies("large")[0]).encode())
    assert small < (8192 - 1024) * 3.2
    assert large > 3 * small


# --------------------------------------------------------------------------- failures you can see


async def test_http_400_names_status_and_error_type_and_served_model_is_kept(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A failed rung says ``HTTP 400 <type>``; the answering rung says which model served it."""
    server.script("a", Status(400, message="secret words from the server"))
    server.script("b", Reply(content=json.dumps(GOOD), served="smollm2"))
    async with harness_for(workspace, server, ["a", "b"]) as harness:
        compacted = await compact(harness, search(3000))
    first, second = attempts(compacted.receipt)
    assert first.error == "HTTP 400 scripted"
    assert second.served_model == "smollm2"
    assert second.error is msgspec.UNSET
    assert b"secret" not in msgspec.json.encode(compacted.receipt)


async def test_error_codes_and_model_names_that_are_not_identifiers_are_left_out(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A server echoing prompt text into its error code or model name: the receipt has neither."""
    echoed = {"type": "Secret Token 4821 from the prompt", "code": "sk-LIVE 4821", "message": "x"}
    server.script("a", Status(400, error=echoed))
    server.script("b", Reply(content=json.dumps(GOOD), served="hits: 4821 secret {prompt}"))
    async with harness_for(workspace, server, ["a", "b"]) as harness:
        compacted = await compact(harness, search(3000))
    first, second = attempts(compacted.receipt)
    assert first.error == "HTTP 400"
    assert second.served_model is msgspec.UNSET
    assert b"4821" not in msgspec.json.encode(compacted.receipt)


async def test_error_codes_and_model_names_found_in_the_prompt_are_left_out(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """Identifier-like words of the response echoed back (``event``, ``hit-17``) are not shown.

    Only the receipt's shape was checked: a word of the response that looks like an error
    code or a model name reached the receipt, in any case.
    """
    # "xxxx" is no word of the prompt, only part of one ("x" * 40): still an echo of it.
    server.script("a", Status(400, error={"type": "acct_Event_not_found", "code": "xxxx_gone"}))
    server.script("b", Reply(content=json.dumps(GOOD), served="xxxxxxxxxx"))
    async with harness_for(workspace, server, ["a", "b"]) as harness:
        compacted = await compact(harness, search(3000))
    first, second = attempts(compacted.receipt)
    assert (first.error, second.served_model) == ("HTTP 400", msgspec.UNSET)
    overflow = {"type": "event", "code": "context_length_exceeded"}  # a code word: shown
    server.script("c", Status(400, error=overflow))
    server.script("d", Reply(content=json.dumps(GOOD), served="org/Model-8B"))
    async with harness_for(workspace, server, ["c", "d"]) as harness:
        compacted = await compact(harness, search(3000))
    third, fourth = attempts(compacted.receipt)[-2:]
    assert third.error == "HTTP 400 context_length_exceeded"
    assert fourth.served_model == "org/Model-8B"


async def test_rungs_and_fallbacks_are_logged_without_content(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """One DEBUG record per call and a WARNING when the ladder ends in the fallback."""
    server.script("a", Status(503))
    server.script("b", Reply(content="not json"))
    caplog.set_level(logging.DEBUG, logger="response_compaction")
    async with harness_for(workspace, server, ["a", "b"]) as harness:
        compacted = await compact(harness, search(3000))
    assert compacted.output.kind == "fallback"
    records = [r for r in caplog.records if r.name == "response_compaction"]
    assert [r.levelno for r in records] == [logging.DEBUG, logging.DEBUG, logging.WARNING]
    assert "HTTP 503" in records[0].getMessage()
    assert "invalid" in records[1].getMessage()
    for record in records:
        assert "event" not in record.getMessage()  # no response content


# --------------------------------------------------------------------------- real-model hygiene


async def test_temperature_zero_by_default_and_configurable(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """Every call sends temperature 0 unless the catalog says otherwise (None leaves it out)."""
    server.script("m", summary_reply(GOOD))
    async with harness_for(workspace, server, ["m"]) as harness:
        await compact(harness, search(3000))
    async with harness_for(workspace, server, ["m"], temperature=None) as harness:
        await compact(harness, search(3001))
    first, second = server.bodies("m")
    assert first["temperature"] == 0.0
    assert "temperature" not in second


class Strictish(msgspec.Struct, frozen=True):
    overview: Annotated[str, msgspec.Meta(pattern="^[A-Z]")]
    critical_facts: Annotated[list[str], msgspec.Meta(min_length=1)]
    errors: Annotated[int, msgspec.Meta(ge=0)] = 0


async def test_full_schema_dialect_sends_constraints_strict_does_not(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """``schema_dialect="full"`` sends pattern, minItems and minimum; "strict" leaves them out."""
    server.script("m", summary_reply({**GOOD, "errors": 3}))
    fallback = Strictish(overview="X", critical_facts=["y"])
    for dialect in ("strict", "full"):
        async with harness_for(workspace, server, ["m"], schema_dialect=dialect) as harness:
            opts = {"fallback": fallback, "ladder": "main"}
            await rc.response_compact(harness, search(3000), Search, Strictish, opts)
    strict, full = (b["response_format"]["json_schema"]["schema"] for b in server.bodies("m"))
    assert full["properties"]["overview"]["pattern"] == "^[A-Z]"
    assert full["properties"]["critical_facts"]["minItems"] == 1
    assert full["properties"]["errors"]["minimum"] == 0
    assert "pattern" not in json.dumps(strict)
    assert "minItems" not in json.dumps(strict)


async def test_cache_identity_includes_coverage_and_temperature(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """Changing coverage or the catalog's temperature asks the model again; the same is a hit."""
    server.script("m", summary_reply(GOOD))
    value = search(3000)
    async with harness_for(workspace, server, ["m"]) as harness:
        await compact(harness, value)
        assert (await compact(harness, value)).receipt.summary_cache == "hit"
        await compact(harness, value, coverage="head")
    async with harness_for(workspace, server, ["m"], temperature=0.5) as harness:
        await compact(harness, value)
    assert server.count("m") == 3


# --------------------------------------------------------------------------- grounding


async def test_ungrounded_summary_is_rejected_and_the_ladder_moves_on(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """An invented URL in a grounded field makes the rung ungrounded; a grounded one is taken."""
    invented: dict[str, Any] = {
        "overview": "x",
        "critical_facts": ["see https://example.invalid/errors"],
    }
    grounded: dict[str, Any] = {
        "overview": "x",
        "critical_facts": ['worst: "event 4321" (id 4321)'],
    }
    server.script("a", summary_reply(invented))
    server.script("b", summary_reply(grounded))
    async with harness_for(workspace, server, ["a", "b"]) as harness:
        compacted = await compact(harness, search(5000), grounded=("critical_facts",))
    assert compacted.output.kind == "summarized"
    assert compacted.output.value == Summary(**grounded)
    first, second = attempts(compacted.receipt)
    assert (first.route, first.outcome) == ("a", "ungrounded")
    assert (second.route, second.outcome) == ("b", "ok")


async def test_all_rungs_ungrounded_gives_the_fallback_with_reason_invalid(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """Grounding failures end in the fallback with a contract reason, and nothing is cached."""
    server.script("a", summary_reply({"overview": "x", "critical_facts": ["code ERR-777"]}))
    async with harness_for(workspace, server, ["a"]) as harness:
        compacted = await compact(harness, search(5000), grounded=("critical_facts",))
    assert compacted.output.kind == "fallback"
    assert compacted.receipt.fallback_reason == "invalid"
    assert compacted.receipt.summary_cache == "none"


async def test_full_coverage_with_every_map_call_refused_gives_the_reason_refused(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """No part arrived because every map call was refused: the fallback's reason says why."""
    server.script("a", Reply(content=None, refusal="no"))
    async with harness_for(workspace, server, ["a"]) as harness:
        compacted = await compact(harness, search(3000), coverage="full")
    assert compacted.output.kind == "fallback"
    assert {(a.call, a.outcome) for a in attempts(compacted.receipt)} == {("map", "refused")}
    assert compacted.receipt.fallback_reason == "refused"


async def test_grounding_accepts_counts_from_the_profile_and_ignores_ungrounded_fields(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """Plain numbers and prose pass; identifiers in fields not listed are not checked."""
    reply = {"overview": "ids like zz-999x were seen", "critical_facts": ["1000 ERROR, 3 levels"]}
    server.script("a", summary_reply(reply))
    async with harness_for(workspace, server, ["a"]) as harness:
        compacted = await compact(harness, search(5000), grounded=("critical_facts",))
    assert compacted.output.kind == "summarized"


def test_grounded_must_name_summary_fields() -> None:
    """A grounded name that is not a summary field is a ValueError naming the key."""
    from response_compaction._options import resolve_options

    with pytest.raises(ValueError, match="grounded"):
        resolve_options({"fallback": FALLBACK, "ladder": "m", "grounded": ["nope"]}, Summary)


async def test_fallback_function_gets_the_profile_after_a_failed_ladder(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A callable fallback runs once when the ladder fails, and what it returns is validated."""
    server.script("a", Status(500))
    calls: list[int] = []

    def fallback(profile: rc.Profile) -> Summary:
        calls.append(profile.record_count)
        return Summary(overview=f"{profile.record_count} hits", critical_facts=[])

    async with harness_for(workspace, server, ["a"]) as harness:
        compacted = await compact(harness, search(4000), fallback=fallback)
    assert compacted.output.value == Summary(overview="4000 hits", critical_facts=[])
    assert calls == [4000]
    assert compacted.receipt.fallback_reason == "error"

    async with harness_for(workspace, server, ["a"]) as harness:
        with pytest.raises(ValueError, match="fallback function"):
            await compact(harness, search(4001), fallback=lambda _p: {"wrong": 1})


# --------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("see https://example.com/a/b?x=1.", ["https://example.com/a/b?x=1"]),
        ('the "checkout service" failed', ["checkout service"]),
        ("code ERR-1042 and user u42", ["ERR-1042", "u42"]),
        ("order 48213377 shipped", ["48213377"]),
        ("at 2018-08-28 14:22:52.143", ["2018-08-28", "14:22:52.143"]),
        ("1392 ERROR records over 3 levels, 95th percentile 250ms, 5MB", []),
        ("p95 latency", ["p95"]),  # letters and digits: an identifier by the rule
        ("the user's session isn't 'stuck' now", ["stuck"]),
    ],
)
def test_identifiers_follow_the_documented_rule(text: str, found: list[str]) -> None:
    """URLs, quoted names, letter+digit codes and long digit runs; never counts or prose."""
    from response_compaction._grounding import identifiers

    assert list(identifiers(text)) == found


def test_an_identifier_after_an_escape_or_a_colour_code_is_found_whole() -> None:
    """Canonical JSON writes a newline as ``\\n``: ``ERR-1042`` after one stood after a letter
    and was not found (a log's lines were all ungrounded); a colour code ends in ``m``."""
    from response_compaction._grounding import ungrounded

    data = msgspec.json.encode({"log": "failed\nERR-1042 at\tacct_4821 \u001b[31mERR-7"})
    found = {"ids": ["ERR-1042", "acct_4821", "ERR-7"]}
    assert ungrounded(found, ["ids"], [memoryview(data)]) == 0
    parts = {"ids": ["ERR-104", "RR-1042", "acct_482", "cct_4821"]}
    assert ungrounded(parts, ["ids"], [data]) == 4


def test_profile_walk_is_bounded_and_says_so() -> None:
    """Past the path bound the profile is marked incomplete instead of growing without end."""
    from response_compaction._profile import MAX_PATHS, profile_value

    wide = [{f"k{i}": i} for i in range(MAX_PATHS + 10)]
    assert profile_value({"rows": wide[:10]}, 1).profile.complete is True
    assert profile_value({f"f{i}": {"x": 1} for i in range(60)}, 1).profile.complete is True
    profile = profile_value([{f"k{i}": i for i in range(MAP_KEYS_PLUS)} for _ in range(2)], 1)
    assert profile.profile.complete is True  # a map's keys share one path
    many = profile_value({f"f{i}": {f"g{j}": j for j in range(40)} for i in range(40)}, 1)
    assert many.profile.complete is False


MAP_KEYS_PLUS = 100


def test_sliced_decoding_equals_whole_decoding() -> None:
    """Decoding the writer's laid-out slices gives the same builtins as one whole decode."""
    from response_compaction._canonical import Span, iter_canonical
    from response_compaction._profile import decode_canonical

    value = search(20_000)
    layout: list[Span] = []
    data = b"".join(bytes(p) for p in iter_canonical(value, layout=layout))
    assert layout  # the hits array was laid out in slices
    assert decode_canonical(data, layout) == msgspec.json.decode(data)


_RECORD = st.fixed_dictionaries(
    {"id": st.integers(0, 10**9), "tag": st.sampled_from(["a", "b", "é", "x" * 50])}
)


@given(
    records=st.lists(_RECORD, min_size=2, max_size=300),
    budget=st.integers(4096, 20_000),  # real prompts are >= 13 KB; 4 KB still holds two records
)
@settings(max_examples=60, deadline=None)
def test_sampled_view_shows_whole_records_within_its_budget(
    records: list[dict[str, Any]], budget: int
) -> None:
    """For any records and budget: lines parse as the records, the tail is shown, bytes fit."""
    from response_compaction._canonical import canonical_bytes as encode
    from response_compaction._profile import decode_canonical, profile_value
    from response_compaction._views import sampled_view

    data = encode({"rows": records, "n": len(records)})
    pv = profile_value(decode_canonical(data), len(data))
    view = sampled_view(pv, data, budget)
    assert len(view.text.encode()) <= budget
    assert 0 < view.covered <= len(data)
    lines = record_lines(view.text)
    if view.covered == len(data):
        return  # shown whole
    assert len(records) - 1 in lines
    for index, record in lines.items():
        assert record == records[index]


@pytest.mark.parametrize("coverage", ["sampled", "full"])
async def test_a_long_key_above_the_records_does_not_grow_the_prompt(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, coverage: str
) -> None:
    """The records' path is named in the wording of every prompt; a 100 KB key is cut there.

    It was not: prompts of 300 KB went out on a 4 KB ``shown_bytes`` (adversarial review).
    """
    server.script("m", summary_reply(GOOD))
    rows = [{"id": i, "v": "x"} for i in range(2_000)]
    opts = {"fallback": FALLBACK, "ladder": "main", "coverage": coverage, "shown_bytes": 4096}
    async with harness_for(workspace, server, ["m"]) as h:
        out = await rc.response_compact(h, {"K" * 100_000: rows}, Any, Summary, opts)
    assert out.output.kind == "summarized"
    sizes = [len(user_prompt(body).encode()) for body in server.bodies("m")]
    assert max(sizes) <= 4096
