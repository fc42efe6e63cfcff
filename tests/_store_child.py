"""A child process for the multi-process store tests: ``python -m tests._store_child MODE ...``.

Modes (each runs on the anyio backend named on the command line):

``fsize WS BACKEND LIMIT ROWS``
    Under ``RLIMIT_FSIZE = LIMIT`` bytes, compact a value of ``ROWS`` rows and print one JSON
    line saying what was raised.
``loop WS BACKEND TAG``
    Compact ``loop_value(TAG, i)`` for i = 0, 1, 2, ... forever, printing ``"i ref"`` and
    flushing after each compaction has returned (the parent SIGKILLs it).
``hold WS``
    Hold the store index's write lock (``BEGIN IMMEDIATE``), print ``locked``, and keep it
    until stdin closes.
``read WS BACKEND LIMIT REF...``
    Under ``RLIMIT_FSIZE = LIMIT`` bytes (-1: none), read each exact reference as ``Exact``
    and run ``verify``; print one JSON line of what each returned or raised.
``commitfull WS BACKEND``
    Compact one value, then another whose index commit meets a full disk (``WS`` is a small
    tmpfs; a filler file takes its last byte inside the worker thread, just before that
    commit); print one JSON line: what was raised, and what reads of both return afterwards.
``clocked WS BACKEND NOW TTL STEP...``
    With a clock stopped at ``NOW``, run each step: ``put:TAG`` compacts ``tagged(TAG)`` with
    ``TTL``, ``read:TAG`` reads it, ``prune`` prunes; print one JSON list of the outcomes.
``share WS BACKEND WORKER COUNT MAX_ENTRIES``
    Write ``COUNT`` values (some shared with other workers) into a store bounded by
    ``MAX_ENTRIES``, reading each back and one earlier one after every write; print one JSON
    line of counts.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import random
import resource
import sqlite3
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import msgspec

import response_compaction as rc
from response_compaction._store import open_store
from tests._store_support import TEST_KEY, FaultyBackend, seed_key
from tests.schemas import FALLBACK, Exact, Row, Summary, big_exact

SHARED_POOL = 6


def loop_value(tag: str, i: int) -> Exact:
    """The i-th value of a kill loop: sizes vary from one row to a few hundred KB."""
    rows = 1 + (i * 7919) % 4000
    return Exact(rows=[Row(id=j, name=f"{tag}-{i}-{j}") for j in range(rows)], total=i)


def share_value(worker: int, i: int) -> Exact:
    """Every third value is one of a small pool all workers write; the rest are the worker's."""
    if i % 3 == 0:
        k = (i // 3) % SHARED_POOL
        return Exact(rows=[Row(id=k, name=f"shared-{k}", tags=["s"] * (k * 50))], total=k)
    rows = 1 + (worker * 131 + i * 17) % 300
    return Exact(rows=[Row(id=j, name=f"w{worker}-{i}") for j in range(rows)], total=i)


def _harness(ws: str) -> rc.Harness:
    return rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)


async def _compact(harness: rc.Harness, value: Exact, **options: Any) -> rc.Compacted[Any, Any]:
    opts = {"fallback": FALLBACK, "ladder": "cheap", **options}
    return await rc.response_compact(harness, value, Exact, Summary, opts)


async def _fsize(ws: str, limit: int, rows: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        await _compact(_harness(ws), big_exact(rows))
    except OSError as exc:
        report = {
            "raised": type(exc).__name__,
            "errno": exc.errno,
            "store_error": isinstance(exc, rc.StoreError),
        }
    else:
        report = {"raised": None}
    print(json.dumps(report), flush=True)


async def _loop(ws: str, tag: str) -> None:
    harness = _harness(ws)
    i = 0
    while True:
        compacted = await _compact(harness, loop_value(tag, i), max_entries=100_000)
        sys.stdout.write(f"{i} {compacted.receipt.exact_ref}\n")
        sys.stdout.flush()
        i += 1


async def _share(ws: str, worker: int, count: int, max_entries: int) -> None:
    harness = _harness(ws)
    rng = random.Random(worker)
    written: list[tuple[str, Exact]] = []
    counts = {"writes": 0, "found": 0, "missing": 0, "broken": 0, "wrong": 0}
    details: list[str] = []
    for i in range(count):
        value = share_value(worker, i)
        compacted = await _compact(harness, value, max_entries=max_entries)
        counts["writes"] += 1
        written.append((compacted.receipt.exact_ref, value))
        for ref, expected in (written[-1], rng.choice(written)):
            result = await rc.response_compaction_read_exact(harness, ref, Exact)
            if isinstance(result, rc.Found):
                counts["found" if result.value == expected else "wrong"] += 1
            elif isinstance(result, rc.Missing):
                counts["missing"] += 1
            else:
                counts["broken"] += 1
                details.append(result.detail)
    print(json.dumps({**counts, "details": details[:5]}), flush=True)


def tagged(tag: str) -> Exact:
    """A small value named by ``tag`` (the clocked mode's values)."""
    return Exact(rows=[Row(id=0, name=tag)], total=0)


async def _clocked(ws: str, now: float, ttl: int, steps: list[str]) -> None:
    harness = rc.Harness(fs=rc.LocalWorkspace(ws, clock=lambda: now), llm=None)
    outcomes: list[str] = []
    for step in steps:
        action, _, tag = step.partition(":")
        if action == "put":
            compacted = await _compact(harness, tagged(tag), ttl_seconds=ttl)
            outcomes.append(compacted.receipt.exact_cache)
        elif action == "read":
            ref = "rc1:" + _hex(tagged(tag))
            outcomes.append(_outcome(await rc.response_compaction_read_exact(harness, ref, Exact)))
        else:
            store = await open_store(rc.LocalWorkspace(ws, clock=lambda: now))
            outcomes.append(f"pruned {await store.prune()}")
    print(json.dumps(outcomes), flush=True)


def _hold(ws: str) -> None:
    conn = sqlite3.connect(
        os.path.join(ws, "response-compaction-v1", "index.sqlite3"), isolation_level=None
    )
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.read()
    conn.execute("COMMIT")
    conn.close()


def _outcome(result: object) -> str:
    return type(result).__name__


async def _read(ws: str, limit: int, refs: list[str]) -> None:
    if limit >= 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    harness = _harness(ws)
    report: dict[str, Any] = {"reads": []}
    for ref in refs:
        try:
            result = await rc.response_compaction_read_exact(harness, ref, Exact)
            report["reads"].append(_outcome(result))
        except Exception as exc:
            report["reads"].append(f"raised {type(exc).__name__}: {exc}")
    try:
        store = await open_store(rc.LocalWorkspace(ws))
        report["verify"] = sorted(entry.state for entry in await store.verify())
    except Exception as exc:
        report["verify"] = f"raised {type(exc).__name__}: {exc}"
    print(json.dumps(report), flush=True)


@contextlib.contextmanager
def _full_during_publish(fn: Any) -> Iterator[None]:
    if getattr(fn, "__name__", "") != "publish":
        yield
        return
    # Fill the file system (a small tmpfs the parent mounted) just before the commit.
    filler = os.path.join(_WS[0], "filler")
    with open(filler, "wb", buffering=0) as file, contextlib.suppress(OSError):
        while True:
            file.write(b"\0" * 4096)
    try:
        yield
    finally:
        os.unlink(filler)


_WS: list[str] = []


async def _commitfull(ws: str) -> None:
    _WS.append(ws)
    seed_key(ws)
    first, second = share_value(9, 1), share_value(9, 2)
    await _compact(_harness(ws), first)
    full = rc.Harness(
        fs=rc.LocalWorkspace(ws, file_backend=FaultyBackend(in_thread=_full_during_publish)),
        llm=None,
    )
    report: dict[str, Any] = {}
    try:
        await _compact(full, second)
        report["raised"] = None
    except Exception as exc:
        report["raised"] = type(exc).__name__
        report["message"] = str(exc)
    harness = _harness(ws)
    reads = []
    for value in (first, second):
        compacted = await _compact(harness, value) if value is first else None
        ref = compacted.receipt.exact_ref if compacted else "rc1:" + _hex(value)
        reads.append(_outcome(await rc.response_compaction_read_exact(harness, ref, Exact)))
    report["reads"] = reads
    print(json.dumps(report), flush=True)


def _hex(value: Exact) -> str:
    return hmac.new(
        TEST_KEY, msgspec.json.encode(value, order="sorted"), hashlib.sha256
    ).hexdigest()


def main(argv: list[str]) -> None:
    """Run the mode named in ``argv[0]``."""
    mode, ws, backend, *rest = argv
    if mode == "fsize":
        anyio.run(_fsize, ws, int(rest[0]), int(rest[1]), backend=backend)
    elif mode == "loop":
        anyio.run(_loop, ws, rest[0], backend=backend)
    elif mode == "commitfull":
        anyio.run(_commitfull, ws, backend=backend)
    elif mode == "clocked":
        anyio.run(_clocked, ws, float(rest[0]), int(rest[1]), rest[2:], backend=backend)
    elif mode == "hold":
        _hold(ws)
    elif mode == "read":
        anyio.run(_read, ws, int(rest[0]), rest[1:], backend=backend)
    elif mode == "share":
        anyio.run(_share, ws, int(rest[0]), int(rest[1]), int(rest[2]), backend=backend)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
