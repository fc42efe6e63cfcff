"""``python -m benchmarks [--full] [--json PATH]``: the table on stdout, the figures as JSON.

Quick mode (the default, CI-sized) runs the ~1 and ~10 MB workloads; ``--full`` adds ~90 MB.

Imports are absolute and ``main()`` is guarded, as any script's should be (the library's
verification workers are its own ``python -m response_compaction._worker``; they never
import this file).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from benchmarks import _budget, _extra, _part
from benchmarks._base import Plan
from benchmarks._machine import compile_library, library_source, machine, versions
from benchmarks._report import CAVEATS, render, targets
from benchmarks._run import Suite
from benchmarks.workloads import SHAPES

SECTIONS = ("big", "small", "concurrency", "scale", "cold", "raw", "part", "budget", "import")


def _plan(args: argparse.Namespace) -> Plan:
    sizes = (1_000_000, 10_000_000, 90_000_000) if args.full else (1_000_000, 10_000_000)
    return Plan(
        full=args.full,
        sizes=sizes,
        shapes=tuple(args.shapes or SHAPES),
        small_count=args.small or 1000,
        concurrent=32,
        # Filling 10,000 entries takes ~40 s through the public API: CI-sized runs use 2,000.
        scale=(100, args.scale or (10_000 if args.full else 2_000)),
        scale_ops=100 if args.full else 50,
        memory_min_bytes=5_000_000,
        memory_shapes=tuple(SHAPES) if args.full else ("rows",),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--full", action="store_true", help="add the ~90 MB workloads")
    parser.add_argument(
        "--json", default="bench-results.json", metavar="PATH", help="figures as JSON (%(default)s)"
    )
    parser.add_argument("--tmp", metavar="DIR", help="parent of the scratch dir (system temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch dir")
    parser.add_argument("--note", help="a line for the header, e.g. which commit was measured")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), help=argparse.SUPPRESS)
    parser.add_argument("--sizes", nargs="+", type=float, metavar="MB", help=argparse.SUPPRESS)
    parser.add_argument("--small", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    plan = _plan(args)
    sizes = tuple(int(mb * 1e6) for mb in args.sizes) if args.sizes else plan.sizes
    only = set(args.only or SECTIONS)

    root = tempfile.mkdtemp(prefix="rc-bench-", dir=args.tmp)
    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    meta: dict[str, Any] = {
        "mode": "full" if args.full else "quick",
        "started": stamp,
        "machine": machine(root),
        "versions": versions(),
        "library": library_source() + (f"; {args.note}" if args.note else ""),
        "bytecode": compile_library(),  # before any fresh process is timed
        "caveats": list(CAVEATS),
        "loadavg_start": os.getloadavg(),
    }
    suite = Suite(plan, root, log)
    try:
        suite.idle_loops()
        if "big" in only:
            for size in sizes:
                for shape in plan.shapes:
                    suite.big(shape, size)
        if "small" in only:
            suite.small()
        if "concurrency" in only:
            suite.concurrency()
        if "scale" in only:
            suite.scale()
        if "cold" in only:
            _extra.cold_start(suite, max(sizes))
        if "raw" in only:
            _extra.raw_inputs(suite, max(sizes), plan.shapes)
        if "part" in only:
            _part.read_parts(suite, max(sizes), tuple(s for s in plan.shapes if s != "strings"))
        if "budget" in only:
            _budget.overshoot(suite)
        if "import" in only:
            _extra.import_time(suite)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    suite.ratios()
    meta["duration_s"] = time.perf_counter() - started
    meta["loadavg_end"] = os.getloadavg()
    goals = targets(suite)
    print(render(suite, meta, goals))
    payload = {
        **meta,
        "idle_loop": {b: f.as_json() for b, f in suite.idle.items()},
        "results": [r.as_json() for r in suite.results],
        "memory": [m.as_json() for m in suite.memory],
        "targets": [g.as_json() for g in goals],
    }
    with open(args.json, "w", encoding="utf-8") as file:
        json.dump(payload, file, indent=1)
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
