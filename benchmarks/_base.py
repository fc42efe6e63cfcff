"""What every benchmark case shares: the plan, the result rows, the harness, the op names."""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sniffio

import response_compaction as rc

from ._loop import Freeze, with_heartbeat
from .workloads import Summary

__all__ = ["BACKENDS", "Memory", "Plan", "Result", "SuiteBase"]

BACKENDS = ("asyncio", "trio")
# A step returns what the operation returned, so the caller (not the step) drops it: freeing a
# 400 MB tree takes ~0.1 s, and that is the caller's cost, paid outside the timed window.
_Step = Callable[[rc.Harness], Awaitable[object]]
FALLBACK = Summary(text="fallback: the response was too large to show")
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Plan:
    """What one run measures."""

    full: bool
    sizes: tuple[int, ...]
    shapes: tuple[str, ...]
    small_count: int
    concurrent: int
    scale: tuple[int, int]
    scale_ops: int
    memory_min_bytes: int
    memory_shapes: tuple[str, ...]

    def repeats(self, size: int) -> int:
        if size >= 50_000_000:
            return 3
        if size >= 5_000_000:
            return 3 if not self.full else 5
        if size >= 2_000_000:
            return 5 if not self.full else 7
        # A 1 MB step takes about 10 ms, and its min over 5 moved by 15% from run to run.
        return 15 if not self.full else 21


@dataclass(slots=True)
class Result:
    """One row of the table: an operation on a loop (or none), its times and its ratios."""

    section: str
    op: str
    loop: str
    times: list[float]
    per: str = "op"
    floor: str | None = None
    peer: str | None = None
    freeze: Freeze | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    vs_floor: float | None = None
    vs_peer: float | None = None

    @property
    def best(self) -> float:
        return min(self.times) if self.times else float("nan")

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    def as_json(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "op": self.op,
            "loop": self.loop,
            "per": self.per,
            "n": len(self.times),
            "min_s": self.best,
            "median_s": self.median,
            "times_s": [round(t, 6) for t in self.times],
            "floor": self.floor,
            "vs_floor": self.vs_floor,
            "peer": self.peer,
            "vs_peer": self.vs_peer,
            "freeze": self.freeze.as_json() if self.freeze else None,
            **({"notes": self.notes} if self.notes else {}),
        }


@dataclass(frozen=True, slots=True)
class Memory:
    """Peak memory of one operation in its own process (asyncio)."""

    section: str
    op: str
    canonical_bytes: int
    caller_peak_growth: int
    caller_retained: int
    worker_peak: int | None
    worker_peak_growth: int | None
    reset_ok: bool
    seconds: float

    @property
    def ratio(self) -> float:
        return self.caller_peak_growth / self.canonical_bytes

    def as_json(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "op": self.op,
            "canonical_bytes": self.canonical_bytes,
            "caller_peak_growth_bytes": self.caller_peak_growth,
            "caller_peak_growth_x_canonical": round(self.ratio, 3),
            "caller_retained_bytes": self.caller_retained,
            "worker_peak_bytes": self.worker_peak,
            "worker_peak_growth_bytes": self.worker_peak_growth,
            "hwm_reset_ok": self.reset_ok,
            "seconds": round(self.seconds, 4),
        }


def _options(threshold: int = 32_000) -> dict[str, Any]:
    return {
        "fallback": FALLBACK,
        "ladder": "none",
        "summarize_above_bytes": threshold,
        "max_entries": 1_000_000,
    }


def _harness(path: str) -> rc.Harness:
    return rc.Harness(fs=rc.LocalWorkspace(path), llm=None)


def _label(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} KB"


def settle() -> None:
    """Before a timed step: flush dirty pages (ours and anyone's) and collect garbage, so
    neither a writeback nor a GC pass left over from the previous step lands in this one."""
    os.sync()
    gc.collect()


@contextmanager
def _timer(times: list[float]) -> Iterator[None]:
    settle()
    started = time.perf_counter()
    yield
    times.append(time.perf_counter() - started)


class SuiteBase:
    """A run of a :class:`Plan` in a temp root: its results, memory, progress lines."""

    def __init__(self, plan: Plan, root: str, log: Callable[[str], None]) -> None:
        self.plan = plan
        self.root = root
        self.log = log
        self.results: list[Result] = []
        self.memory: list[Memory] = []
        self.idle: dict[str, Freeze] = {}
        self._serial = 0

    # ------------------------------------------------------------------------ plumbing

    def fresh_dir(self, prefix: str) -> str:
        self._serial += 1
        return tempfile.mkdtemp(prefix=f"{prefix}-{self._serial}-", dir=self.root)

    def add(self, result: Result) -> Result:
        self.results.append(result)
        freeze = ""
        if result.freeze is not None:
            freeze = f"  freeze max {result.freeze.max_ms:.1f} ms p99 {result.freeze.p99_ms:.1f} ms"
        timing = f"min {result.best * 1000:.2f} ms" if result.times else "(freeze only)"
        self.log(f"  {result.section:<22} {result.op:<44} {result.loop:<7} {timing}{freeze}")
        return result

    def add_floors(
        self, section: str, first: int, floors: dict[str, dict[str, list[float]]]
    ) -> None:
        """The floor rows of ``section``: each pass's own (``floors[backend][op]``), after
        the pooled ones, which head the section at ``first`` (what the peers are held to)."""
        ops = list(next(iter(floors.values())))
        for n, op in enumerate(ops):
            pooled = [t for times in floors.values() for t in times[op]]
            self.results.insert(first + n, Result(section, op, "-", pooled))
            self.log(f"  {section:<22} {op:<44} -       min {min(pooled) * 1000:.2f} ms")
        for backend, times in floors.items():
            for op in ops:
                self.add(Result(section, op, backend, times[op]))

    def find(self, section: str, op: str, loop: str) -> Result | None:
        for result in self.results:
            if (result.section, result.op, result.loop) == (section, op, loop):
                return result
        return None

    def ratios(self) -> None:
        """Fill ``vs_floor`` and ``vs_peer`` from the min times of the rows they name."""
        for result in self.results:
            for attr, ref_op in (("vs_floor", result.floor), ("vs_peer", result.peer)):
                if ref_op is None or not result.times:
                    continue
                # The floor timed in the same pass (alternating with this row's steps) if
                # there is one: the pooled one's min, over twice the samples and the drift of
                # both passes, ran 5-10% below either pass's own (ratios of the second pass
                # rose by as much, whichever loop ran second).
                ref = self.find(result.section, ref_op, result.loop) or self.find(
                    result.section, ref_op, "-"
                )
                if ref is not None and ref.times:
                    setattr(result, attr, result.best / ref.best)


def _check(ok: bool, what: object) -> None:
    if not ok:
        raise RuntimeError(f"unexpected result: {what!r}")


async def _beat(op: Callable[[], Awaitable[Any]]) -> Freeze:
    settle()
    _, freeze = await with_heartbeat(op)
    return freeze


def _backend_name() -> str:
    return sniffio.current_async_library()


_PUT = "floor: encode+sha+write+fsync+rename+read+sha+decode"
_NAIVE = "peer: json.dumps(sort_keys)+write, no fsync"
_READ = "floor read: read+sha+decode"
_DC_SET = "peer: diskcache Cache.set(bytes)"
_DC_GET = "peer: diskcache Cache.get -> bytes"
_COMPACT = "response_compact -> fallback (stored+verified)"
_COMPACT_EXACT = "response_compact -> exact (value returned)"
_HIT = "response_compact again: cache hit (reused)"
_COLD = "  first compaction on a new event loop (cold)"
# The library verifies values at least this big in a worker process (its WORKER_VERIFY_BYTES).
_PROCESS_VERIFY_BYTES = 512 << 10
_READ_OP = "response_compaction_read_exact -> Found"
_MEMORY_OPS = {
    "compact_fallback": _COMPACT,
    "compact_exact": _COMPACT_EXACT,
    "read": _READ_OP,
    "floor": "floor (raw calls)",
}
