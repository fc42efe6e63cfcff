"""How late a real timer ends a hung model call: the time a compaction runs past ``timeout_ms``.

The tests (``tests/test_budget.py``) move the loop's clock by hand, so they show which bound
ends a hung call, never how promptly a real one fires on a busy machine: that is a time, and
times belong here. A socket server on 127.0.0.1 accepts each connection and never answers.
A compaction whose one model rung is that server, with a 200 ms budget, is timed end to end;
the same compaction with no model (storing, profiling, the fallback) is timed beside it, and
the overshoot is the first minus the second minus the budget, one pair at a time.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import openai

import response_compaction as rc

from ._base import BACKENDS, FALLBACK, Result, _harness, settle
from ._run import Suite
from .workloads import Summary, build

__all__ = ["OVERSHOOT", "overshoot", "verdict"]

OVERSHOOT = "hung model: past timeout_ms (200 ms), minus the no-model run"
_BUDGET_MS = 200
_LIMIT_S = 0.050


@contextlib.contextmanager
def _silent_server() -> Iterator[str]:
    """An HTTP address that accepts connections and never answers on them."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):  # the listener was shut down
            while True:
                held.append(listener.accept()[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes accept() on Linux
        listener.close()
        thread.join(timeout=5.0)  # elsewhere accept() may not wake: the thread is a daemon
        for conn in held:
            conn.close()


def overshoot(suite: Suite, repeats: int = 7) -> None:
    section = "budget: hung model"
    suite.log(f"{section}: how far past timeout_ms the fallback arrives")
    with _silent_server() as base_url:
        for backend in BACKENDS:
            times = anyio.run(_pairs, suite, base_url, repeats, backend=backend)
            suite.add(Result(section, OVERSHOOT, backend, times, notes={"budget_ms": _BUDGET_MS}))


async def _pairs(suite: Suite, base_url: str, repeats: int) -> list[float]:
    value = build("rows", 2_000).value
    options: dict[str, Any] = {
        "fallback": FALLBACK,
        "ladder": "main",
        "summarize_above_bytes": 100,
        "timeout_ms": _BUDGET_MS,
    }
    without = _harness(suite.fresh_dir("ws-budget"))
    async with openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0) as client:
        hung = rc.Harness(fs=without.fs, llm=rc.OpenAICatalog(client, {"main": ["silent"]}))
        await rc.response_compact(without, value, type(value), Summary, options)  # stored once
        times = []
        for _ in range(repeats):
            plain = await _timed(without, value, options)
            late = await _timed(hung, value, options)
            times.append(late - plain - _BUDGET_MS / 1000)
    return times


async def _timed(harness: rc.Harness, value: Any, options: dict[str, Any]) -> float:
    settle()
    started = time.perf_counter()
    out = await rc.response_compact(harness, value, type(value), Summary, options)
    elapsed = time.perf_counter() - started
    expected = "no_llm" if harness.llm is None else "timeout"
    if out.output.kind != "fallback" or out.receipt.fallback_reason != expected:
        raise RuntimeError(f"unexpected result: {out.receipt.fallback_reason!r}")
    return elapsed


def verdict(suite: Suite) -> tuple[str, str, bool, str] | None:
    """The worst overshoot of every run on both loops against 50 ms; None when not run."""
    rows = [r for r in suite.results if r.op == OVERSHOOT and r.times]
    if not rows:
        return None
    worst = max(max(r.times) for r in rows)
    figures = ", ".join(
        f"{r.loop} max {max(r.times) * 1e3:.1f} ms, median {r.median * 1e3:.1f} ms" for r in rows
    )
    name = "hung model: fallback within timeout_ms + 50 ms (every run)"
    return name, figures, worst <= _LIMIT_S, rows[0].section
