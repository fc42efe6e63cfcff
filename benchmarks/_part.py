"""Issue 11's speed target for ``response_compaction_read_part``: any part of a large entry
in at most the cost of hashing the entry plus 20 ms, with no loop freeze over 20 ms.

The entry is compacted once from the typed value (so the writer records its layout), then
parts at the start, at the end and far inside are read. The floor is reading the entry's file
and computing HMAC-SHA256 over its bytes, the digest every verified read must compute; it is
keyed with random bytes of the store key's length (HMAC costs the same under any key).
"""

from __future__ import annotations

import hmac
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

import response_compaction as rc

from ._base import BACKENDS, Result, _backend_name, _harness, _label, _options, settle
from ._loop import with_heartbeat
from ._run import Suite
from .workloads import Summary, Workload, build

__all__ = ["HASH", "read_parts", "verdict"]

HASH = "floor: read entry file + HMAC-SHA256"
FIRST = "read_part start window, first call on a fresh entry"
LIMIT_S = 0.020
LIMIT_MS = 20.0
_Read = tuple[str, dict[str, Any], Callable[[rc.Part], bool]]


def _reads(workload: Workload) -> list[_Read]:
    """The parts read: (row label, read_part arguments, check of the part returned)."""
    if workload.shape == "rows":
        n = len(workload.value.rows)
        return [
            ("read_part start window /rows [0,...)", {"pointer": "/rows", "start": 0},
             lambda p: p.start == 0 and p.next_start != msgspec.UNSET),
            ("read_part end window /rows [len-50,...)", {"pointer": "/rows", "start": n - 50},
             lambda p: p.stop == n and p.next_start == msgspec.UNSET),
            (f"read_part one item far in /rows/{n * 3 // 4}", {"pointer": f"/rows/{n * 3 // 4}"},
             lambda p: p.complete),
        ]  # fmt: skip
    n = len(workload.value.chapters)
    far = f"/chapters/{n * 3 // 4}/sections"
    return [
        ("read_part start window /chapters [0,...)", {"pointer": "/chapters", "start": 0},
         lambda p: p.start == 0 and p.next_start != msgspec.UNSET),
        ("read_part end window /chapters [len-50,...)", {"pointer": "/chapters", "start": n - 50},
         lambda p: p.start == n - 50),
        (f"read_part outline {far}", {"pointer": far, "max_bytes": 1024},
         lambda p: p.outline),
    ]  # fmt: skip


def read_parts(suite: Suite, size: int, shapes: tuple[str, ...] = ("rows", "nested")) -> None:
    """For each shape at ``size``: the floor, then the parts on each backend."""
    for shape in shapes:
        workload = build(shape, size)
        section = f"read_part {shape} {_label(workload.size)}"
        suite.log(f"{section}: parts of one entry vs hashing it")
        first = len(suite.results)
        hashes: list[float] = []
        for backend in BACKENDS:
            anyio.run(_async_parts, suite, section, workload, hashes, backend=backend)
        suite.results.insert(first, Result(section, HASH, "-", hashes))
        suite.log(f"  {section:<22} {HASH:<44} -       min {min(hashes) * 1000:.2f} ms")
        del workload


def _entry_file(workspace: str, ref: str) -> str:
    """The entry's file: the one file in the workspace named by the reference's digest."""
    hexes = {ref[i : i + 64] for i in range(len(ref) - 63)}
    for folder, _, names in os.walk(workspace):
        for name in names:
            path = os.path.join(folder, name)
            if any(h in name for h in hexes) and os.path.getsize(path) > 1_000_000:
                return path
    raise RuntimeError("entry file not found under the workspace")


def _hash_file(path: str, key: bytes) -> str:
    with open(path, "rb") as file:
        data = file.read()
    return hmac.digest(key, data, "sha256").hex()


async def _fresh_entry(suite: Suite, workload: Workload) -> tuple[rc.Harness, str, str]:
    """A new workspace (so a new store key, a new digest: nothing about the entry is known in
    this process) holding the workload: its harness, reference and entry file."""
    workspace = suite.fresh_dir("ws-part")
    harness = _harness(workspace)
    options = _options(32_000)
    await rc.response_compact(harness, {"text": "warm"}, Summary, Summary, options)
    out = await rc.response_compact(harness, workload.value, workload.schema, Summary, options)
    ref = out.receipt.exact_ref
    return harness, ref, _entry_file(workspace, ref)


def _step(
    harness: rc.Harness, ref: str, args: dict[str, Any], check: Callable[[rc.Part], bool]
) -> Callable[[], Awaitable[Any]]:
    async def go() -> Any:
        found = await rc.response_compaction_read_part(harness, ref, **args)
        if not (isinstance(found, rc.Found) and check(found.value)):
            raise RuntimeError(f"unexpected part for {args}: {type(found).__name__}")
        return found

    return go


FIRST_SAMPLES = 3


async def _async_parts(
    suite: Suite, section: str, workload: Workload, hashes: list[float], /
) -> None:
    backend = _backend_name()
    reads = _reads(workload)
    # The first read of an entry in a process has no remembered item counts: it takes them
    # from the sealed layout (or counts them, for an unsealed one). Each sample is a fresh
    # entry; the first is timed with the heartbeat beside it (its freeze), the others alone.
    firsts: list[float] = []
    first_freeze = None
    for sample in range(FIRST_SAMPLES):
        harness, ref, path = await _fresh_entry(suite, workload)
        step = _step(harness, ref, *reads[0][1:])
        settle()
        if sample == 0:
            _, first_freeze = await with_heartbeat(step)
            firsts.append(first_freeze.op_seconds)
        else:
            started = time.perf_counter()
            await step()
            firsts.append(time.perf_counter() - started)
        if sample < FIRST_SAMPLES - 1:  # only the last sample's entry is read again
            shutil.rmtree(harness.fs.workspace_temp_dir(), ignore_errors=True)
    suite.add(Result(section, FIRST, backend, firsts, floor=HASH, freeze=first_freeze))
    key = secrets.token_bytes(32)
    times: dict[str, list[float]] = {label: [] for label, _, _ in reads}
    for _ in range(5):
        settle()
        started = time.perf_counter()
        _hash_file(path, key)
        hashes.append(time.perf_counter() - started)
        for label, args, check in reads:
            settle()
            started = time.perf_counter()
            await _step(harness, ref, args, check)()
            times[label].append(time.perf_counter() - started)
    for label, args, check in reads:
        row = suite.add(Result(section, label, backend, times[label], floor=HASH))
        settle()
        _, row.freeze = await with_heartbeat(_step(harness, ref, args, check))
    shutil.rmtree(harness.fs.workspace_temp_dir(), ignore_errors=True)


def verdict(suite: Suite) -> tuple[str, bool, str] | None:
    """Every read_part row's min (the first read included) against the hash's min + 20 ms,
    and the worst freeze; None when the section did not run."""
    sections = list(dict.fromkeys(r.section for r in suite.results if r.section.startswith(
        "read_part ")))  # fmt: skip
    if not sections:
        return None
    figures: list[str] = []
    ok = True
    for section in sections:
        floor = suite.find(section, HASH, "-")
        rows = [r for r in suite.results if r.section == section and r.loop in BACKENDS]
        if floor is None or not floor.times or not rows:
            return None
        worst = max(rows, key=lambda r: r.best)
        repeat = max(r.best for r in rows if r.op != FIRST)
        first = max(r.best for r in rows if r.op == FIRST)
        gap = max(r.freeze.max_ms if r.freeze else float("inf") for r in rows)
        hashed = floor.best * 1e3
        figures.append(
            f"{section.removeprefix('read_part ')}: hash {hashed:.1f} ms, repeat reads"
            f" <= {repeat * 1e3:.1f} ms ({repeat * 1e3 - hashed:+.1f}), first read"
            f" {first * 1e3:.1f} ms ({first * 1e3 - hashed:+.1f}); freeze {gap:.1f} ms"
        )
        ok = ok and worst.best <= floor.best + LIMIT_S and gap <= LIMIT_MS
    return "; ".join(figures), ok, ", ".join(sections)
