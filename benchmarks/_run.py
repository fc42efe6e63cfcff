"""The cases: each workload through the library, the floor and the peers, side by side."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import diskcache
import sniffio

import response_compaction as rc

from . import _floor
from ._loop import Freeze, idle_freeze, with_heartbeat
from .workloads import Rows, Summary, Workload, build, canonical, small_responses

__all__ = ["BACKENDS", "Memory", "Plan", "Result", "Suite"]

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


class Suite:
    """Runs a :class:`Plan` in a temp root; collects results, memory and progress lines."""

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
                ref = self.find(result.section, ref_op, "-")
                if ref is not None and ref.times:
                    setattr(result, attr, result.best / ref.best)

    # ------------------------------------------------------------------------ big values

    def big(self, shape: str, target: int) -> None:
        workload = build(shape, target)
        section = f"{shape} {_label(workload.size)}"
        self.log(f"{section}: canonical {workload.size:,} bytes")
        repeats = self.plan.repeats(workload.size)
        first = len(self.results)
        self._peers_big(section, workload, repeats)
        floors: dict[str, list[float]] = {_PUT: [], _READ: []}
        where = ("", "")
        for backend in BACKENDS:
            where = anyio.run(self._async_big, section, workload, repeats, floors, backend=backend)
        # The floor was timed inside each backend's run, alternating with the library's steps,
        # so drift on a shared machine hits both alike; it heads its section.
        for n, op in enumerate((_PUT, _READ)):
            self.results.insert(first + n, Result(section, op, "-", floors[op]))
            self.log(f"  {section:<22} {op:<44} -       min {min(floors[op]) * 1000:.2f} ms")
        if workload.size >= self.plan.memory_min_bytes and shape in self.plan.memory_shapes:
            self._memory_big(section, workload, where)
        del workload
        gc.collect()

    def _peers_big(self, section: str, workload: Workload, repeats: int) -> None:
        value, data = workload.value, workload.data
        cache = diskcache.Cache(self.fresh_dir("diskcache"), size_limit=1 << 40)
        try:
            sets: list[float] = []
            for i in range(repeats):
                with _timer(sets):
                    _floor.diskcache_set(cache, f"k{i}", data)
            gets: list[float] = []
            for _ in range(repeats):
                with _timer(gets):
                    _floor.diskcache_get(cache, "k0")
        finally:
            cache.close()
        self.add(Result(section, _DC_SET, "-", sets, floor=_PUT))
        self.add(Result(section, _DC_GET, "-", gets, floor=_READ))
        naive: list[float] = []
        naive_dir = self.fresh_dir("naive")
        for i in range(repeats):
            with _timer(naive):
                _floor.naive_json_write(value, os.path.join(naive_dir, f"n{i}.json"))
        self.add(Result(section, _NAIVE, "-", naive, floor=_PUT))
        shutil.rmtree(naive_dir, ignore_errors=True)

    async def _async_big(
        self, section: str, workload: Workload, repeats: int, floors: dict[str, list[float]], /
    ) -> tuple[str, str]:
        backend = _backend_name()
        value, schema, size = workload.value, workload.schema, workload.size
        digest = hashlib.sha256(workload.data).hexdigest()
        fallback_opts, exact_opts = _options(32_000), _options(size)

        async def fresh() -> rc.Harness:
            harness = _harness(self.fresh_dir("ws"))
            # Open the store (root, index) first: per-store setup is not per-value cost.
            await rc.response_compact(harness, {"text": "warm"}, Summary, Summary, fallback_opts)
            return harness

        async def compact(harness: rc.Harness, options: dict[str, Any], expect: str) -> Any:
            out = await rc.response_compact(harness, value, schema, Summary, options)
            _check(out.receipt.exact_cache == expect, out.receipt)
            return out

        # Warm-up, untimed: lets the worker pool start, builds decoders, fills page cache.
        # This store keeps the value: the cache-hit and read steps use it.
        home = await fresh()
        settle()
        started = time.perf_counter()
        first = await compact(home, fallback_opts, "stored")
        cold = time.perf_counter() - started
        ref = first.receipt.exact_ref
        floor_dir = self.fresh_dir("floor")
        _floor.floor_put(value, schema, floor_dir, "warm")

        async def store_fallback(target: rc.Harness) -> object:
            out = await compact(target, fallback_opts, "stored")
            _check(out.output.kind == "fallback", out.output.kind)
            return out

        async def store_exact(target: rc.Harness) -> object:
            out = await compact(target, exact_opts, "stored")
            _check(out.output.kind == "exact", out.output.kind)
            return out

        async def hit(target: rc.Harness) -> object:
            return await compact(target, fallback_opts, "reused")

        async def read(target: rc.Harness) -> object:
            found = await rc.response_compaction_read_exact(target, ref, schema)
            _check(isinstance(found, rc.Found), found)
            return found

        async def same() -> rc.Harness:
            return home

        # Each step: how to get its store (untimed), and the timed operation on it.
        steps: dict[str, tuple[Callable[[], Awaitable[rc.Harness]], _Step]] = {
            _COMPACT: (fresh, store_fallback),
            _COMPACT_EXACT: (fresh, store_exact),
            _HIT: (same, hit),
            _READ_OP: (same, read),
        }
        times: dict[str, list[float]] = {op: [] for op in steps}
        for i in range(repeats):
            settle()  # the same start as each library step (``_timed``)
            with _timer(floors[_PUT]):
                kept = _floor.floor_put(value, schema, floor_dir, f"e{i}")
            del kept
            for op in (_COMPACT, _COMPACT_EXACT, _HIT):
                await self._timed(times[op], *steps[op], home)
            settle()
            with _timer(floors[_READ]):
                kept = _floor.floor_read(os.path.join(floor_dir, "warm"), digest, schema)
            del kept
            await self._timed(times[_READ_OP], *steps[_READ_OP], home)
        shutil.rmtree(floor_dir, ignore_errors=True)
        for op, floor, peer in (
            (_COMPACT, _PUT, _DC_SET),
            (_COMPACT_EXACT, _PUT, _DC_SET),
            (_HIT, _PUT, _DC_SET),
            (_READ_OP, _READ, _DC_GET),
        ):
            self.add(Result(section, op, backend, times[op], floor=floor, peer=peer))
        if size >= _PROCESS_VERIFY_BYTES:
            why = {"why": "first large value on a new event loop (the worker pool is per process)"}
            self.add(Result(section, _COLD, backend, [cold], floor=_PUT, peer=_DC_SET, notes=why))
        # The caller's loop: one more run of each step, with the heartbeat beside it.
        for op, (prepare, step) in steps.items():
            row = self.find(section, op, backend)
            if row is None:
                continue
            target = await prepare()
            row.freeze = await _beat(lambda: step(target))  # noqa: B023 - awaited right here
            self.log(f"    {op} on {backend}: freeze max {row.freeze.max_ms:.1f} ms")
            if target is not home:
                shutil.rmtree(target.fs.workspace_temp_dir(), ignore_errors=True)
        directory = self.fresh_dir("floor-thread")
        settle()
        _, freeze = await with_heartbeat(
            lambda: anyio.to_thread.run_sync(_floor.floor_put, value, schema, directory, "t")
        )
        self.add(
            Result(section, "floor in a worker thread (to_thread)", backend, [], freeze=freeze)
        )
        shutil.rmtree(directory, ignore_errors=True)
        return str(home.fs.workspace_temp_dir()), ref

    async def _timed(
        self,
        times: list[float],
        prepare: Callable[[], Awaitable[rc.Harness]],
        step: _Step,
        keep: rc.Harness,
    ) -> None:
        target = await prepare()
        settle()
        started = time.perf_counter()
        kept = await step(target)
        times.append(time.perf_counter() - started)
        del kept
        if target is not keep:
            shutil.rmtree(target.fs.workspace_temp_dir(), ignore_errors=True)

    # ------------------------------------------------------------------------ memory

    def _memory_big(self, section: str, workload: Workload, where: tuple[str, str]) -> None:
        workspace, ref = where
        for op in ("compact_fallback", "compact_exact", "read", "floor"):
            args = {
                "op": op,
                "shape": workload.shape,
                "target": workload.target_bytes,
                "workspace": workspace if op == "read" else None,
                "ref": ref,
                "tmp": self.root,
            }
            self.memory.append(self._probe(section, op, args))
            m = self.memory[-1]
            self.log(
                f"    memory {op}: caller peak +{m.caller_peak_growth / 1e6:.1f} MB"
                f" ({m.ratio:.2f}x canonical), worker peak "
                f"{(m.worker_peak or 0) / 1e6:.1f} MB"
            )

    def _probe(self, section: str, op: str, args: dict[str, Any]) -> Memory:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks._probe", json.dumps(args)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"memory probe {op} failed:\n{proc.stderr[-4000:]}")
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        kb = 1024
        worker_used = op == "compact_fallback"
        return Memory(
            section=section,
            op=_MEMORY_OPS[op],
            canonical_bytes=got["canonical_bytes"],
            caller_peak_growth=(got["caller_hwm_after_kb"] - got["caller_rss_before_kb"]) * kb,
            caller_retained=(got["caller_rss_after_kb"] - got["caller_rss_before_kb"]) * kb,
            worker_peak=got["worker_hwm_after_kb"] * kb if worker_used else None,
            worker_peak_growth=(got["worker_hwm_after_kb"] - got["worker_hwm_before_kb"]) * kb
            if worker_used
            else None,
            reset_ok=got["reset_ok"],
            seconds=got["seconds"],
        )

    # ------------------------------------------------------------------------ many small

    def small(self) -> None:
        count = self.plan.small_count
        values = small_responses(count)
        sizes = [len(canonical(v)) for v in values]
        section = f"{count} x {statistics.mean(sizes) / 1e3:.1f} KB"
        self.log(f"{section}: many small responses, one after another")
        first = len(self.results)
        cache = diskcache.Cache(self.fresh_dir("diskcache-small"))
        try:
            sets: list[float] = []
            settle()
            for i, value in enumerate(values):
                data = canonical(value)
                started = time.perf_counter()
                _floor.diskcache_set(cache, f"k{i}", data)
                sets.append(time.perf_counter() - started)
            gets: list[float] = []
            for i in range(count):
                started = time.perf_counter()
                _floor.diskcache_get(cache, f"k{i}")
                gets.append(time.perf_counter() - started)
        finally:
            cache.close()
        self.add(Result(section, _DC_SET, "-", sets, floor=_PUT))
        self.add(Result(section, _DC_GET, "-", gets, floor=_READ))
        floors: dict[str, list[float]] = {_PUT: [], _READ: []}
        for backend in BACKENDS:
            anyio.run(self._async_small, section, values, floors, backend=backend)
        for n, op in enumerate((_PUT, _READ)):
            self.results.insert(first + n, Result(section, op, "-", floors[op]))

    async def _async_small(
        self, section: str, values: list[Rows], floors: dict[str, list[float]], /
    ) -> None:
        backend = _backend_name()
        harness = _harness(self.fresh_dir("ws-small"))
        options = _options()
        await rc.response_compact(harness, {"text": "warm"}, Summary, Summary, options)
        floor_dir = self.fresh_dir("floor-small")
        compacts: list[float] = []
        refs: list[str] = []
        digests: list[str] = []
        settle()
        # Floor and library alternate value by value: drift on a shared machine hits both.
        for i, value in enumerate(values):
            started = time.perf_counter()
            _floor.floor_put(value, Rows, floor_dir, f"s{i}")
            floors[_PUT].append(time.perf_counter() - started)
            digests.append(hashlib.sha256(canonical(value)).hexdigest())
            started = time.perf_counter()
            out = await rc.response_compact(harness, value, Rows, Summary, options)
            compacts.append(time.perf_counter() - started)
            refs.append(out.receipt.exact_ref)
            _check(out.output.kind == "exact", out.output.kind)
        reads: list[float] = []
        settle()
        for i, ref in enumerate(refs):
            started = time.perf_counter()
            _floor.floor_read(os.path.join(floor_dir, f"s{i}"), digests[i], Rows)
            floors[_READ].append(time.perf_counter() - started)
            started = time.perf_counter()
            found = await rc.response_compaction_read_exact(harness, ref, Rows)
            reads.append(time.perf_counter() - started)
            _check(isinstance(found, rc.Found), found)
        hits: list[float] = []
        settle()
        for value in values[:200]:
            started = time.perf_counter()
            out = await rc.response_compact(harness, value, Rows, Summary, options)
            hits.append(time.perf_counter() - started)
            _check(out.receipt.exact_cache == "reused", out.receipt)
        compact_row = self.add(Result(section, _COMPACT_EXACT, backend, compacts, floor=_PUT,
                                      peer=_DC_SET))  # fmt: skip
        self.add(Result(section, _HIT, backend, hits, floor=_PUT, peer=_DC_SET))
        read_row = self.add(Result(section, _READ_OP, backend, reads, floor=_READ, peer=_DC_GET))

        fresh = _harness(self.fresh_dir("ws-small-hb"))
        await rc.response_compact(fresh, {"text": "warm"}, Summary, Summary, options)

        async def compact_batch() -> None:
            for value in values[:200]:
                await rc.response_compact(fresh, value, Rows, Summary, options)

        async def read_batch() -> None:
            for ref in refs[:200]:
                await rc.response_compaction_read_exact(harness, ref, Rows)

        compact_row.freeze = await _beat(compact_batch)
        compact_row.notes["freeze_over"] = "200 compactions in a row"
        read_row.freeze = await _beat(read_batch)
        read_row.notes["freeze_over"] = "200 reads in a row"
        shutil.rmtree(floor_dir, ignore_errors=True)

    # ------------------------------------------------------------------------ concurrency

    def concurrency(self) -> None:
        n = self.plan.concurrent
        values = [build("rows", 1_000_000, seed=100 + i).value for i in range(n)]
        section = f"{n} x 1 MB concurrent"
        self.log(f"{section}: one loop, anyio task group vs one after another")
        for backend in BACKENDS:
            anyio.run(self._async_concurrency, section, values, backend=backend)

    async def _async_concurrency(self, section: str, values: list[Any], /) -> None:
        backend = _backend_name()
        options = _options()
        repeats = 3 if self.plan.full else 2

        async def fresh() -> rc.Harness:
            harness = _harness(self.fresh_dir("ws-conc"))
            await rc.response_compact(harness, {"text": "warm"}, Summary, Summary, options)
            return harness

        async def one(harness: rc.Harness, value: Any) -> None:
            out = await rc.response_compact(harness, value, Rows, Summary, options)
            _check(out.receipt.exact_cache == "stored", out.receipt)

        async def sequential(harness: rc.Harness) -> None:
            for value in values:
                await one(harness, value)

        async def concurrent(harness: rc.Harness) -> None:
            async with anyio.create_task_group() as tg:
                for value in values:
                    tg.start_soon(one, harness, value)

        await one(await fresh(), values[0])  # warm-up
        seq: list[float] = []
        conc: list[float] = []
        for _ in range(repeats):
            for run, times in ((sequential, seq), (concurrent, conc)):
                harness = await fresh()
                settle()
                started = time.perf_counter()
                await run(harness)
                times.append(time.perf_counter() - started)
        seq_row = self.add(Result(section, "sequential (32 awaited in turn)", backend, seq,
                                  per="batch"))  # fmt: skip
        conc_row = self.add(Result(section, "concurrent (task group)", backend, conc, per="batch"))
        conc_row.notes["throughput_vs_sequential"] = seq_row.best / conc_row.best
        target = await fresh()
        conc_row.freeze = await _beat(lambda: concurrent(target))

    # ------------------------------------------------------------------------ store scale

    def scale(self) -> None:
        low, high = self.plan.scale
        section = f"store scale {low} vs {high:,}"
        self.log(f"{section}: populating")
        filler = small_responses(high, seed=11)
        stores: dict[int, str] = {}
        for n in (low, high):
            path = self.fresh_dir(f"scale-{n}")
            started = time.perf_counter()
            anyio.run(_populate, path, filler[:n])
            self.log(f"    populated {n:,} entries in {time.perf_counter() - started:.1f} s")
            stores[n] = path
        del filler
        ops = self.plan.scale_ops
        probe = small_responses(ops * 2 * len(BACKENDS), seed=13)
        for k, backend in enumerate(BACKENDS):
            # A fresh copy of the small store per backend, so it stays small; the big store is
            # shared (it grows by at most a few hundred entries over 10,000).
            small = self.fresh_dir(f"scale-{low}-{backend}")
            shutil.copytree(stores[low], small, dirs_exist_ok=True, symlinks=True)
            chunk = probe[k * 2 * ops : (k + 1) * 2 * ops]
            lo_times, hi_times = anyio.run(_scale_ops, small, stores[high], chunk, backend=backend)
            lo = self.add(Result(section, f"compact 2 KB + read it back, {low:,} entries", backend,
                                 lo_times))  # fmt: skip
            hi = self.add(Result(section, f"compact 2 KB + read it back, {high:,} entries", backend,
                                 hi_times))  # fmt: skip
            hi.peer = lo.op
            hi.vs_peer = hi.median / lo.median
            hi.notes["median_ratio_vs_low"] = hi.median / lo.median
            hi.notes["min_ratio_vs_low"] = hi.best / lo.best

    # ------------------------------------------------------------------------ idle loop

    def idle_loops(self) -> None:
        for backend in BACKENDS:
            self.idle[backend] = anyio.run(idle_freeze, backend=backend)


async def _populate(path: str, values: list[Rows]) -> None:
    harness = _harness(path)
    options = _options()
    limiter = anyio.CapacityLimiter(16)

    async def one(value: Rows) -> None:
        async with limiter:
            await rc.response_compact(harness, value, Rows, Summary, options)

    async with anyio.create_task_group() as tg:
        for value in values:
            tg.start_soon(one, value)


async def _scale_ops(small: str, big: str, values: list[Rows]) -> tuple[list[float], list[float]]:
    options = _options()
    stores = (_harness(small), _harness(big))
    for harness in stores:
        await rc.response_compact(harness, {"text": "warm"}, Summary, Summary, options)
    times: tuple[list[float], list[float]] = ([], [])
    settle()
    # The two stores alternate op by op: drift on a shared machine hits both alike.
    for i, value in enumerate(values):
        harness = stores[i % 2]
        started = time.perf_counter()
        out = await rc.response_compact(harness, value, Rows, Summary, options)
        found = await rc.response_compaction_read_exact(harness, out.receipt.exact_ref, Rows)
        times[i % 2].append(time.perf_counter() - started)
        _check(out.receipt.exact_cache == "stored" and isinstance(found, rc.Found), found)
    return times


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
