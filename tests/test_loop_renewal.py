"""A cache hit of a small value is renewed on the event loop thread, never waiting or syncing.

What the loop runs is seen through SQLite's own trace of the write connection, by thread; the
wal-index reader is checked against real SQLite logs and against planted files.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import response_compaction as rc
from response_compaction._store import _commit, _index
from response_compaction._store._wal import CHECKPOINT_FRAMES, appends_unsynced, open_wal_index
from tests._store_support import (
    compact,
    entry_path,
    hex_of,
    index_settings,
    loop_statements,
    open_index,
    ref_of,
    store_root,
    traced,
)
from tests.conftest import FakeClock
from tests.schemas import Exact, Row

A = Exact(rows=[Row(id=1, name="alpha")], total=1)
B = Exact(rows=[Row(id=2, name="beta")], total=1)


def _settings(harness: rc.Harness) -> tuple[object, ...]:
    with open_index(harness) as (_, index):
        return index_settings(index)


def _checkpoint_as_another_process(root: Path, mode: str) -> None:
    with contextlib.closing(sqlite3.connect(root / "index.sqlite3")) as other:
        busy, frames, copied = other.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
    assert busy == 0
    assert frames == copied  # every frame copied: the next commit starts the log afresh


pytestmark = pytest.mark.anyio


async def test_a_hit_commits_on_the_loop_unsynced_and_without_a_checkpoint(
    harness: rc.Harness, clock: FakeClock
) -> None:
    await compact(harness, A, ttl_seconds=100)
    clock.advance(60)
    with loop_statements(harness) as on_loop:
        again = await compact(harness, A, ttl_seconds=100)
    assert again.receipt.exact_cache == "reused"
    commit = on_loop.index("COMMIT")
    for setting in ("PRAGMA synchronous=NORMAL", "PRAGMA wal_autocheckpoint = 0"):
        assert on_loop.index(setting) < commit
    assert _settings(harness) == (2, 20, CHECKPOINT_FRAMES)  # FULL, BUSY_MS, the default again
    clock.advance(60)  # past the first expiry, before the renewed one
    found = await rc.response_compaction_read_exact(harness, ref_of(A), Exact)
    assert found == rc.Found(value=A)


async def test_a_value_with_no_file_in_place_is_known_new_without_the_index(
    harness: rc.Harness,
) -> None:
    """No file where the entry would be: nothing to renew, and the loop asks the index nothing."""
    await compact(harness, A)
    with loop_statements(harness) as on_loop:
        assert (await compact(harness, B)).receipt.exact_cache == "stored"
    assert on_loop == []
    entry_path(store_root(harness.fs), hex_of(A)).unlink()  # its row still live
    with loop_statements(harness) as on_loop:
        again = await compact(harness, A)
    assert on_loop == []
    assert again.receipt.exact_cache == "reused"  # written afresh, its row was live
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)


async def test_the_loop_looks_for_a_new_values_file_only_within_the_checked_tree(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's ``stat`` of where an entry would be runs once the store's tree is open and
    checked current, relative to it: not at all before the tree is open, and by two names, not
    the store's whole path. (The tree's own check still ``lstat``s the root by its path.)"""
    loop, seen, real = threading.get_ident(), [], os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if threading.get_ident() == loop:
            seen.append((os.fspath(path), kwargs.get("dir_fd")))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    await compact(harness, A)  # a fresh store: no tree open before this put's worker
    assert not [path for path, _ in seen if hex_of(A) in str(path)]
    assert (await compact(harness, B)).receipt.exact_cache == "stored"
    looked = [(path, fd) for path, fd in seen if hex_of(B) in str(path)]
    assert looked
    assert all(fd is not None and not os.path.isabs(path) for path, fd in looked)


@pytest.mark.parametrize("mode", ["PASSIVE", "TRUNCATE"])
async def test_a_hit_after_a_full_checkpoint_commits_in_a_worker(
    harness: rc.Harness, mode: str
) -> None:
    """The first commit after a checkpoint restarts the log and syncs its header: not here."""
    await compact(harness, A)
    root = store_root(harness.fs)
    _checkpoint_as_another_process(root, mode)
    with loop_statements(harness) as on_loop:
        assert (await compact(harness, A)).receipt.exact_cache == "reused"
    assert "COMMIT" not in on_loop
    with loop_statements(harness) as on_loop:  # that worker's commit started the log anew
        assert (await compact(harness, A)).receipt.exact_cache == "reused"
    assert "COMMIT" in on_loop


async def test_a_hit_with_rows_to_evict_leaves_them_to_a_worker(
    harness: rc.Harness, clock: FakeClock
) -> None:
    await compact(harness, B, ttl_seconds=10)
    await compact(harness, A, ttl_seconds=100)
    root = store_root(harness.fs)
    clock.advance(50)  # B expired
    with loop_statements(harness) as on_loop:
        assert (await compact(harness, A, ttl_seconds=100)).receipt.exact_cache == "reused"
    assert "COMMIT" not in on_loop
    assert not entry_path(root, hex_of(B)).exists()
    assert await rc.response_compaction_read_exact(harness, ref_of(B), Exact) == rc.Missing()


async def test_a_hit_with_many_uses_waiting_leaves_them_to_a_worker(harness: rc.Harness) -> None:
    """Writing a batch of uses is a larger commit: the worker's, which writes every one."""
    await compact(harness, A)
    with open_index(harness) as (_, index):
        for i in range(40):
            index.record_use("exact", f"{i:064x}", 1.0)
        with loop_statements(harness) as on_loop:
            assert (await compact(harness, A)).receipt.exact_cache == "reused"
        assert "COMMIT" not in on_loop
        assert not index._pending


def _row_of_a(index: _index.Index, clock: FakeClock) -> _index.Row:
    row = index.lookup("exact", hex_of(A), clock())
    assert row is not None
    return row


@contextlib.asynccontextmanager
async def _a_stored(
    harness: rc.Harness, clock: FakeClock
) -> AsyncIterator[tuple[Path, _index.Index, _index.Row]]:
    """``A`` compacted; the store's root, its index and ``A``'s row."""
    await compact(harness, A)
    with open_index(harness) as (root, index):
        yield root, index, _row_of_a(index, clock)


async def test_a_renewal_on_the_loop_never_waits_for_another_process(
    harness: rc.Harness, clock: FakeClock
) -> None:
    async with _a_stored(harness, clock) as (root, index, row):
        statements: list[str] = []
        with contextlib.closing(sqlite3.connect(root / "index.sqlite3", timeout=0)) as other:
            other.execute("BEGIN IMMEDIATE")
            with traced(index, statements.append):
                renewed = _commit.renew_on_loop(index, "exact", hex_of(A), row, clock(), 100)
            other.execute("ROLLBACK")
        assert renewed is None
        # SQLite's busy handler was off (no timing in a test: what it was asked to do).
        begin = statements.index("BEGIN IMMEDIATE")
        assert statements[:begin].count("PRAGMA busy_timeout = 0") == 1
        assert _row_of_a(index, clock) == row  # nothing written
    assert _settings(harness) == (2, 20, CHECKPOINT_FRAMES)


def _delete_then_fail(index: _index.Index, key: str) -> None:
    with index.transaction(on_loop=True) as tx:
        tx.delete("exact", key)
        raise KeyError("injected")


async def test_a_failure_inside_a_transaction_on_the_loop_leaves_the_index_as_it_was(
    harness: rc.Harness, clock: FakeClock
) -> None:
    async with _a_stored(harness, clock) as (root, index, before):
        with pytest.raises(KeyError):
            _delete_then_fail(index, hex_of(A))
        assert not index._conn.in_transaction
        assert _row_of_a(index, clock) == before  # rolled back
        with index.transaction():  # the lock was let go
            pass
    assert _settings(harness) == (2, 20, CHECKPOINT_FRAMES)
    with contextlib.closing(sqlite3.connect(root / "index.sqlite3", timeout=0)) as other:
        other.execute("BEGIN IMMEDIATE")  # SQLite's write lock is free too
        other.execute("ROLLBACK")


def _frames(shm: Path) -> tuple[int, int]:
    raw = shm.read_bytes()
    return int.from_bytes(raw[16:20], sys.byteorder), int.from_bytes(raw[96:100], sys.byteorder)


def test_the_wal_index_says_when_a_commit_appends_without_a_sync(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("CREATE TABLE t (a)")
        fd = open_wal_index(f"{path}-shm")
        assert fd is not None
        try:
            assert appends_unsynced(fd)  # frames not yet copied
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            assert _frames(Path(f"{path}-shm"))[1] > 0
            assert not appends_unsynced(fd)  # all copied: the next commit restarts the log
            conn.execute("INSERT INTO t VALUES (1)")
            assert appends_unsynced(fd)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert not appends_unsynced(fd)  # empty: the next commit writes the header
            while _frames(Path(f"{path}-shm"))[0] < CHECKPOINT_FRAMES:
                conn.execute("INSERT INTO t VALUES (?)", (b"x" * 3000,))
            assert not appends_unsynced(fd)  # due for a checkpoint: a worker's commit makes it
        finally:
            os.close(fd)


@pytest.mark.parametrize(
    "damage", ["torn", "not initialised", "short", "empty"], ids=lambda damage: damage
)
def test_a_damaged_wal_index_never_says_a_commit_is_unsynced(tmp_path: Path, damage: str) -> None:
    good = bytearray(136)
    for copy in (0, 48):
        good[copy + 12] = 1  # isInit
        good[copy + 16 : copy + 20] = (5).to_bytes(4, sys.byteorder)  # mxFrame
    planted = tmp_path / "index.sqlite3-shm"
    planted.write_bytes(good)
    fd = open_wal_index(str(planted))
    assert fd is not None
    try:
        assert appends_unsynced(fd)  # 0 of 5 frames copied
        bad = {
            "torn": good[:20] + b"\x06" + good[21:],
            "not initialised": good[:12] + b"\x00" + good[13:60] + b"\x00" + good[61:],
            "short": good[:99],
            "empty": bytearray(),
        }[damage]
        planted.write_bytes(bad)
        assert not appends_unsynced(fd)
    finally:
        os.close(fd)


def test_only_a_regular_file_is_read_as_the_wal_index(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # would block a plain open for reading
    (tmp_path / "target").write_bytes(bytes(136))
    (tmp_path / "link").symlink_to(tmp_path / "target")
    for name in ("fifo", "link", "absent"):
        assert open_wal_index(str(tmp_path / name)) is None
    assert not appends_unsynced(None)
