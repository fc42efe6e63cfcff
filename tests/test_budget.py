"""Budgets that cut hung model calls: ``rung_timeout_ms``, ``timeout_ms`` and the map's share.

The real openai client over real HTTP to the scripted server, on asyncio and trio, whose
loop clock the test moves by hand (``tests._loop_clock``). Each test parks the library at a
hung request, jumps the clock to 10 s short of the bound under test and checks that no call
has timed out yet (a bound too short fails here), then jumps the last 10 s (a bound missing
or too long leaves the request hung until the server drops it after 30 s, ``HOLD_LIMIT_S``,
which ends it as an "error", not a "timeout"). The bounds are minutes, so real time cannot
reach one first, and the client's own timeout is an hour, so no other bound is crossed. No
assertion reads wall time; how promptly a real timer fires is measured by the benchmarks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import openai
import pytest

import response_compaction as rc
from tests._loop_clock import LoopClock
from tests.fake_openai import FakeOpenAI, Hang, Status, fake_openai, summary_reply
from tests.schemas import FALLBACK, Summary
from tests.test_coverage import GOOD, Search, attempts, search, user_prompt

pytestmark = pytest.mark.anyio
MARGIN_S = 10.0  # the first jump stops this far short of the bound


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


class Calls(logging.Handler):
    """The outcome of each model call, from the library's own log line, as it is recorded."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.outcomes: list[str] = []
        self._answered: dict[int, threading.Event] = {}
        self.waiting = 0
        self._waiting: dict[int, threading.Event] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("summary call:"):
            self.outcomes.append(record.getMessage().split("outcome=")[1].split()[0])
            self._answered.setdefault(self.outcomes.count("ok"), threading.Event()).set()
        elif record.getMessage().startswith("summary: waiting for the ladder run"):
            self.waiting += 1
            self._waiting.setdefault(self.waiting, threading.Event()).set()

    async def wait_following(self, count: int) -> None:
        """Wait (off the loop) until ``count`` callers waited for another's ladder run."""
        if self.waiting < count:
            event = self._waiting.setdefault(count, threading.Event())
            assert await anyio.to_thread.run_sync(event.wait, 10.0, abandon_on_cancel=True)

    async def wait_answered(self, count: int) -> None:
        """Wait (off the loop) until ``count`` calls were recorded "ok"."""
        if count and self.outcomes.count("ok") < count:
            event = self._answered.setdefault(count, threading.Event())
            assert await anyio.to_thread.run_sync(event.wait, 10.0, abandon_on_cancel=True)


@pytest.fixture
def calls(caplog: pytest.LogCaptureFixture) -> Iterator[Calls]:
    caplog.set_level(logging.DEBUG, logger="response_compaction")
    handler = Calls()
    logging.getLogger("response_compaction").addHandler(handler)
    yield handler
    logging.getLogger("response_compaction").removeHandler(handler)


@asynccontextmanager
async def harness_for(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, routes: list[str]
) -> AsyncIterator[rc.Harness]:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test", timeout=3600.0)
    async with client:
        yield rc.Harness(fs=workspace, llm=rc.OpenAICatalog(client, {"main": routes}))


def summary_files(workspace: rc.LocalWorkspace) -> list[Path]:
    return sorted(Path(workspace.path).glob("*/summary/*/*"))


async def jump_when_hung(
    harness: rc.Harness,
    server: FakeOpenAI,
    clock: LoopClock,
    calls: Calls,
    seconds: float,
    answered: int = 0,
    **options: Any,
) -> rc.Compacted[Search, Summary]:
    """Compact ``search(3000)``. Once the server hangs a request and ``answered`` calls are
    recorded, move the clock ``seconds`` in two steps, checking nothing timed out before."""
    done: list[rc.Compacted[Search, Summary]] = []

    async def run() -> None:
        opts = {"fallback": FALLBACK, "ladder": "main", **options}
        done.append(await rc.response_compact(harness, search(3000), Search, Summary, opts))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await server.wait_hanging()
        await calls.wait_answered(answered)
        clock.jump(seconds - MARGIN_S)
        await anyio.lowlevel.checkpoint()  # a timer now due runs (asyncio: on the next turn)
        await anyio.wait_all_tasks_blocked()  # and what it cancelled has been recorded
        assert "timeout" not in calls.outcomes, "a bound fired before its time"
        clock.jump(MARGIN_S)
    return done[0]


async def test_rung_timeout_moves_on_and_closes_the_connection(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, loop_clock: LoopClock, calls: Calls
) -> None:
    """A hung rung is cut at rung_timeout_ms, its socket closed, and the next rung runs."""
    server.script("hung", Hang())
    server.script("next", summary_reply(GOOD))
    async with harness_for(workspace, server, ["hung", "next"]) as harness:
        compacted = await jump_when_hung(
            harness, server, loop_clock, calls, 300.0, rung_timeout_ms=300_000,
            timeout_ms=600_000,
        )  # fmt: skip
        await server.wait_hangup()
    first, second = attempts(compacted.receipt)
    assert (first.route, first.outcome) == ("hung", "timeout")
    assert first.elapsed_ms >= 300_000  # read on the clock the budget is kept on
    assert (second.route, second.outcome) == ("next", "ok")
    assert server.hangups == 1


async def test_whole_budget_ends_a_hung_ladder_with_the_fallback(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, loop_clock: LoopClock, calls: Calls
) -> None:
    """An error, then a hung rung: timeout_ms ends the step with the fallback; the rung after
    is never asked, nothing is cached, and the exact value stays Found."""
    server.script("e500", Status(500))
    server.script("hung", Hang())
    server.script("never", summary_reply(GOOD))
    async with harness_for(workspace, server, ["e500", "hung", "never"]) as harness:
        compacted = await jump_when_hung(
            harness, server, loop_clock, calls, 300.0, timeout_ms=300_000
        )
        await server.wait_hangup()
        ref = compacted.receipt.exact_ref
        read = await rc.response_compaction_read_exact(harness, ref, Search)
    assert compacted.output == rc.FallbackOutput(value=FALLBACK)
    assert compacted.receipt.fallback_reason == "timeout"
    assert [(a.route, a.outcome) for a in attempts(compacted.receipt)] == [
        ("e500", "error"),
        ("hung", "timeout"),
    ]
    assert server.count("never") == 0
    assert server.hangups == 1
    assert read == rc.Found(value=search(3000))
    assert summary_files(workspace) == []


async def test_full_coverage_reduces_what_arrived_when_the_map_runs_out_of_time(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, loop_clock: LoopClock, calls: Calls
) -> None:
    """A hung map call is cut at the map's share of the budget; the rest is reduced and said."""
    server.script("m", summary_reply(GOOD), Hang(), summary_reply(GOOD))
    async with harness_for(workspace, server, ["m"]) as harness:
        # Four map calls at once, the second to arrive hung; once the other three answered,
        # just past the map's 70% share of 600 s (a share of 80% would leave it hung past
        # the server's 30 s hold), well short of the whole budget.
        compacted = await jump_when_hung(
            harness, server, loop_clock, calls, 421.0, answered=3, coverage="full",
            max_model_calls=5, timeout_ms=600_000,
        )  # fmt: skip
    assert compacted.output.kind == "summarized"
    outcomes = [(a.call, a.outcome) for a in attempts(compacted.receipt)]
    assert sorted(outcomes[:-1]) == [("map", "ok")] * 3 + [("map", "timeout")]
    assert outcomes[-1] == ("reduce", "ok")
    reduces = [b for b in server.bodies("m") if "in no part summary" in user_prompt(b)]
    assert len(reduces) == 1


async def test_the_maps_share_ends_with_every_map_call_hung_and_nothing_counts_as_covered(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, loop_clock: LoopClock, calls: Calls
) -> None:
    """Every map call hung: the map's share of the budget (70% of 300 s) ends them, nothing
    arrived to reduce: the fallback says "timeout" and reports no covered bytes (nothing was
    summarized)."""
    server.script("a", Hang())
    async with harness_for(workspace, server, ["a"]) as harness:
        compacted = await jump_when_hung(
            harness, server, loop_clock, calls, 211.0, coverage="full", timeout_ms=300_000
        )
    assert compacted.output == rc.FallbackOutput(value=FALLBACK)
    assert compacted.receipt.covered_bytes is msgspec.UNSET
    assert compacted.receipt.fallback_reason == "timeout"
    assert {a.outcome for a in attempts(compacted.receipt)} == {"timeout"}


# --------------------------------------------------------------------------- shared budgets


async def test_a_leader_s_budget_ending_leaves_a_longer_budget_its_own_run(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, loop_clock: LoopClock, calls: Calls
) -> None:
    """The leader's timeout_ms ends before the follower's: the follower asks the model itself.

    Its receipt must not report a timeout that never happened to its own budget. (Once with
    300 ms of real time, the leader's budget ran out before its request even arrived.)
    """
    server.script("main", Hang(), summary_reply(GOOD))
    done: dict[str, rc.Compacted[Search, Summary]] = {}

    async def run(name: str, timeout_ms: int) -> None:
        opts = {"fallback": FALLBACK, "ladder": "main", "timeout_ms": timeout_ms}
        done[name] = await rc.response_compact(harness, search(3000), Search, Summary, opts)

    async with (
        harness_for(workspace, server, ["main"]) as harness,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(run, "leader", 100_000)
        await server.wait_hanging()
        tg.start_soon(run, "follower", 600_000)
        await calls.wait_following(1)
        loop_clock.jump(110.0)  # the leader's 100 s end; 490 of the follower's 600 are left
    assert done["leader"].receipt.fallback_reason == "timeout"
    assert done["follower"].output == rc.SummarizedOutput(value=Summary(**GOOD))
    assert done["follower"].receipt.summary_cache == "stored"
    assert server.count("main") == 2


async def test_callers_of_one_budget_share_the_leader_s_timeout(
    workspace: rc.LocalWorkspace, server: FakeOpenAI, loop_clock: LoopClock, calls: Calls
) -> None:
    """Followers with less than half their budget left take the leader's timeout: one call.

    All four have 600 s; the followers join 100 s after the leader, so when its budget ends
    they have 90 s left. (With 3 s of real time, a follower slower than 1.5 s to join would
    have led a run of its own.)
    """
    server.script("main", Hang(), summary_reply(GOOD))
    results: list[rc.Compacted[Search, Summary]] = []

    async def one() -> None:
        opts = {"fallback": FALLBACK, "ladder": "main", "timeout_ms": 600_000}
        results.append(await rc.response_compact(harness, search(3000), Search, Summary, opts))

    async with (
        harness_for(workspace, server, ["main"]) as harness,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(one)
        await server.wait_hanging()
        loop_clock.jump(100.0)
        for _ in range(3):
            tg.start_soon(one)
        await calls.wait_following(3)
        loop_clock.jump(510.0)
    assert [r.receipt.fallback_reason for r in results] == ["timeout"] * 4
    assert server.count("main") == 1
