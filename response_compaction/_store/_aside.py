"""Work run beside a disk wait, in a helper thread of this process.

An fsync is a wait for the disk, not work: while it runs, the thread that asked can go on with
whatever does not depend on it. A small put has three (the temp file, the fan-out directory
after the rename, the index's WAL at COMMIT); run one after another they were most of its
time. The order that makes a value durable is kept: the file's fsync ends before its rename
(a name made durable before its bytes could survive a crash as an empty file), and no receipt
is handed until every fsync has returned. What may overlap is only what does not depend on it:
the read-back checks beside the file's fsync, the directory's fsync beside the index's COMMIT
(or, for an entry named by its digest, the COMMIT beside the file's fsync: ``_commit``).

Whichever of the two needs the GIL goes to the helper: a helper thread waits for the GIL while
the caller runs Python, so an fsync handed to it started 140 us late (median) while the caller
verified; the caller's own fsync starts at once and leaves the GIL to the helper's checks.
The exception is the row committed beside a file's fsync (``_commit.publish_recorded``): the
row's statements release the GIL around each step, and run where their lock is used, so the
fsync goes to the helper (it starts 30-54 us after the call, p10-p50). A
failure in the helper is raised by :meth:`Aside.wait`, so a failure to retain still fails the
call.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec
import msgspec.structs

__all__ = [
    "EXIT_WAIT_SECONDS",
    "MAX_THREADS",
    "Aside",
    "begun",
    "free_in_slices",
    "fsync",
    "in_list",
    "let_go",
]

T = TypeVar("T")

#: Helper threads at most (each runs one task at a time; they exit with the interpreter).
MAX_THREADS = 4
#: How long the exit handler waits for the helpers' queued jobs, all told.
EXIT_WAIT_SECONDS = 10.0

_lock = threading.Lock()


def _forget_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # it may have been held by a thread that does not exist here
    _helpers.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def fsync(fd: int) -> None:
    """``os.fsync(fd)``, looked up per call: tests record fsyncs by replacing ``os.fsync``."""
    os.fsync(fd)


class _Helpers:
    """Up to ``limit`` daemon threads of one pool, taking :class:`Aside` jobs from a queue.

    Not a ``ThreadPoolExecutor``: its future and its bookkeeping (conditions made, set and
    notified, an idle semaphore released) cost the caller 15-18 us to start a job (here 8 us)
    and kept the helper running Python after the job was done, while the waiter, woken, waited
    for the GIL: a round trip took 67-72 us (here 59-61 us). A 2 KB put starts two jobs; in
    alternating runs its minimum fell by about 100 us on asyncio and 40 us on trio. A helper
    here releases the job's lock, counts itself idle and blocks on the queue.
    """

    __slots__ = ("_idle", "_jobs", "_limit", "_name", "_threads", "pid")

    def __init__(self, name: str, limit: int) -> None:
        self.pid = os.getpid()
        self._name = f"response-compaction-{name}"
        self._limit = limit
        self._jobs: queue.SimpleQueue[Aside[Any] | None] = queue.SimpleQueue()
        self._idle = 0  # threads done with their job and not yet handed another
        self._threads: list[threading.Thread] = []

    def submit(self, job: Aside[Any]) -> None:
        """Queue ``job``; start a thread unless one is idle (or ``limit`` are running).

        An idle thread counted here is handed this job's turn: a thread that instead takes a
        job queued earlier (while all were busy) leaves the count one high, which only ever
        happens once no more threads may start. ``RuntimeError`` once stopped (at exit).
        """
        with _lock:
            if _stopped:
                raise RuntimeError("response_compaction's helper threads have stopped")
            self._jobs.put(job)
            if self._idle:
                self._idle -= 1
                return
            if len(self._threads) >= self._limit:
                return
            thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._threads.append(thread)
        try:
            thread.start()
        except BaseException:
            with _lock:
                self._threads.remove(thread)
            raise  # RuntimeError: the caller runs the job itself (see Aside)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            job._run()
            del job  # while this thread waits for the next job, the last one's value is freed
            with _lock:
                self._idle += 1

    def stop(self) -> list[threading.Thread]:
        """Let each thread end once the jobs queued before have run (called under ``_lock``)."""
        for _ in self._threads:
            self._jobs.put(None)
        return self._threads


#: Per pool name, this process's helpers (a forked child has none of its parent's threads).
_helpers: dict[str, _Helpers] = {}
_stopped = False


@atexit.register
def _stop_helpers() -> None:
    """At interpreter exit, end every helper thread, as ``concurrent.futures`` ends its own.

    The threads are daemons, so ``threading``'s shutdown does not wait for them before the
    exit handlers run (they would wait for jobs forever); here they finish what was queued and
    end, so nothing of ours is left running. An :class:`Aside` made after this runs in its
    caller. Registered at import: it runs after the handlers of anything imported later, such
    as ``sync``'s, which may still store something. A thread stuck longer than
    ``EXIT_WAIT_SECONDS`` in a disk wait (a hung network file system) is left to end with the
    interpreter: whoever waited for its job has returned or is failing, and no receipt was
    handed for it; waiting on held the process open forever. (A ``sync`` call still in flight
    at exit waits for its own jobs first, without this bound.)
    """
    global _stopped
    with _lock:
        _stopped = True
        threads = [t for helpers in _helpers.values() if helpers.pid == os.getpid()
                   for t in helpers.stop()]  # fmt: skip
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    for thread in threads:
        with contextlib.suppress(RuntimeError):  # not started yet: it ends on its own None
            thread.join(max(0.0, deadline - time.monotonic()))


def _helpers_of(name: str, limit: int) -> _Helpers:
    held = _helpers.get(name)
    if held is None or held.pid != os.getpid():
        with _lock:
            held = _helpers.get(name)
            if held is None or held.pid != os.getpid():
                held = _helpers[name] = _Helpers(name, limit)
    return held


class Aside(Generic[T]):
    """``fn(*args)`` started now in a helper thread of pool ``pool``; :meth:`wait` for it.

    Run at most once, by whoever claims it first: when no helper can be had (the interpreter
    is shutting down, or a thread cannot be started after the job was queued) the caller runs
    it; a queued copy that a helper picks up later then does nothing. ``begun=True`` returns
    only once it is under way (see :func:`begun`). Pools with different names never wait on
    each other's jobs (``_temp``'s syncers only fsync and close, so they are never queued
    behind checks waiting for the index's lock). ``then()``, which must not raise, is called by
    whoever ran ``fn`` once it has returned: how a task waiting for it is woken (``_hop``). A
    pool's first job sets how many threads it may have (``limit``).
    """

    __slots__ = (
        "_args", "_claim", "_done", "_error", "_finished", "_fn", "_started", "_then", "_value",
    )  # fmt: skip

    def __init__(
        self,
        fn: Callable[..., T],
        *args: Any,
        pool: str = "aside",
        begun: bool = False,
        then: Callable[[], object] | None = None,
        limit: int = MAX_THREADS,
    ) -> None:
        self._fn, self._args, self._then = fn, args, then
        self._claim = threading.Lock()
        # Bare locks, held until the job has begun / returned: an Event is a Condition, and
        # each wait on one makes a lock of its own.
        self._done = threading.Lock()
        self._done.acquire()
        self._started = threading.Lock() if begun else None
        if self._started is not None:
            self._started.acquire()
        self._error: BaseException | None = None
        self._finished = False  # set before _done is released: done() never takes the lock
        try:
            _helpers_of(pool, limit).submit(self)
        except RuntimeError:  # shutting down, or "can't start new thread" (maybe queued)
            self._run()
        if self._started is not None:
            self._started.acquire()

    def _run(self) -> None:
        if not self._claim.acquire(blocking=False):
            return  # the other copy (queued, or run by the caller) has it
        if self._started is not None:
            self._started.release()
        try:
            self._value = self._fn(*self._args)
        except BaseException as exc:  # handed to whoever waits
            self._error = exc
        finally:
            # A copy left in the queue, or a helper between jobs, holds this object: not its
            # arguments (a read's whole buffer, say) too, nor the object a bound method is of
            # (one that holds this job would otherwise wait for the cyclic GC).
            self._fn, self._args = _ran, ()
            self._finished = True
            self._done.release()
            then, self._then = self._then, None
            if then is not None:
                then()

    def done(self) -> bool:
        """Whether ``fn`` has returned (or raised) by now."""
        return self._finished

    def wait(self) -> T:
        """``fn``'s result once it has returned; raises what it raised."""
        self.join()
        if self._error is not None:
            raise self._error
        return self._value

    def take(self) -> T:
        """:meth:`wait`, the job then holding nothing of the result: for a value handed on.

        The thread that ran the job still holds it for a moment after ``then()`` woke the
        waiter; if the job kept the value, that thread could drop its last reference and free
        a large value there, not where its caller chose (``_medium.let_go``).
        """
        try:
            return self.wait()
        finally:
            self._value = None  # type: ignore[assignment]

    def join(self) -> None:
        """Return once ``fn`` has, whatever it did (for a caller already failing)."""
        if not self._finished:
            with self._done:  # released by _run, and at once again here for any other waiter
                pass


def _ran(*args: Any) -> Any:
    """What a job's function is once it has run (never called again: the claim is taken)."""


def begun(name: str, fn: Callable[[], T]) -> Aside[T]:
    """``fn()`` in a thread of pool ``name``, returned once that thread has begun it.

    For work that must be under way before the caller holds the GIL for long (a decode): a
    thread woken later waits for the GIL until the decode is over.
    """
    return Aside(fn, pool=name, begun=True)


def let_go(values: list[Any]) -> None:
    """Free the items of ``values`` (emptied here) in a helper thread, off the caller's path.

    Freeing a decoded tree nobody wants (the read-back of a verified value) takes about a
    fifth as long as its decode (0.5 ms for 1 MB of short strings or rows): work that need not
    delay the receipt. The items move out of the caller's list, so the job holds the only
    references the caller had, and they die in the helper, a slice at a time (see
    :func:`free_in_slices`). Where no helper can be had, they are freed here.
    """
    job = values.copy()
    values.clear()
    Aside(free_in_slices, job, pool="drop")  # nobody waits for it


def in_list(fn: Callable[..., T], *args: Any) -> list[T]:
    """``[fn(*args)]``, for :func:`let_go` to empty.

    A worker thread's last reference to its result is then to the list, so the value cannot
    die in that thread (or on the loop's) whenever it lets go of its result: it dies in the
    helper (a value returned bare died in the worker thread in 2 of 6 test runs).
    """
    return [fn(*args)]


#: Items of one list or dict freed at a time by :func:`free_in_slices`, then a pause.
SLICE_ITEMS = 1024
#: The pause: long enough for a thread waiting for the GIL to wake and take it.
SLICE_PAUSE = 100e-6


def free_in_slices(stack: list[Any], pause: Callable[[float], None] = time.sleep) -> None:
    """Free everything on ``stack`` (emptied), pausing between slices.

    Freeing a tree is one C call that holds the GIL until the last object is gone: a helper
    freeing 1 MB of strings beside the caller's return held the event loop's thread for the
    whole 0.5 ms (1 MB compaction of strings: 1.19x the floor, against 1.12x for the same call
    returning the value). Here a struct is taken apart into its fields and a large list or dict
    is emptied ``SLICE_ITEMS`` at a time, with a ``pause`` between slices in which a waiting
    thread takes the GIL. Only those are split, and a list or dict only when nothing else holds
    it (a ``default_factory`` or a decode hook may hand out a container the caller keeps: it is
    let go of, never emptied); anything else, and every smaller container, dies whole.
    """
    while stack:
        node = stack.pop()
        if isinstance(node, msgspec.Struct):
            stack.extend(msgspec.structs.astuple(node))  # the fields, read without user code
        elif type(node) in _SPLIT and sys.getrefcount(node) <= _ONLY_OURS:
            while len(node) > SLICE_ITEMS:
                if type(node) is list:
                    del node[-SLICE_ITEMS:]
                else:
                    for _ in range(SLICE_ITEMS):
                        node.popitem()
                pause(SLICE_PAUSE)
        del node  # what is left of it dies here
        pause(SLICE_PAUSE)


#: Exact types only: a subclass's ``__delitem__`` or ``popitem`` is code of the caller's.
_SPLIT = (list, dict)


def _refs_of_a_local() -> int:
    """``sys.getrefcount`` of a list held by one local name alone, as this interpreter counts.

    2 up to 3.13 (the name, the call's argument); 3.14 may borrow the argument's reference.
    """
    held: list[Any] = []
    return sys.getrefcount(held)


#: What ``sys.getrefcount`` says of a container ``free_in_slices`` alone holds.
_ONLY_OURS = _refs_of_a_local()
