"""The cases: each workload through the library, the floor and the peers, side by side."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import diskcache

import response_compaction as rc

from . import _floor
from ._base import (
    _COLD,
    _COMPACT,
    _COMPACT_EXACT,
    _DC_GET,
    _DC_SET,
    _HIT,
    _MEMORY_OPS,
    _NAIVE,
    _PROCESS_VERIFY_BYTES,
    _PUT,
    _READ,
    _READ_OP,
    BACKENDS,
    REPO,
    Memory,
    Plan,
    Result,
    _backend_name,
    _beat,
    _check,
    _harness,
    _label,
    _options,
    _Step,
    _timer,
    settle,
)
from ._loop import with_heartbeat
from ._many import ManyValues
from .workloads import Summary, Workload, build

__all__ = ["BACKENDS", "Memory", "Plan", "Result", "Suite"]


class Suite(ManyValues):
    """Runs a :class:`Plan` in a temp root; collects results, memory and progress lines."""

    # ------------------------------------------------------------------------ big values

    def big(self, shape: str, target: int) -> None:
        workload = build(shape, target)
        section = f"{shape} {_label(workload.size)}"
        self.log(f"{section}: canonical {workload.size:,} bytes")
        repeats = self.plan.repeats(workload.size)
        first = len(self.results)
        self._peers_big(section, workload, repeats)
        floors: dict[str, dict[str, list[float]]] = {b: {_PUT: [], _READ: []} for b in BACKENDS}
        homes = [
            anyio.run(self._async_big, section, workload, repeats, floors[b], backend=b)
            for b in BACKENDS
        ]
        # The floor was timed inside each backend's run, alternating with the library's steps,
        # so drift on a shared machine hits both alike.
        self.add_floors(section, first, floors)
        if workload.size >= self.plan.memory_min_bytes and shape in self.plan.memory_shapes:
            self._memory_big(section, workload, homes[-1])
        for workspace, _ in homes:  # a full run's stores did not fit in 6 GB of free disk
            shutil.rmtree(workspace, ignore_errors=True)
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
            shutil.rmtree(cache.directory, ignore_errors=True)
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
