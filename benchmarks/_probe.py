"""Peak memory of one operation, measured in a fresh process: ``python -m benchmarks._probe``.

Run by the benchmark driver, one process per (workload, operation), so no operation inherits
another's heap. The process builds its workload, settles, resets its peak-RSS mark
(``/proc/self/clear_refs`` = 5) so the workload's own construction does not count, then runs
the operation and reads ``VmHWM`` from ``/proc/self/status``. ``ru_maxrss`` is not used: on
Linux it carries the parent's peak across fork and exec.

Helper processes (the library's verification workers, ``python -m response_compaction._worker``)
are measured the same way: the pool is warm before the baseline, and afterwards every child
process's ``VmHWM`` is read from ``/proc/<pid>/status`` (the largest is reported).

Prints one JSON object on stdout.

Imports are absolute and ``main()`` is guarded, as any script's should be (the library's
workers never import it).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
from typing import Any

import anyio
import msgspec

import response_compaction as rc
from benchmarks import _floor
from benchmarks.workloads import Summary, build
from response_compaction import _pool

__all__ = ["children", "reset_peak", "status_kb"]

KB = 1024


def status_kb(pid: int | str = "self") -> dict[str, int]:
    """``VmHWM`` and ``VmRSS`` (in kB) of a process, or {} if it is gone."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as file:
            for line in file:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    key, amount = line.split()[:2]
                    found[key.rstrip(":")] = int(amount)
    except OSError:
        return {}
    return found


def reset_peak() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as file:
            file.write("5")
    except OSError:
        return False
    now = status_kb()
    return now.get("VmHWM", 0) <= now.get("VmRSS", 0) + 1024


def children() -> list[int]:
    """Pids whose parent is this process (scanning /proc; works without CONFIG_PROC_CHILDREN)."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as file:
                stat = file.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: fields start after the last ')'.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(entry))
    return found


async def _run(args: dict[str, Any]) -> dict[str, Any]:
    workload = build(args["shape"], args["target"])
    value, schema, size = workload.value, workload.schema, workload.size
    del workload  # the canonical bytes are not the caller's: only the value is
    op: str = args["op"]
    workspace = args.get("workspace") or tempfile.mkdtemp(prefix="rc-probe-", dir=args.get("tmp"))
    harness = rc.Harness(fs=rc.LocalWorkspace(workspace), llm=None)
    threshold = size if op == "compact_exact" else 32_000
    options = {
        "fallback": Summary(text="fallback"),
        "ladder": "none",
        "summarize_above_bytes": threshold,
        "max_entries": 1_000_000,
    }
    if op.startswith("compact"):
        # Open the store (index, directories) before the baseline: that is not per-value cost.
        await rc.response_compact(harness, {"text": "warm"}, Summary, Summary, options)

    _pool.POOL.start()
    for _ in range(1000):  # at most ~10 s for the pool to come up
        if _pool.POOL.ready_count() >= 1:
            break
        await anyio.sleep(0.01)
    workers_before = {pid: status_kb(pid) for pid in children()}
    gc.collect()
    reset_ok = reset_peak()
    before = status_kb()
    started = time.perf_counter()
    result: Any
    if op.startswith("compact"):
        result = await rc.response_compact(harness, value, schema, Summary, options)
        assert result.receipt.exact_cache == "stored", result.receipt
    elif op == "read":
        result = await rc.response_compaction_read_exact(harness, args["ref"], schema)
        assert isinstance(result, rc.Found), result
    elif op == "floor":
        directory = tempfile.mkdtemp(prefix="rc-probe-floor-", dir=args.get("tmp"))
        result = _floor.floor_put(value, schema, directory, "entry")
    else:
        raise SystemExit(f"unknown op {op!r}")
    elapsed = time.perf_counter() - started
    after = status_kb()
    helpers = {pid: status_kb(pid) for pid in children()}
    del result
    return {
        "op": op,
        "shape": args["shape"],
        "canonical_bytes": size,
        "seconds": elapsed,
        "reset_ok": reset_ok,
        "caller_rss_before_kb": before.get("VmRSS", 0),
        "caller_hwm_before_kb": before.get("VmHWM", 0),
        "caller_hwm_after_kb": after.get("VmHWM", 0),
        "caller_rss_after_kb": after.get("VmRSS", 0),
        "worker_pids": sorted(helpers),
        "worker_hwm_before_kb": max(
            (s.get("VmHWM", 0) for s in workers_before.values()), default=0
        ),
        "worker_hwm_after_kb": max((s.get("VmHWM", 0) for s in helpers.values()), default=0),
        "helpers": {str(pid): s for pid, s in helpers.items()},
    }


def main() -> None:
    args = json.loads(sys.argv[1])
    result = anyio.run(_run, args, backend=args.get("backend", "asyncio"))
    sys.stdout.write(msgspec.json.encode(result).decode() + "\n")


if __name__ == "__main__":
    main()
