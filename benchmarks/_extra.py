"""Cases of issue 10 beside the main grid: a fresh process's first large compaction, the
import time, and large inputs given as ``msgspec.Raw`` or builtins instead of the typed value.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from typing import Any

import anyio
import msgspec

import response_compaction as rc

from ._base import BACKENDS, REPO, Result, _harness, _label, _options, settle
from ._loop import with_heartbeat
from ._run import Suite
from .workloads import Summary, build

__all__ = ["COLD", "IMPORT", "RAW", "cold_start", "import_time", "raw_inputs"]

COLD = "first compaction in a fresh process"
WARM = "second compaction in that process"
IMPORT = "import response_compaction (fresh process)"
RAW = {
    "raw": "response_compact(msgspec.Raw) -> fallback",
    "builtins": "response_compact(builtins) -> fallback",
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


#: Fresh processes per backend. One process's first and second 90 MB compactions each vary by
#: 100-200 ms (six standalone processes: first minus second from -182 to +209 ms, the workers'
#: page faults about as many in both), so the median of three flipped the verdict between runs.
COLD_PROCESSES = 5


def cold_start(suite: Suite, size: int) -> None:
    """Each backend: fresh processes compact two different values of ``size``; both timed.

    The verdict uses the median over ``COLD_PROCESSES`` processes of (first - second).
    """
    section = f"fresh process, rows {_label(size)}"
    suite.log(f"{section}: first vs second compaction, {COLD_PROCESSES} processes per loop")
    for backend in BACKENDS:
        firsts, seconds = [], []
        for _ in range(COLD_PROCESSES):
            got = _cold_probe(suite, size, backend)
            firsts.append(got["first_s"])
            seconds.append(got["second_s"])
        suite.add(Result(section, COLD, backend, firsts))
        warm = suite.add(Result(section, WARM, backend, seconds))
        gaps = [(first - second) * 1000 for first, second in zip(firsts, seconds, strict=True)]
        warm.notes["first_minus_second_ms"] = statistics.median(gaps)
        warm.notes["first_minus_second_each_ms"] = [round(gap, 1) for gap in gaps]


def _cold_probe(suite: Suite, size: int, backend: str) -> dict[str, Any]:
    workspace = suite.fresh_dir("ws-cold")
    anyio.run(_make_store, workspace)  # made by another process than the one measured
    # Earlier cases leave hundreds of MB of dirty pages: their writeback landed in one first
    # call of a --full run (+640 ms) and in none of the same probe's runs alone.
    settle()
    args = {"target": size, "tmp": suite.root, "backend": backend, "workspace": workspace}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks._cold", json.dumps(args)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"cold-start probe failed:\n{proc.stderr[-4000:]}")
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return got


async def _make_store(workspace: str) -> None:
    await rc.response_compact(_harness(workspace), {"text": "warm"}, Summary, Summary, _options())


def import_time(suite: Suite, repeats: int = 5) -> None:
    """``import response_compaction`` in fresh interpreters (the import alone is timed)."""
    code = "import time; t = time.perf_counter(); import response_compaction; " \
        "print(time.perf_counter() - t)"  # fmt: skip
    times = []
    for _ in range(repeats):
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True, text=True,
            timeout=60, check=True,
        )  # fmt: skip
        times.append(float(proc.stdout.strip()))
    suite.add(Result("import", IMPORT, "-", times))


def raw_inputs(suite: Suite, size: int, shapes: tuple[str, ...] = ("rows",)) -> None:
    """Each shape's value handed over as ``msgspec.Raw`` JSON or as builtins: the loop's freeze."""
    for shape in shapes:
        workload = build(shape, size)
        section = f"{shape} {_label(workload.size)} as Raw / builtins"
        suite.log(f"{section}: the caller's loop while the input is validated")
        inputs: dict[str, Any] = {
            "raw": msgspec.Raw(workload.data),
            "builtins": msgspec.to_builtins(workload.value),
        }
        for backend in BACKENDS:
            for kind, given in inputs.items():
                elapsed, freeze = anyio.run(_one, suite, given, workload.schema, backend=backend)
                suite.add(Result(section, RAW[kind], backend, [elapsed], freeze=freeze))
        del inputs, workload  # 90 MB each: not kept while the next shape is built


async def _one(suite: Suite, given: Any, schema: Any) -> tuple[float, Any]:
    harness = _harness(suite.fresh_dir("ws-raw"))
    options = _options()
    await rc.response_compact(harness, {"text": "warm"}, Summary, Summary, options)
    settle()
    started = anyio.current_time()

    async def op() -> object:
        return await rc.response_compact(harness, given, schema, Summary, options)

    _, freeze = await with_heartbeat(op)
    elapsed = anyio.current_time() - started
    shutil.rmtree(harness.fs.workspace_temp_dir(), ignore_errors=True)  # 90 MB, not needed again
    return elapsed, freeze
