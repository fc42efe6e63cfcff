"""The process's table of open indexes never holds its lock across a disk's or a lock's wait.

The event loop thread takes that lock to release what its inline reads acquired: a worker
opening an index (SQLite may wait ``BUSY_MS`` for another process) or closing one (a
checkpoint: a write and an fsync) under it made the loop wait too. Opens are seen through the
interpreter's own profile hook, in the thread that does the work; closes, which a helper thread
runs now (off the releasing call's path), through a wrapper of ``Index.close``.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from response_compaction._store import _index, _indexes, _sqlite
from response_compaction._store._paths import prepare_root


@contextmanager
def _lock_held_at() -> Iterator[dict[str, list[bool]]]:
    """Whether the table's lock was held each time this thread opened an index."""
    seen: dict[str, list[bool]] = {"open": []}

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and arg is sqlite3.connect:
            seen["open"].append(_indexes._lock.locked())

    sys.setprofile(hook)
    try:
        yield seen
    finally:
        sys.setprofile(None)


class _Closes:
    """Each index close as (run by the test's thread, the table's lock held), in order run.

    A close in a helper waits until the ``_closes`` block is over, and the test then waits
    for it with :meth:`wait`, which takes no lock: a lock seen held is the closer's own.
    """

    def __init__(self) -> None:
        self.seen: list[tuple[bool, bool]] = []
        self.gate, self.done = threading.Event(), threading.Semaphore(0)
        self.here, self.close = threading.get_ident(), _index.Index.close

    def gated(self, index: _index.Index) -> None:
        if threading.get_ident() != self.here:
            self.gate.wait(timeout=10)
        self.seen.append((threading.get_ident() == self.here, _indexes._lock.locked()))
        self.close(index)
        self.done.release()

    def wait(self, count: int) -> None:
        for _ in range(count):
            assert self.done.acquire(timeout=10)


@contextmanager
def _closes(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Closes]:
    closes = _Closes()

    def close(index: _index.Index) -> None:
        closes.gated(index)

    monkeypatch.setattr(_index.Index, "close", close)
    try:
        yield closes
    finally:
        closes.gate.set()


def _closed(index: _index.Index) -> bool:
    try:
        index.counts(0.0)
    except sqlite3.ProgrammingError:
        return True
    return False


@pytest.fixture
def roots(tmp_path: Path) -> Iterator[list[str]]:
    _indexes.close_all()
    yield [prepare_root(str(tmp_path / f"ws{n}")) for n in range(_indexes.MAX_IDLE_INDEXES + 2)]
    _indexes.close_all()


def test_an_index_opens_and_idle_ones_close_outside_the_lock(
    roots: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened by the acquiring thread outside the lock; closed by a helper, outside it too."""
    with _lock_held_at() as seen, _closes(monkeypatch) as closes:
        held = [_indexes.acquire(root) for root in roots]
        for index in held:
            _indexes.release(index)  # the last ones close the first, idle beyond the cap
    assert seen["open"]
    assert not any(seen["open"])
    closes.wait(2)
    assert closes.seen == [(False, False)] * 2
    assert _closed(held[0])
    assert not _closed(held[-1])


def test_the_loop_leaves_a_retired_index_to_the_next_worker_to_close(
    roots: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's release of the last use of an index whose file was replaced closes nothing
    (a checkpoint on the loop); the next release in a worker has a helper close it, outside
    the lock."""
    stale = _indexes.acquire(roots[0])  # a read on the loop holds it
    Path(stale.path).unlink()  # replaced (e.g. by a prune --broken of the index, or by hand)
    fresh = _indexes.acquire(roots[0])  # a worker opens the new one, retiring the old
    assert fresh is not stale
    with _closes(monkeypatch) as closes:
        _indexes.release(stale, close_idle=False)
        _indexes.wait_for_closes()
        assert closes.seen == []
        assert not _closed(stale)
        _indexes.release(fresh)
    closes.wait(1)
    assert closes.seen == [(False, False)]
    assert _closed(stale)
    assert not _closed(fresh)


def test_an_index_opened_twice_at_once_keeps_one(roots: list[str]) -> None:
    """Two acquires that both found no index open one each: the second to record its own
    closes it and shares the first's."""
    first: list[_index.Index] = []
    held: list[bool] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and arg is sqlite3.connect and not held:
            sys.setprofile(None)
            held.append(_indexes._lock.locked())
            if not held[0]:  # (held, this acquire would wait for itself)
                first.append(_indexes.acquire(roots[0]))  # in between this one's two looks

    sys.setprofile(hook)
    try:
        second = _indexes.acquire(roots[0])
    finally:
        sys.setprofile(None)
    assert held == [False]
    assert second is first[0]
    _indexes.release(second)
    _indexes.release(first[0])
    assert not _closed(second)


def test_a_log_removed_while_the_index_opens_is_no_hard_link(roots: list[str]) -> None:
    """Opening and closing run at once now: the last other connection's close removes the
    -wal and -shm, which may happen between the open's look at a file and its ``fstat``
    (a link count of 0). SQLite makes them anew; it is not a hard link to refuse."""
    wal = Path(roots[0]) / "index.sqlite3-wal"
    wal.touch(mode=0o600)  # an empty log, as a closing connection may leave it for a moment
    fstats: list[int] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and arg is os.fstat and frame.f_code is _sqlite.own_files.__code__:
            fstats.append(1)
            if len(fstats) == 2:  # the -wal's: the index's own came first
                wal.unlink()

    sys.setprofile(hook)
    try:
        index = _indexes.acquire(roots[0])
    finally:
        sys.setprofile(None)
    assert len(fstats) >= 2
    assert index.counts(0.0) == {}
    _indexes.release(index)
