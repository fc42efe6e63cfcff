"""The summary step end to end: the real openai client over real HTTP to a scripted server.

Every test runs on asyncio and on trio. Each one creates its ``AsyncOpenAI`` inside the test
and closes it with ``async with`` (a client cannot move between event loops, and an unclosed
one leaks sockets under trio). Nothing here sleeps to order events: a held or hung request
waits on an event, and the test waits for the server to say a request has arrived.
"""

from __future__ import annotations

import gc
import json
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
import msgspec
import openai
import pytest
from msgspec import UNSET

import response_compaction as rc
from response_compaction._canonical import canonical_bytes
from response_compaction._prompt import Head as _Head
from response_compaction._schema import strict_json_schema
from response_compaction._store import Store
from tests.fake_openai import (
    ABSENT,
    USAGE,
    Body,
    FakeOpenAI,
    Hang,
    Held,
    Reply,
    Status,
    Usage,
    fake_openai,
    summary_reply,
)
from tests.schemas import FALLBACK, Exact, Row, Summary, big_exact

pytestmark = pytest.mark.anyio

GOOD: dict[str, Any] = {"overview": "A thousand rows.", "critical_facts": ["ids run 0..999"]}
BIG = big_exact(1000)  # about 67 KB of canonical JSON: over the default 32000 threshold


class Brief(msgspec.Struct, frozen=True):
    """A second summary schema: same fields as Summary plus one, so GOOD validates."""

    overview: str
    critical_facts: list[str]
    caveat: str = ""


class Rows(msgspec.Struct, frozen=True):
    first_id: int


class Nested(msgspec.Struct, frozen=True):
    rows: Rows


class Node(msgspec.Struct, frozen=True):
    children: list[Node]


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with fake_openai() as fake:
        yield fake


@asynccontextmanager
async def model_harness(
    workspace: rc.LocalWorkspace,
    server: FakeOpenAI,
    ladders: dict[str, list[str]],
    **client_options: Any,
) -> AsyncIterator[rc.Harness]:
    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key="test", **client_options
    ) as client:
        yield rc.Harness(fs=workspace, llm=rc.OpenAICatalog(client, ladders))


def opts(ladder: str = "main", **options: Any) -> dict[str, Any]:
    return {"fallback": FALLBACK, "ladder": ladder, **options}


async def compact(
    harness: rc.Harness, value: Any = BIG, schema: Any = Summary, **options: Any
) -> rc.Compacted[Any, Any]:
    return await rc.response_compact(harness, value, Exact, schema, opts(**options))


def outcomes(receipt: rc.Receipt) -> list[tuple[str, str]]:
    assert isinstance(receipt.attempts, tuple)
    return [(a.route, a.outcome) for a in receipt.attempts]


def summary_files(workspace: rc.LocalWorkspace) -> list[Path]:
    return sorted(Path(workspace.path).glob("*/summary/*/*"))


def entry_files(workspace: rc.LocalWorkspace) -> list[Path]:
    return sorted(Path(workspace.path).glob("*/exact/*/*")) + summary_files(workspace)


def user_prompt(body: dict[str, Any]) -> str:
    return str(next(m["content"] for m in body["messages"] if m["role"] == "user"))


def system_prompt(body: dict[str, Any]) -> str:
    return str(next(m["content"] for m in body["messages"] if m["role"] == "system"))


class ExactPuts:
    """Counts finished exact puts: a caller past its put has entered the summary step."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, want: int) -> None:
        self.count = 0
        self.reached = anyio.Event()
        original = Store.put

        async def put(store: Store, kind: Any, *args: Any, **kwargs: Any) -> Any:
            stored = await original(store, kind, *args, **kwargs)
            if kind == "exact":
                self.count += 1
                if self.count >= want:
                    self.reached.set()
            return stored

        monkeypatch.setattr(Store, "put", put)


# --------------------------------------------------------------------------- happy path


async def test_valid_summary_is_returned_stored_and_reported(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A valid reply on the first rung comes back summarized with a complete receipt."""
    server.script("small", summary_reply(GOOD))
    async with model_harness(workspace, server, {"main": ["small"]}) as harness:
        compacted = await compact(harness)
    assert compacted.output.kind == "summarized"
    assert compacted.output.value == Summary(**GOOD)
    receipt = compacted.receipt
    summary_bytes = canonical_bytes(Summary(**GOOD))
    assert receipt.summary_cache == "stored"
    assert receipt.ladder == "main"
    assert receipt.route == "small"
    assert outcomes(receipt) == [("small", "ok")]
    assert receipt.summary_bytes == len(summary_bytes)
    assert isinstance(receipt.summary_digest, str)
    assert receipt.summary_digest.startswith("sha256:")
    assert len(receipt.summary_digest) == len("sha256:") + 64
    # 67 KB does not fit the default 8K context: a sample of it was shown, and said so.
    assert isinstance(receipt.covered_bytes, int)
    assert isinstance(receipt.shown_bytes, int)
    assert 0 < receipt.covered_bytes == receipt.shown_bytes < receipt.exact_bytes
    assert (receipt.input_tokens, receipt.output_tokens) == (11, 7)
    assert receipt.fallback_reason is UNSET
    assert len(summary_files(workspace)) == 1
    read = await rc.response_compaction_read_exact(harness, receipt.exact_ref, Exact)
    assert read == rc.Found(value=BIG)


async def test_request_is_strict_structured_output_bounded_by_token_bound(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """The server sees a strict json_schema format, the token bound and the instructions."""
    server.script("small", summary_reply(GOOD))
    async with model_harness(workspace, server, {"main": ["small"]}) as harness:
        await compact(harness, instructions="Name the highest id.", token_bound=321)
    (body,) = server.bodies("small")
    assert body["model"] == "small"
    assert body["max_completion_tokens"] == 321
    assert "max_tokens" not in body
    response_format = body["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["strict"] is True
    assert response_format["json_schema"]["name"] == "Summary"
    schema = response_format["json_schema"]["schema"]
    assert schema == strict_json_schema(Summary)
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert sorted(schema["required"]) == ["critical_facts", "overview"]
    assert "Name the highest id." in system_prompt(body)
    assert '"name":"nnnnnnnnnnnnnnnnnnnn"' in user_prompt(body)  # the document itself


# --------------------------------------------------------------------------- the ladder


async def test_ladder_falls_through_in_order_with_exact_attempts(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """500, 429 and a refusal each move to the next rung, and every rung is in the receipt."""
    server.script("e500", Status(500))
    server.script("e429", Status(429))
    server.script("refuses", Reply(content=None, refusal="I cannot help with that."))
    server.script("good", summary_reply(GOOD, usage={"prompt_tokens": 5, "completion_tokens": 3}))
    server.script("unused", summary_reply(GOOD))
    ladder = ["e500", "e429", "refuses", "good", "unused"]
    async with model_harness(workspace, server, {"main": ladder}) as harness:
        compacted = await compact(harness)
    assert compacted.output.kind == "summarized"
    receipt = compacted.receipt
    assert outcomes(receipt) == [
        ("e500", "error"),
        ("e429", "error"),
        ("refuses", "refused"),
        ("good", "ok"),
    ]
    assert receipt.route == "good"
    assert [server.count(m) for m in ladder] == [1, 1, 1, 1, 0]
    assert isinstance(receipt.attempts, tuple)
    assert (receipt.attempts[2].input_tokens, receipt.attempts[2].output_tokens) == (11, 7)
    assert (receipt.attempts[3].input_tokens, receipt.attempts[3].output_tokens) == (5, 3)
    assert receipt.attempts[0].input_tokens is UNSET  # an HTTP error reports no usage
    # A total over rungs one of which was not measured is not a measurement.
    assert receipt.input_tokens is UNSET
    assert receipt.output_tokens is UNSET
    assert all(a.elapsed_ms >= 0 for a in receipt.attempts)


@pytest.mark.parametrize(
    ("behaviour", "outcome"),
    [
        pytest.param(Reply(content="this is not JSON"), "invalid", id="non-json"),
        pytest.param(summary_reply({"overview": 5}), "invalid", id="schema-invalid"),
        pytest.param(
            summary_reply({"overview": "x", "critical_facts": []}, finish_reason="length"),
            "truncated",
            id="length",
        ),
        pytest.param(Reply(content=None, refusal="No."), "refused", id="refusal"),
        pytest.param(Status(500), "error", id="500"),
        pytest.param(Status(429), "error", id="429"),
        pytest.param(Status(400), "error", id="400"),
        pytest.param(Body(b"<html>not a completion</html>", "text/html"), "error", id="garbage"),
        pytest.param(Reply(content=None), "error", id="no-content"),
    ],
)
async def test_every_failed_rung_ends_in_the_fallback_and_is_never_cached(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, behaviour: Any, outcome: str
) -> None:
    """A failing only rung gives the caller's fallback with its reason, and nothing is cached."""
    server.script("bad", behaviour)
    async with model_harness(workspace, server, {"main": ["bad"]}) as harness:
        first = await compact(harness)
        assert summary_files(workspace) == []
        second = await compact(harness)
    for compacted in (first, second):
        assert compacted.output.kind == "fallback"
        assert compacted.output.value == FALLBACK
        assert compacted.receipt.fallback_reason == outcome
        assert compacted.receipt.summary_cache == "none"
        assert compacted.receipt.route is UNSET
        assert compacted.receipt.summary_digest is UNSET
        assert outcomes(compacted.receipt) == [("bad", outcome)]
    assert server.count("bad") == 2  # the second call asked the model again
    assert summary_files(workspace) == []


async def test_a_reply_far_longer_than_its_tokens_is_not_read_whole(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """The client read a whole body before it returned (a server streaming one without end
    held 1.1 GB in 3 s), and a 3 MB "summary" was taken as one. Bodies are read up to 1 MiB
    and 64 bytes a token of output asked for."""
    server.script("long", summary_reply({"overview": "A" * 3_000_000, "critical_facts": []}))
    server.script("good", summary_reply(GOOD))
    async with model_harness(workspace, server, {"main": ["long", "good"]}) as harness:
        compacted = await compact(harness)
    assert outcomes(compacted.receipt) == [("long", "error"), ("good", "ok")]
    assert isinstance(compacted.receipt.attempts, tuple)
    error = compacted.receipt.attempts[0].error
    assert isinstance(error, str)
    assert error.startswith("reply over ")


async def test_a_completion_the_client_read_is_still_read(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """Bodies are read as the client reads them (``json.loads``): a BOM before the JSON sent
    every summary to the fallback when msgspec decoded them."""
    completion = {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": json.dumps(GOOD)},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    server.script("bom", Body(b"\xef\xbb\xbf" + json.dumps(completion).encode()))
    async with model_harness(workspace, server, {"main": ["bom"]}) as harness:
        compacted = await compact(harness)
    assert outcomes(compacted.receipt) == [("bom", "ok")]
    assert compacted.output == rc.SummarizedOutput(value=Summary(**GOOD))


async def test_fallback_reason_is_the_last_rung_outcome(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """When every rung fails the reason is the last rung's, and all rungs are listed."""
    server.script("invalid", Reply(content="{"))
    server.script("refuses", Reply(content=None, refusal="No."))
    server.script("cut", Reply(content='{"overview": "th', finish_reason="length"))
    async with model_harness(workspace, server, {"main": ["invalid", "refuses", "cut"]}) as h:
        compacted = await compact(h)
    assert compacted.output == rc.FallbackOutput(value=FALLBACK)
    assert compacted.receipt.fallback_reason == "truncated"
    assert outcomes(compacted.receipt) == [
        ("invalid", "invalid"),
        ("refuses", "refused"),
        ("cut", "truncated"),
    ]


class Counted(msgspec.Struct, frozen=True):
    overview: str
    count: Annotated[int, msgspec.Meta(ge=0)]


async def test_reply_fitting_the_sent_schema_but_not_the_type_is_invalid(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """msgspec decoding is the gate: a bound dropped from the sent schema still rejects a reply."""
    server.script("negative", summary_reply({"overview": "o", "count": -1}))
    server.script("good", summary_reply({"overview": "o", "count": 3}))
    fallback = Counted(overview="fallback", count=0)
    async with model_harness(workspace, server, {"main": ["negative", "good"]}) as harness:
        compacted = await compact(harness, schema=Counted, fallback=fallback)
    (body,) = server.bodies("negative")
    assert body["response_format"]["json_schema"]["schema"]["properties"]["count"] == {
        "type": "integer"
    }
    assert outcomes(compacted.receipt) == [("negative", "invalid"), ("good", "ok")]
    assert compacted.output == rc.SummarizedOutput(value=Counted(overview="o", count=3))


async def test_no_llm_gives_the_fallback_without_any_request(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """With harness.llm None an over-threshold response gets the fallback with reason no_llm."""
    harness = rc.Harness(fs=workspace, llm=None)
    compacted = await compact(harness)
    assert compacted.output == rc.FallbackOutput(value=FALLBACK)
    assert compacted.receipt.fallback_reason == "no_llm"
    assert compacted.receipt.summary_cache == "none"
    assert compacted.receipt.attempts is UNSET
    assert server.count() == 0
    read = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
    assert read == rc.Found(value=BIG)


@pytest.mark.parametrize("status", [500, 429, 503])
async def test_sdk_retries_are_off_for_every_rung(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, status: int
) -> None:
    """A retryable status is requested exactly once even from a client set to retry 5 times."""
    server.script("flaky", Status(status))
    server.script("good", summary_reply(GOOD))
    async with model_harness(
        workspace, server, {"main": ["flaky", "good"]}, max_retries=5
    ) as harness:
        compacted = await compact(harness)
    assert compacted.output.kind == "summarized"
    assert server.count("flaky") == 1
    assert outcomes(compacted.receipt) == [("flaky", "error"), ("good", "ok")]


# --------------------------------------------------------------------------- the cache


async def test_another_server_with_the_same_route_names_is_asked_again(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A route's name says little (a llama-server answers any name with its model): the
    second server's summary was the first's, from the cache, without a request."""
    server.script("small", summary_reply(GOOD))
    async with model_harness(workspace, server, {"main": ["small"]}) as harness:
        first = await compact(harness)
    with fake_openai() as other:
        other.script("small", summary_reply({**GOOD, "overview": "the other server's"}))
        async with model_harness(workspace, other, {"main": ["small"]}) as harness:
            second = await compact(harness)
        assert other.count() == 1
    assert (first.receipt.summary_cache, second.receipt.summary_cache) == ("stored", "stored")
    assert isinstance(second.output, rc.SummarizedOutput)
    assert second.output.value.overview == "the other server's"


async def test_cache_hit_makes_no_request(workspace: rc.LocalWorkspace, server: FakeOpenAI) -> None:
    """The same response and identity a second time is a hit: no request, same summary."""
    server.script("small", summary_reply(GOOD))
    async with model_harness(workspace, server, {"main": ["small"]}) as harness:
        first = await compact(harness)
        second = await compact(harness)
    assert server.count() == 1
    assert second.output == rc.SummarizedOutput(value=Summary(**GOOD))
    assert first.receipt.summary_cache == "stored"
    assert second.receipt.summary_cache == "hit"
    assert second.receipt.exact_cache == "reused"
    assert second.receipt.summary_digest == first.receipt.summary_digest
    assert second.receipt.summary_bytes == first.receipt.summary_bytes
    assert second.receipt.attempts is UNSET  # no rung was tried
    assert second.receipt.input_tokens is UNSET  # and nothing was spent on this call


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"instructions": "Focus on ids."}, id="instructions"),
        pytest.param({"schema": Brief, "fallback": Brief("x", [])}, id="summary-schema"),
        pytest.param({"ladder": "alias"}, id="ladder"),
        pytest.param({"token_bound": 2048}, id="token-bound"),
        pytest.param({"shown_bytes": 4096}, id="shown-bytes"),
    ],
)
async def test_cache_identity_changes_with_what_the_model_is_asked(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, change: dict[str, Any]
) -> None:
    """Changing instructions, schema, ladder, token bound or shown bytes asks the model again."""
    server.script("small", summary_reply(GOOD))
    ladders = {"main": ["small"], "alias": ["small"]}
    async with model_harness(workspace, server, ladders) as harness:
        first = await compact(harness)
        same = await compact(harness)
        changed = await compact(harness, **change)
        again = await compact(harness, **change)
    assert [r.receipt.summary_cache for r in (first, same, changed, again)] == [
        "stored",
        "hit",
        "stored",
        "hit",
    ]
    assert server.count("small") == 2
    assert changed.output.kind == "summarized"
    assert len(summary_files(workspace)) == 2


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[:-1] + bytes([data[-1] ^ 1]), id="flipped-byte"),
        pytest.param(lambda data: data[:-3], id="truncated"),
        pytest.param(lambda data: b"", id="emptied"),
        pytest.param(lambda data: data.replace(b"rows.", b"ROWS."), id="same-size-forgery"),
    ],
)
async def test_damaged_cached_summary_is_a_miss_and_is_replaced(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, damage: Any
) -> None:
    """A cached summary whose bytes changed is re-summarized and replaced, never returned."""
    server.script("small", summary_reply(GOOD))
    async with model_harness(workspace, server, {"main": ["small"]}) as harness:
        await compact(harness)
        (path,) = summary_files(workspace)
        original = path.read_bytes()
        path.write_bytes(damage(original))
        repaired = await compact(harness)
        after = await compact(harness)
    assert repaired.output == rc.SummarizedOutput(value=Summary(**GOOD))
    assert repaired.receipt.summary_cache == "stored"
    assert server.count("small") == 2
    assert path.read_bytes() == original
    assert after.receipt.summary_cache == "hit"


# --------------------------------------------------------------------------- the budget


async def test_a_hung_leader_does_not_stretch_a_followers_budget(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A caller sharing another caller's model call still gets its fallback within its budget."""
    server.script("hung", Hang())
    async with (
        model_harness(workspace, server, {"main": ["hung"]}) as harness,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: compact(harness, timeout_ms=600_000))
        await server.wait_arrived("hung")
        with anyio.fail_after(10):  # a follower that waits for the leader would hang here
            follower = await compact(harness, timeout_ms=300)
        tg.cancel_scope.cancel()
    assert follower.output == rc.FallbackOutput(value=FALLBACK)
    assert follower.receipt.fallback_reason == "timeout"
    assert server.count("hung") == 1


async def test_caller_cancellation_propagates_and_caches_nothing(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """Cancelling the caller mid-request cancels the call; it is not turned into a fallback."""
    server.script("model", Hang(), summary_reply(GOOD))
    results: list[rc.Compacted[Any, Any]] = []
    async with model_harness(workspace, server, {"main": ["model"]}) as harness:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_on_arrival() -> None:
                    await server.wait_arrived("model")
                    scope.cancel()

                tg.start_soon(cancel_on_arrival)
                results.append(await compact(harness, timeout_ms=600_000))
        assert scope.cancelled_caught
        assert results == []
        assert summary_files(workspace) == []
        # The exact value was retained before the model was asked, and the client still works.
        later = await compact(harness)
    assert later.output == rc.SummarizedOutput(value=Summary(**GOOD))
    assert later.receipt.summary_cache == "stored"
    assert server.count("model") == 2


# --------------------------------------------------------------------------- single flight


async def test_concurrent_identical_compactions_share_one_request(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight concurrent callers with one response and identity cause exactly one request."""
    server.script("small", Held(summary_reply(GOOD)))
    puts = ExactPuts(monkeypatch, want=8)
    results: list[rc.Compacted[Any, Any]] = []

    async def one(harness: rc.Harness) -> None:
        results.append(await compact(harness))

    async with (
        model_harness(workspace, server, {"main": ["small"]}) as harness,
        anyio.create_task_group() as tg,
    ):
        for _ in range(8):
            tg.start_soon(one, harness)
        # Hold the one reply until every caller is past its exact put, so all eight are in
        # the summary step while the request is in flight.
        await server.wait_arrived("small")
        await puts.reached.wait()
        server.release()
    assert server.count() == 1
    assert len(results) == 8
    assert all(r.output == rc.SummarizedOutput(value=Summary(**GOOD)) for r in results)
    assert sorted(r.receipt.summary_cache for r in results) == ["hit"] * 7 + ["stored"]


async def test_a_follower_that_misses_the_cache_as_the_leader_finishes_does_not_ask_again(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow cache read racing the leader's finish still shares the leader's one request."""
    server.script("small", Held(summary_reply(GOOD)))
    leader_done = anyio.Event()
    results: dict[str, rc.Compacted[Any, Any]] = {}

    async with model_harness(workspace, server, {"main": ["small"]}) as harness:

        async def leader() -> None:
            results["leader"] = await compact(harness)
            leader_done.set()

        async def follower() -> None:
            results["follower"] = await compact(harness)

        async with anyio.create_task_group() as tg:
            tg.start_soon(leader)
            await server.wait_arrived("small")
            # From now on a summary cache read that misses reports its miss only after the
            # leader has finished: the slowest a read can be, and the window a second
            # request would slip through.
            original_get = Store.get

            async def slow_get(store: Store, kind: Any, key: str, schema: Any) -> Any:
                found = await original_get(store, kind, key, schema)
                if kind == "summary" and isinstance(found, rc.Missing):
                    await leader_done.wait()
                return found

            monkeypatch.setattr(Store, "get", slow_get)
            puts = ExactPuts(monkeypatch, want=1)
            tg.start_soon(follower)
            await puts.reached.wait()
            server.release()
    assert server.count() == 1
    assert results["follower"].output == rc.SummarizedOutput(value=Summary(**GOOD))
    assert results["follower"].receipt.summary_cache == "hit"


async def test_followers_of_a_cancelled_leader_ask_for_themselves(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the caller sharing its call is cancelled, a waiting caller runs the ladder itself."""
    server.script("model", Hang(), summary_reply(GOOD))
    results: list[rc.Compacted[Any, Any]] = []

    async with model_harness(workspace, server, {"main": ["model"]}) as harness:

        async def follower() -> None:
            results.append(await compact(harness))

        leader_scope = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _in_scope(leader_scope, compact(harness)))
            await server.wait_arrived("model")
            puts = ExactPuts(monkeypatch, want=1)
            tg.start_soon(follower)
            await puts.reached.wait()
            leader_scope.cancel()
    assert len(results) == 1
    assert results[0].output == rc.SummarizedOutput(value=Summary(**GOOD))
    assert results[0].receipt.summary_cache == "stored"
    assert server.count("model") == 2


async def _in_scope(scope: anyio.CancelScope, work: Any) -> None:
    with scope:
        await work


# --------------------------------------------------------------------------- usage honesty


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        pytest.param(USAGE, (11, 7), id="present"),
        pytest.param(
            {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, (0, 0), id="zero"
        ),
        pytest.param(ABSENT, (UNSET, UNSET), id="absent"),
        pytest.param(None, (UNSET, UNSET), id="null"),
        pytest.param({"prompt_tokens": 11}, (11, UNSET), id="partial"),
        pytest.param(
            {"prompt_tokens": "11", "completion_tokens": "7"}, (UNSET, UNSET), id="strings"
        ),
        pytest.param(
            {"prompt_tokens": 11.0, "completion_tokens": 7.5}, (UNSET, UNSET), id="floats"
        ),
        pytest.param(
            {"prompt_tokens": True, "completion_tokens": False}, (UNSET, UNSET), id="bools"
        ),
        pytest.param({"prompt_tokens": -1, "completion_tokens": -7}, (UNSET, UNSET), id="negative"),
    ],
)
async def test_token_counts_are_measurements_or_absent_never_invented(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, usage: Usage, expected: tuple[Any, Any]
) -> None:
    """A reported 0 is kept; missing, partial or wrongly typed counts are UNSET, never 0."""
    server.script("small", summary_reply(GOOD, usage=usage))
    async with model_harness(workspace, server, {"main": ["small"]}) as harness:
        compacted = await compact(harness)
    receipt = compacted.receipt
    assert compacted.output.kind == "summarized"
    assert (receipt.input_tokens, receipt.output_tokens) == expected
    assert isinstance(receipt.attempts, tuple)
    (attempt,) = receipt.attempts
    assert (attempt.input_tokens, attempt.output_tokens) == expected
    encoded = msgspec.json.decode(msgspec.json.encode(receipt))
    for name, value in zip(("input_tokens", "output_tokens"), expected, strict=True):
        if value is UNSET:
            assert name not in encoded
            assert name not in encoded["attempts"][0]
        else:
            assert encoded[name] == value
            assert type(encoded[name]) is int


# --------------------------------------------------------------------------- receipts


async def test_receipts_carry_no_response_or_summary_content(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, tmp_path: Path
) -> None:
    """Markers in the rows, the instructions and the summary never reach the encoded receipt."""
    value = Exact(
        rows=[Row(id=i, name=f"ROWMARKER-{i}-" + "x" * 40, tags=["TAGMARKER"]) for i in range(800)],
        total=800,
    )
    summary = {"overview": "SUMMARYMARKER overview", "critical_facts": ["FACTMARKER"]}
    server.script("e500", Status(500, message="ERRORMARKER"))
    server.script("small", summary_reply(summary))
    server.script("refuses", Reply(content=None, refusal="REFUSALMARKER"))
    ladders = {"main": ["e500", "small"], "bad": ["refuses"]}
    async with model_harness(workspace, server, ladders) as harness:
        stored = await compact(harness, value, instructions="INSTRUCTIONMARKER")
        hit = await compact(harness, value, instructions="INSTRUCTIONMARKER")
        fallback = await compact(harness, value, ladder="bad", instructions="INSTRUCTIONMARKER")
    assert stored.output.value.overview == "SUMMARYMARKER overview"
    (body,) = server.bodies("small")
    assert "ROWMARKER-0-" in user_prompt(body)  # the markers did go to the model
    assert "INSTRUCTIONMARKER" in system_prompt(body)
    for compacted in (stored, hit, fallback):
        encoded = msgspec.json.encode(compacted.receipt)
        for marker in (b"ROW", b"TAG", b"SUMMARY", b"FACT", b"INSTRUCTION", b"ERROR", b"REFUSAL"):
            assert marker + b"MARKER" not in encoded
        assert str(tmp_path).encode() not in encoded
        assert workspace.path.encode() not in encoded
        assert b"/" not in encoded.replace(b"sha256:", b"")


# --------------------------------------------------------------------------- refusals up front


@pytest.mark.parametrize(
    ("schema", "fallback"),
    [
        pytest.param(dict[str, int], {"a": 1}, id="dict"),
        pytest.param(Any, {"a": 1}, id="any"),
        pytest.param(Node, Node(children=[]), id="recursive"),
        pytest.param(str, "fallback", id="string-root"),
        pytest.param(list[Summary], [], id="array-root"),
    ],
)
async def test_inexpressible_summary_schema_fails_before_any_request_or_write(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, schema: Any, fallback: Any
) -> None:
    """A summary schema strict mode cannot express raises SchemaError before any work."""
    server.script("small", summary_reply(GOOD))
    async with model_harness(workspace, server, {"main": ["small"]}) as harness:
        with pytest.raises(rc.SchemaError) as raised:
            await rc.response_compact(
                harness, BIG, Exact, schema, {"fallback": fallback, "ladder": "main"}
            )
    assert isinstance(raised.value, ValueError)
    assert server.count() == 0
    assert entry_files(workspace) == []


async def test_unknown_ladder_fails_before_any_request_or_write(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """An unknown ladder raises LookupError naming it before anything is stored or asked."""
    server.script("small", summary_reply(GOOD))
    async with model_harness(workspace, server, {"main": ["small"]}) as harness:
        with pytest.raises(LookupError, match="nosuch"):
            await compact(harness, ladder="nosuch")
    assert server.count() == 0
    assert entry_files(workspace) == []


async def test_catalog_refuses_malformed_ladders(server: FakeOpenAI) -> None:
    """Empty ladders, non-string routes and non-openai clients are refused on construction."""
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="test") as client:
        with pytest.raises(ValueError, match="empty"):
            rc.OpenAICatalog(client, {"main": []})
        with pytest.raises(ValueError, match="main"):
            rc.OpenAICatalog(client, {"main": "gpt"})
        with pytest.raises(ValueError, match="route"):
            rc.OpenAICatalog(client, {"main": ["gpt", ""]})
        with pytest.raises(TypeError, match="ladders must be a mapping"):
            rc.OpenAICatalog(client, [("main", ["gpt"])])  # type: ignore[arg-type]
        catalog = rc.OpenAICatalog(client, {"main": ["a", "b"]})
        assert catalog.routes("main") == ("a", "b")
        with pytest.raises(LookupError, match="other"):
            catalog.routes("other")
    with pytest.raises(TypeError):
        rc.OpenAICatalog(object(), {"main": ["a"]})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the prompt bound


async def test_large_response_prompt_is_cut_and_marked(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A few hundred KB with shown_bytes=2048 sends the first 2048 bytes and a cut marker."""
    value = big_exact(5000)
    server.script("small", summary_reply(GOOD))
    async with model_harness(workspace, server, {"main": ["small"]}) as harness:
        compacted = await compact(harness, value, shown_bytes=2048, coverage="head")
    receipt = compacted.receipt
    assert receipt.exact_bytes > 300_000
    assert receipt.shown_bytes == 2048
    prompt = user_prompt(server.bodies("small")[0])
    marker = f"\n[truncated: showing the first 2048 of {receipt.exact_bytes} bytes]"
    assert prompt.endswith(marker)
    shown = prompt.removesuffix(marker).split("\n\n", 1)[1]
    assert shown.encode() == canonical_bytes(value)[:2048]
    assert len(prompt.encode()) < 4096


async def test_prompt_cut_never_splits_a_character_and_says_what_it_shows(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A cut inside a multi-byte character backs off to whole characters, counted honestly."""
    for pad in range(3):  # one of these puts a two-byte character across byte 1024
        value = Exact(rows=[Row(id=0, name="a" * pad + "é" * 30_000)], total=1)
        data = canonical_bytes(value)
        if data[1024] & 0xC0 == 0x80:
            break
    else:
        pytest.fail("no padding puts a character across the cut")
    server.script("small", summary_reply(GOOD))
    async with model_harness(workspace, server, {"main": ["small"]}) as harness:
        compacted = await compact(harness, value, shown_bytes=1024, coverage="head")
    shown_bytes = compacted.receipt.shown_bytes
    assert isinstance(shown_bytes, int)
    assert 1021 <= shown_bytes < 1024
    prompt = user_prompt(server.bodies("small")[0])
    marker = f"\n[truncated: showing the first {shown_bytes} of {len(data)} bytes]"
    assert prompt.endswith(marker)
    shown = prompt.removesuffix(marker).split("\n\n", 1)[1]
    assert shown.encode() == data[:shown_bytes]


@pytest.mark.parametrize("character", ["é", "€", "𝄞"])  # two, three and four bytes
@pytest.mark.parametrize("pieces", [1, 7])
def test_head_keeps_whole_characters_only(character: str, pieces: int) -> None:
    """The kept head never ends inside a character, however the cut and the pieces fall."""
    for limit in range(1024, 1032):
        data = ('{"x":"' + character * 2000 + '"}').encode()
        size = -(-len(data) // pieces)
        head = _Head(limit)
        assert b"".join(head.watch(data[i : i + size] for i in range(0, len(data), size))) == data
        kept = head.data()
        assert limit - len(character.encode()) < len(kept) <= limit
        assert kept == data[: len(kept)]
        kept.decode()  # whole characters only
        assert head.data() == kept


# --------------------------------------------------------------------------- clean client


async def test_client_closes_cleanly_after_a_summary(
    workspace: rc.LocalWorkspace, server: FakeOpenAI
) -> None:
    """A summary through a client closed with async-with leaves no socket to warn about."""
    server.script("small", summary_reply(GOOD))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with model_harness(workspace, server, {"main": ["small"]}) as harness:
            compacted = await compact(harness)
        del harness
        gc.collect()
    assert compacted.output.kind == "summarized"
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_an_unclosed_client_is_caught_by_the_same_check(server: FakeOpenAI) -> None:
    """The check above can fail: a client left open after a request warns under trio."""
    server.script("small", summary_reply(GOOD))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
        await client.chat.completions.create(model="small", messages=[])
        del client
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] != []
