"""The cases of many values: 2 KB ones in a row, 32 x 1 MB at once, a large store, idle loops."""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import time
from typing import Any

import anyio
import anyio.to_thread
import diskcache

import response_compaction as rc

from . import _floor
from ._base import (
    _COMPACT_EXACT,
    _DC_GET,
    _DC_SET,
    _HIT,
    _PUT,
    _READ,
    _READ_OP,
    BACKENDS,
    Result,
    SuiteBase,
    _backend_name,
    _beat,
    _check,
    _harness,
    _options,
    settle,
)
from ._loop import idle_freeze
from .workloads import Rows, Summary, build, canonical, small_responses

__all__ = ["ManyValues"]


class ManyValues(SuiteBase):
    """The cases of many values at once or in a row (mixed into :class:`Suite`)."""

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
        floors: dict[str, dict[str, list[float]]] = {b: {_PUT: [], _READ: []} for b in BACKENDS}
        for backend in BACKENDS:
            anyio.run(self._async_small, section, values, floors[backend], backend=backend)
        self.add_floors(section, first, floors)

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

        def done(harness: rc.Harness) -> None:
            # Each batch's 32 MB gone before the next batch (untimed): the next one's page
            # cache reuses those pages. Pages this VM had not touched since boot, or had handed
            # back to its host, made writes up to 9x dearer (0.3 -> 2.75 ms per MB into tmpfs
            # once ~250 MB were held), and the batches late in the section paid it.
            shutil.rmtree(harness.fs.workspace_temp_dir(), ignore_errors=True)

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
                done(harness)
        seq_row = self.add(Result(section, "sequential (32 awaited in turn)", backend, seq,
                                  per="batch"))  # fmt: skip
        conc_row = self.add(Result(section, "concurrent (task group)", backend, conc, per="batch"))
        conc_row.notes["throughput_vs_sequential"] = seq_row.best / conc_row.best
        target = await fresh()
        conc_row.freeze = await _beat(lambda: concurrent(target))
        done(target)

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
