"""The indexes open in this process: one :class:`~._index.Index` per root, shared.

Pair every :func:`acquire` (or :func:`acquire_now`) with :func:`release`: an index in use is
never closed, and at most ``MAX_IDLE_INDEXES`` idle ones stay open.

The lock guards the table and nothing else. Opening an index (SQLite, its schema, up to
``BUSY_MS`` of waiting for another process's lock) and closing one (a checkpoint: a write and
an fsync) happen outside it: the event loop thread takes it too, to release what its inline
reads and renewals acquired, and must never wait for a disk or another process behind it.
Nor does the loop close anything itself: what its release would close is left to the next
release or acquire of a worker thread, and that hands it to a helper thread (``_close``).
"""

from __future__ import annotations

import collections
import contextlib
import os
import sqlite3
import threading

from ._aside import Aside
from ._index import Index
from ._paths import PROCESS, Kind

__all__ = [
    "MAX_IDLE_INDEXES",
    "acquire",
    "acquire_now",
    "close_all",
    "note_use",
    "release",
    "wait_for_closes",
]

MAX_IDLE_INDEXES = 8


class _Slot:
    __slots__ = ("index", "users")

    def __init__(self, index: Index) -> None:
        self.index = index
        self.users = 0


# Insertion order is recency. Keyed by pid too: a forked child opens its own.
_open: collections.OrderedDict[tuple[int, str], _Slot] = collections.OrderedDict()
# Indexes whose file was removed or replaced, still in use: closed when their last user leaves.
_retired: dict[int, _Slot] = {}
# Retired indexes whose last user was the event loop thread: the next worker closes them.
_unclosed: list[Index] = []
# Closes under way in a helper thread (see _close), for close_all to wait for.
_closing: set[Aside[None]] = set()
_lock = threading.Lock()


def _forget_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # it may have been held by a thread that does not exist here
    _closing.clear()  # the parent's helpers: none of them runs here


os.register_at_fork(after_in_child=_forget_lock_in_child)


def acquire(root: str) -> Index:
    """The shared index of ``root``, opened if needed (blocking; a worker thread's call).

    An index whose file was removed or replaced since it was opened is retired and a fresh
    one opened, so a process never goes on writing to an orphan.
    """
    key = (PROCESS.pid, root)
    closing: list[Index] = []
    try:
        with _lock:
            closing.extend(_take_unclosed())
            index = _use(key, closing)
        if index is not None:
            return index
        fresh = Index(root)  # outside the lock: it may wait for another process's lock
        with _lock:
            index = _use(key, closing)
            if index is None:  # nobody opened it meanwhile: ours is the one
                slot = _open[key] = _Slot(fresh)
                slot.users += 1
                return fresh
        closing.append(fresh)  # another thread's won
        return index
    finally:
        _close(closing)


def _use(key: tuple[int, str], closing: list[Index]) -> Index | None:
    """The open, current index of ``key`` with one more user, or None (a stale one retired)."""
    slot = _open.get(key)
    if slot is not None and not slot.index.is_current():
        del _open[key]
        _retire(slot, closing)
        slot = None
    if slot is None:
        return None
    _open.move_to_end(key)
    slot.users += 1
    return slot.index


def acquire_now(root: str) -> Index | None:
    """Like :func:`acquire`, but never opens: the index if already open and current.

    For the event loop thread (small reads inline); None means "take a worker thread".
    """
    if not _lock.acquire(blocking=False):
        return None  # held for a moment only, but the loop has somewhere else to go
    try:
        slot = _open.get((PROCESS.pid, root))
        if slot is None or not slot.index.is_current():
            return None
        slot.users += 1
        return slot.index
    finally:
        _lock.release()


def _retire(slot: _Slot, closing: list[Index]) -> None:
    if slot.users == 0:
        closing.append(slot.index)
    else:
        _retired[id(slot.index)] = slot


def release(index: Index, *, close_idle: bool = True) -> None:
    """Let go of ``index``; close the least recently used idle ones beyond the cache size.

    ``close_idle=False`` (on the event loop thread) closes nothing: the idle ones are left
    to the next release, and a retired index whose last user this was to the next worker.
    """
    closing: list[Index] = []
    with _lock:
        slot = _open.get((PROCESS.pid, index.root))
        if slot is not None and slot.index is index:
            slot.users -= 1
        elif (retired := _retired.get(id(index))) is not None:
            retired.users -= 1
            if retired.users == 0:
                del _retired[id(index)]
                closing.append(index)
        if not close_idle:
            _unclosed.extend(closing)
            return  # every read on the loop ends here
        closing.extend(_take_unclosed())
        if len(_open) > MAX_IDLE_INDEXES:
            idle = [key for key, slot in _open.items() if slot.users == 0]
            surplus = idle[: max(0, len(idle) - MAX_IDLE_INDEXES)]
            closing.extend(_open.pop(key).index for key in surplus)
    _close(closing)


def note_use(index: Index, kind: Kind, key: str, now: float) -> None:
    """A read's use of ``key`` noted; a batch of uses that is due is written in a helper.

    Batched: a commit (and its WAL fsync) per read cost ten times the read itself. The batch
    due once a second is written in a commit that does not sync the WAL (a crash may lose it,
    which only changes the eviction order; the next durable commit of any connection syncs
    it too), and off the read's path: on it, it was a write transaction and a commit (1 MB of
    short strings read 1.05 s apart: 4.5 ms against a 3.8 ms floor; read back to back,
    3.7-4.4 ms). For a read holding ``index``, on any thread: the helper holds the index
    until it is done; :func:`close_all` waits for it. Nothing here waits: with the table's
    lock busy this instant the uses are left for the next write, as a busy write lock
    leaves them.
    """
    index.record_use(kind, key, now)
    if not index.take_flush() or not _lock.acquire(blocking=False):
        return
    try:
        slot = _open.get((PROCESS.pid, index.root))
        if slot is None or slot.index is not index:
            return  # retired: closing it will not write them either (best-effort)
        slot.users += 1
    finally:
        _lock.release()
    flushing = Aside(_flush_and_release, index, now, pool="close")
    with _lock:
        _closing.difference_update([c for c in _closing if c.done()])  # a few at most
        if not flushing.done():
            _closing.add(flushing)


def _flush_and_release(index: Index, now: float) -> None:
    try:
        index.flush_uses(now)
    finally:
        release(index)


def _take_unclosed() -> list[Index]:
    if not _unclosed:
        return []  # nearly always: no copy on every worker's acquire and release
    taken = _unclosed[:]
    _unclosed.clear()
    return taken


def _close(indexes: list[Index]) -> None:
    """Close ``indexes`` in a helper thread: off the path of the call that let them go.

    Closing an index checkpoints its WAL (a write and an fsync, about 1 ms here): with more
    stores in use than ``MAX_IDLE_INDEXES``, every put paid for closing another store's.
    Nobody can reach these any more (out of the table, no user left).
    """
    if not indexes:
        return
    closing = Aside(_close_now, indexes, pool="close")  # run here if no helper can be had
    with _lock:
        _closing.difference_update([c for c in _closing if c.done()])  # a few at most
        if not closing.done():
            _closing.add(closing)


def _close_now(indexes: list[Index]) -> None:
    for index in indexes:
        # Best effort, as a garbage-collected connection would be: it is gone either way,
        # and the caller's own operation (which may have succeeded) is not this close's.
        with contextlib.suppress(sqlite3.Error, OSError):
            index.close()


def close_all() -> None:
    """Close every idle index of this process (tests, and hosts that want their fds back).

    Returns once they are closed, those let go earlier (closed in a helper) included.
    """
    wait_for_closes()  # a batch of uses being written holds its index: idle once written
    with _lock:
        idle = [key for key, slot in _open.items() if slot.users == 0]
        closing = [_open.pop(key).index for key in idle] + _take_unclosed()
    _close_now(closing)
    wait_for_closes()


def wait_for_closes() -> None:
    """Return once every close (and batch of uses) handed to a helper so far is over."""
    with _lock:
        pending = list(_closing)
    for closing in pending:
        closing.join()
