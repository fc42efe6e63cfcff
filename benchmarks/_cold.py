"""The first large compaction of a fresh process: ``python -m benchmarks._cold '{json}'``.

Builds two different rows values of the target size, then times the first compaction (which
opens the store, and so starts the library's worker pool) and the second, in this fresh
process. The store itself was made by an earlier process (``workspace``), as an agent's usually
was: creating a store is not what a process's first compaction is about. Prints one JSON
object on stdout. ``main()`` is guarded, as any script's should be.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from typing import Any

import anyio
import msgspec

import response_compaction as rc
from benchmarks.workloads import Summary, build


async def _run(args: dict[str, Any]) -> dict[str, Any]:
    first, second = (build("rows", args["target"], seed=seed) for seed in (21, 22))
    workspace = args.get("workspace") or tempfile.mkdtemp(dir=args["tmp"])
    harness = rc.Harness(fs=rc.LocalWorkspace(workspace), llm=None)
    options = {
        "fallback": Summary(text="fallback"),
        "ladder": "none",
        "summarize_above_bytes": 32_000,
        "max_entries": 1_000_000,
    }
    times = []
    for workload in (first, second):
        started = time.perf_counter()
        out = await rc.response_compact(harness, workload.value, workload.schema, Summary, options)
        times.append(time.perf_counter() - started)
        assert out.receipt.exact_cache == "stored", out.receipt
    return {"first_s": times[0], "second_s": times[1], "canonical_bytes": first.size}


def main() -> None:
    args = json.loads(sys.argv[1])
    result = anyio.run(_run, args, backend=args["backend"])
    sys.stdout.write(msgspec.json.encode(result).decode() + "\n")


if __name__ == "__main__":
    main()
