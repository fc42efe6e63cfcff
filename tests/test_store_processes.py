"""Real processes against one store: a file-size limit, SIGKILL mid-write, shared eviction."""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

import response_compaction as rc
from response_compaction import _store
from tests._store_child import loop_value, share_value
from tests._store_support import (
    TEST_KEY,
    compact,
    entry_files,
    entry_path,
    hex_of,
    index_rows,
    ref_of,
    seed_key,
    store_root,
    temp_files,
)
from tests.schemas import Exact, Row, big_exact

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
KILL_ROUNDS = 7
WORKERS = 4
WRITES_PER_WORKER = 45
SHARED_MAX_ENTRIES = 8


def _child(mode: str, ws: Path, backend: str, *args: object) -> list[str]:
    return [sys.executable, "-m", "tests._store_child", mode, str(ws), backend, *map(str, args)]


def _orphans_are_whole(root: Path) -> None:
    # A file with no row (killed between rename and commit) must still be a complete entry.
    for name in entry_files(root) - index_rows(root):
        digest = hmac.new(TEST_KEY, entry_path(root, name).read_bytes(), hashlib.sha256)
        assert digest.hexdigest() == name


async def test_a_live_medium_value_compacted_on_a_full_disk_is_still_reused(
    tmp_path: Path, anyio_backend: str
) -> None:
    """A ~1 MB value already stored, compacted again by a child that can write no file past
    512 KiB: its temp file's write fails beside the look for the live entry, and the entry
    renewed meanwhile answers (as when the look came first): no error, nothing left over."""
    ws = tmp_path / "ws"
    seed_key(ws)
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    rows = 16_000  # about 1 MB of canonical JSON: a medium value
    await compact(harness, big_exact(rows))
    result = await anyio.run_process(
        _child("fsize", ws, anyio_backend, 512 << 10, rows), cwd=REPO, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout) == {"raised": None}
    root = store_root(ws)
    assert temp_files(root) == []
    assert entry_files(root) == index_rows(root) == {hex_of(big_exact(rows))}
    assert await rc.response_compaction_read_exact(
        harness, ref_of(big_exact(rows)), Exact
    ) == rc.Found(value=big_exact(rows))


async def test_file_size_limit_fails_cleanly(tmp_path: Path, anyio_backend: str) -> None:
    """Under RLIMIT_FSIZE a child's compaction raises OSError(EFBIG); nothing half-written shows."""
    ws = tmp_path / "ws"
    seed_key(ws)
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    old = [Exact(rows=[Row(id=i, name=f"old{i}")], total=i) for i in range(3)]
    for value in old:
        await compact(harness, value)
    rows = 40_000  # about 2.4 MB of canonical JSON against a 1 MiB limit
    result = await anyio.run_process(
        _child("fsize", ws, anyio_backend, 1 << 20, rows), cwd=REPO, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    assert report == {"raised": "StoreError", "errno": errno.EFBIG, "store_error": True}
    root = store_root(ws)
    assert temp_files(root) == []
    assert entry_files(root) == {hex_of(v) for v in old}
    assert index_rows(root) == {hex_of(v) for v in old}
    for value in old:
        assert await rc.response_compaction_read_exact(harness, ref_of(value), Exact) == rc.Found(
            value=value
        )
    big = big_exact(rows)
    assert await rc.response_compaction_read_exact(harness, ref_of(big), Exact) == rc.Missing()


async def _run_until_killed(ws: Path, backend: str, tag: str, lines: int) -> list[int]:
    """Start a writing child, read ``lines`` completed references, SIGKILL it; return the
    indexes of every reference it printed (those it printed after the ``lines`` too)."""
    done: list[int] = []
    async with await anyio.open_process(_child("loop", ws, backend, tag), cwd=REPO) as process:
        assert process.stdout is not None
        stdout = BufferedByteReceiveStream(process.stdout)
        while len(done) < lines:
            done.append(_printed(tag, await stdout.receive_until(b"\n", 1024)))
        process.kill()
        assert await process.wait() == -9
        rest = b"".join([chunk async for chunk in stdout])
    # A line cut short by the kill is not a printed reference.
    done.extend(_printed(tag, line) for line in rest.split(b"\n")[:-1])
    return done


def _printed(tag: str, line: bytes) -> int:
    index, ref = line.decode().split()
    assert ref == ref_of(loop_value(tag, int(index)))
    return int(index)


async def _unbacked_rows_are_unprinted_and_missing(
    root: Path, harness: rc.Harness, printed: list[tuple[str, int]]
) -> set[str]:
    """Rows with no file: each a killed writer's put in flight (its row committed before its
    rename, ``publish_recorded``), never a printed one, and each reads Missing."""
    unbacked = index_rows(root) - entry_files(root)
    assert len(unbacked) <= KILL_ROUNDS  # at most one put in flight per writer
    last = {tag: max(index for t, index in printed if t == tag) for tag, _ in printed}
    # Every printed line was read, so a put in flight is the one after the last printed, or
    # (killed between its return and its print) the one after that.
    in_flight = {
        hex_of(value): value
        for tag, index in last.items()
        for value in (loop_value(tag, index + 1), loop_value(tag, index + 2))
    }
    for key in unbacked:
        value = in_flight[key]  # KeyError: a row no put in flight could have left
        read = await rc.response_compaction_read_exact(harness, ref_of(value), Exact)
        assert read == rc.Missing()
    return unbacked


async def test_sigkill_mid_write_loses_nothing_completed(
    tmp_path: Path, anyio_backend: str
) -> None:
    """A writer SIGKILLed at varying points: every reference it printed reads Found afterwards."""
    ws = tmp_path / "ws"
    seed_key(ws)
    printed: list[tuple[str, int]] = []
    for round_ in range(KILL_ROUNDS):
        tag = f"r{round_}"
        done = await _run_until_killed(ws, anyio_backend, tag, lines=round_ + 1)
        printed.extend((tag, index) for index in done)

    root = store_root(ws)
    left_behind = len(temp_files(root))
    _orphans_are_whole(root)
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    unbacked = await _unbacked_rows_are_unprinted_and_missing(root, harness, printed)

    for tag, index in printed:
        value = loop_value(tag, index)
        read = await rc.response_compaction_read_exact(harness, ref_of(value), Exact)
        assert read == rc.Found(value=value), (tag, index)

    # Once the killed writers' temp files are old (no put can be in flight), prune sweeps
    # them, the files a writer renamed but never recorded (killed mid-commit), and the rows a
    # writer committed but never renamed a file for (``unbacked``: none, when no kill landed
    # in that window).
    two_hours_ago = time.time() - 2 * 3600
    for name in temp_files(root):
        os.utime(root / "tmp" / name, (two_hours_ago, two_hours_ago))
    store = await _store.open_store(rc.LocalWorkspace(ws))
    assert await store.prune() >= left_behind + len(unbacked)
    assert temp_files(root) == []
    assert index_rows(root) == entry_files(root)
    assert all(report.state == "found" for report in await store.verify())
    for tag, index in printed:
        value = loop_value(tag, index)
        read = await rc.response_compaction_read_exact(harness, ref_of(value), Exact)
        assert read == rc.Found(value=value)
    print(
        f"kill loop [{anyio_backend}]: {KILL_ROUNDS} rounds, {KILL_ROUNDS} SIGKILLs, "
        f"{len(printed)} refs checked, {left_behind} temp files left by kills before the sweep"
    )


async def test_processes_sharing_a_small_store(tmp_path: Path, anyio_backend: str) -> None:
    """Processes writing and reading under eviction never read Broken; the store stays bounded."""
    ws = tmp_path / "ws"
    seed_key(ws)
    reports: dict[int, dict[str, Any]] = {}

    async def worker(n: int) -> None:
        command = _child("share", ws, anyio_backend, n, WRITES_PER_WORKER, SHARED_MAX_ENTRIES)
        result = await anyio.run_process(command, cwd=REPO, check=False)
        assert result.returncode == 0, result.stderr.decode()
        reports[n] = json.loads(result.stdout)

    async with anyio.create_task_group() as tg:
        for n in range(WORKERS):
            tg.start_soon(worker, n)

    for report in reports.values():
        assert report["broken"] == 0, report["details"]
        assert report["wrong"] == 0
        assert report["writes"] == WRITES_PER_WORKER
        assert report["found"] + report["missing"] == 2 * WRITES_PER_WORKER
    root = store_root(ws)
    assert temp_files(root) == []
    assert len(index_rows(root)) <= SHARED_MAX_ENTRIES
    assert entry_files(root) == index_rows(root)

    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    last = share_value(0, 1)
    await compact(harness, last, max_entries=SHARED_MAX_ENTRIES)
    assert len(index_rows(root)) <= SHARED_MAX_ENTRIES
    assert entry_files(root) == index_rows(root)
    assert await rc.response_compaction_read_exact(harness, ref_of(last), Exact) == rc.Found(
        value=last
    )
    totals = {k: sum(r[k] for r in reports.values()) for k in ("writes", "found", "missing")}
    print(f"shared store [{anyio_backend}]: {WORKERS} processes, {totals}")


def test_children_are_deterministic() -> None:
    """The parent rebuilds exactly the values its children wrote (else every check is moot)."""
    assert loop_value("t", 5) == loop_value("t", 5)
    assert loop_value("t", 5) != loop_value("t", 6)
    assert share_value(1, 3) == share_value(2, 3)  # the shared pool really is shared
    assert share_value(1, 4) != share_value(2, 4)
    assert os.path.exists(REPO / "tests" / "_store_child.py")
