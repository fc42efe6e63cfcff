"""Budgets that cut hung model calls: ``rung_timeout_ms``, ``timeout_ms`` and the map's share.

The real openai client over real HTTP to the scripted server, on asyncio and trio, whose
loop clock the test moves by hand (``tests._loop_clock``): each test parks the library at a
hung request, jumps the clock past a bound, and asserts what the library did about it. No
assertion reads wall time, so a loaded machine cannot fail these. The bounds are minutes, so
real time cannot reach one first: a bound that is missing or too long leaves the request hung
until the server drops it (30 s, ``HOLD_LIMIT_S``), which ends it as an "error", not a
"timeout". How promptly a real timer fires is measured by the benchmarks, not asserted here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import response_compaction as rc
from tests._loop_clock import LoopClock
from tests.fake_openai import FakeOpenAI, Hang, fake_openai, summary_reply
from tests.schemas import Summary
from tests.test_coverage import GOOD, Search, attempts, compact, harness_for, search, user_prompt

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def loop_clock(request: pytest.FixtureRequest) -> LoopClock:
    return LoopClock(str(request.param))


@pytest.fixture
def anyio_backend(loop_clock: LoopClock) -> tuple[str, dict[str, Any]]:
    """This module's tests run on a loop whose clock ``loop_clock`` moves."""
    return loop_clock.backend()


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with fake_openai() as fake:
        yield fake


async def jump_when_hung(
    harness: rc.Harness,
    server: FakeOpenAI,
    clock: LoopClock,
    seconds: float,
    **options: Any,
) -> rc.Compacted[Search, Summary]:
    """Compact ``search(3000)``; once the server is hanging a request, jump ``seconds``."""
    done: list[rc.Compacted[Search, Summary]] = []

    async def run() -> None:
        done.append(await compact(harness, search(3000), **options))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await server.wait_hanging()
        clock.jump(seconds)
    return done[0]


async def test_rung_timeout_moves_on_and_closes_the_connection(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, loop_clock: LoopClock
) -> None:
    """A hung rung is cut at rung_timeout_ms, its socket closed, and the next rung runs."""
    server.script("hung", Hang())
    server.script("next", summary_reply(GOOD))
    async with harness_for(workspace, server, ["hung", "next"]) as harness:
        compacted = await jump_when_hung(
            harness, server, loop_clock, 300.0, rung_timeout_ms=300_000, timeout_ms=600_000
        )
        await server.wait_hangup()
    first, second = attempts(compacted.receipt)
    assert (first.route, first.outcome) == ("hung", "timeout")
    assert first.elapsed_ms >= 300_000  # cut by its bound (on the budget's clock), not before
    assert (second.route, second.outcome) == ("next", "ok")
    assert server.hangups == 1


async def test_whole_budget_ends_a_hung_ladder_with_the_fallback(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, loop_clock: LoopClock
) -> None:
    """With every rung hung, the summary step ends at timeout_ms with the fallback."""
    server.script("a", Hang())
    server.script("b", Hang())
    async with harness_for(workspace, server, ["a", "b"]) as harness:
        compacted = await jump_when_hung(harness, server, loop_clock, 600.0, timeout_ms=600_000)
        await server.wait_hangup()
    assert compacted.output.kind == "fallback"
    assert compacted.receipt.fallback_reason == "timeout"
    (only,) = attempts(compacted.receipt)
    assert (only.route, only.outcome) == ("a", "timeout")
    assert only.elapsed_ms >= 590_000  # ended by the jump (the budget began before the call)
    assert server.count("b") == 0
    assert server.hangups == 1


async def test_full_coverage_reduces_what_arrived_when_the_map_runs_out_of_time(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, loop_clock: LoopClock
) -> None:
    """A hung map call is cut at the map's share of the budget; the rest is reduced and said."""
    server.script("m", summary_reply(GOOD), Hang(), summary_reply(GOOD))
    async with harness_for(workspace, server, ["m"]) as harness:
        # Just past the map's 70% share of 600 s: a share of 80% would leave the map call
        # hung past the server's 30 s hold, and it would end as an "error".
        compacted = await jump_when_hung(
            harness, server, loop_clock, 421.0, coverage="full", max_model_calls=5,
            timeout_ms=600_000,
        )  # fmt: skip
    assert compacted.output.kind == "summarized"
    outcomes = [(a.call, a.outcome) for a in attempts(compacted.receipt)]
    assert ("map", "timeout") in outcomes
    assert outcomes[-1] == ("reduce", "ok")
    assert "in no part summary" in user_prompt(server.bodies("m")[-1])
