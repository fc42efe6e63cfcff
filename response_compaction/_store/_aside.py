"""Work run beside a disk wait, in a helper thread of this process.

An fsync is a wait for the disk, not work: while it runs, the thread that asked can go on with
whatever does not depend on it. A small put has three (the temp file, the fan-out directory
after the rename, the index's WAL at COMMIT); run one after another they were most of its
time. The order that makes a value durable is kept: the file's fsync ends before its rename
(a name made durable before its bytes could survive a crash as an empty file), and no receipt
is handed until every fsync has returned. What may overlap is only what does not depend on it:
the read-back checks beside the file's fsync, the directory's fsync beside the index's COMMIT.

Whichever of the two needs the GIL goes to the helper: a helper thread waits for the GIL while
the caller runs Python, so an fsync handed to it started 140 us late (median) while the caller
verified; the caller's own fsync starts at once and leaves the GIL to the helper's checks. A
failure in the helper is raised by :meth:`Aside.wait`, so a failure to retain still fails the
call.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["MAX_THREADS", "Aside", "begun", "executor", "fsync"]

T = TypeVar("T")

#: Helper threads at most (each runs one task at a time; they exit with the interpreter).
MAX_THREADS = 4

#: Per process and name: (pid, pool). A forked child has none of its parent's threads.
_pools: dict[str, tuple[int, concurrent.futures.ThreadPoolExecutor]] = {}
_lock = threading.Lock()


def executor(name: str = "aside") -> concurrent.futures.ThreadPoolExecutor:
    """The pool of ``MAX_THREADS`` helper threads called ``name`` in this process.

    Pools with different names never wait on each other's jobs: ``_medium``'s syncers only
    fsync and close, so they are never queued behind checks waiting for the index's lock.
    """
    held = _pools.get(name)
    if held is None or held[0] != os.getpid():
        with _lock:
            held = _pools.get(name)
            if held is None or held[0] != os.getpid():
                pool = concurrent.futures.ThreadPoolExecutor(
                    MAX_THREADS, thread_name_prefix=f"response-compaction-{name}"
                )
                held = _pools[name] = (os.getpid(), pool)
    return held[1]


def _forget_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # it may have been held by a thread that does not exist here
    _pools.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def begun(name: str, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
    """``fn()`` in a thread of pool ``name``, returned once that thread has begun it.

    For work that must be under way before the caller holds the GIL for long (a decode): a
    thread woken later waits for the GIL until the decode is over. ``RuntimeError`` once the
    interpreter is shutting down (no new threads): the caller does the work itself.
    """
    began = threading.Event()

    def job() -> T:
        began.set()
        return fn()

    future = executor(name).submit(job)
    began.wait()
    return future


def fsync(fd: int) -> None:
    """``os.fsync(fd)``, looked up per call: tests record fsyncs by replacing ``os.fsync``."""
    os.fsync(fd)


class Aside(Generic[T]):
    """``fn(*args)`` started now in a helper thread; :meth:`wait` for its result.

    Runs in the calling thread when no helper can be had (the interpreter is shutting down).
    """

    __slots__ = ("_future", "_value")

    def __init__(self, fn: Callable[..., T], *args: Any) -> None:
        self._future: concurrent.futures.Future[T] | None
        try:
            self._future = executor().submit(fn, *args)
        except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
            self._future = None
            self._value = fn(*args)

    def wait(self) -> T:
        """``fn``'s result once it has returned; raises what it raised."""
        if self._future is None:
            return self._value
        return self._future.result()

    def join(self) -> None:
        """Return once ``fn`` has, whatever it did (for a caller already failing)."""
        if self._future is not None:
            concurrent.futures.wait((self._future,))
