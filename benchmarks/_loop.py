"""Event-loop helpers: a 1 ms heartbeat that measures how long the loop was frozen.

The heartbeat is a task on the same loop as the operation: it sleeps 1 ms, wakes, and records
the time since it last woke. A gap of 1.1 ms is an idle loop; a gap of 800 ms means something
held the loop (or the GIL the loop needs) for 800 ms. Works on asyncio and trio through anyio.

To see what froze the loop, set ``RC_BENCH_FREEZE_DUMP=path``: while an operation runs, every
thread's stack is appended to ``path`` whenever a beat is ``RC_BENCH_FREEZE_MS`` (default 30)
late. ``faulthandler`` writes it from its own C thread, so a single C call holding the GIL
(which a Python sampler would wait behind) is caught in the act.
"""

from __future__ import annotations

import faulthandler
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

__all__ = ["Freeze", "idle_freeze", "with_heartbeat"]

T = TypeVar("T")
TICK = 0.001


@dataclass(frozen=True, slots=True)
class Freeze:
    """Heartbeat gaps during one operation, in milliseconds."""

    max_ms: float
    p99_ms: float
    ticks: int
    op_seconds: float

    def as_json(self) -> dict[str, Any]:
        return {
            "max_ms": round(self.max_ms, 2),
            "p99_ms": round(self.p99_ms, 2),
            "ticks": self.ticks,
            "op_seconds": round(self.op_seconds, 4),
        }


def _arm_dump() -> Callable[[], None]:
    """A re-arm for the freeze dump (a no-op unless ``RC_BENCH_FREEZE_DUMP`` is set)."""
    path = os.environ.get("RC_BENCH_FREEZE_DUMP")
    if not path:
        return lambda: None
    late = float(os.environ.get("RC_BENCH_FREEZE_MS", "30")) / 1000
    sink = open(path, "a")  # noqa: SIM115 - kept open for faulthandler's thread, per process

    def arm() -> None:
        faulthandler.dump_traceback_later(late, file=sink)

    return arm


_DUMP_ARM = _arm_dump()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


async def with_heartbeat(op: Callable[[], Awaitable[T]]) -> tuple[T, Freeze]:
    """Run ``op`` with a 1 ms heartbeat on the same loop; its result and the loop's gaps."""
    gaps: list[float] = []
    rearm = _DUMP_ARM
    done = anyio.Event()
    box: list[T] = []
    elapsed = 0.0

    async def beat() -> None:
        last = time.perf_counter()
        try:
            while not done.is_set():
                rearm()
                await anyio.sleep(TICK)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
        finally:
            faulthandler.cancel_dump_traceback_later()

    async def run() -> None:
        nonlocal elapsed
        await anyio.sleep(TICK * 3)  # let the heartbeat settle first
        started = time.perf_counter()
        try:
            box.append(await op())
        finally:
            elapsed = time.perf_counter() - started
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(beat)
        tg.start_soon(run)
    # The last gap can end after the op did (the beat notices ``done`` one tick late): keep it,
    # a freeze that ends the op is still a freeze the caller saw.
    return box[0], Freeze(
        max_ms=max(gaps, default=math.nan) * 1000,
        p99_ms=_percentile(gaps, 0.99) * 1000,
        ticks=len(gaps),
        op_seconds=elapsed,
    )


async def idle_freeze(seconds: float = 0.3) -> Freeze:
    """The heartbeat on an idle loop: the noise floor of the gap figures."""
    _, freeze = await with_heartbeat(lambda: anyio.sleep(seconds))
    return freeze
