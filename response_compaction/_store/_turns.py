"""Per-event-loop turns: CPU work on the loop, and this process's writers of one index.

Many compactions at once on one loop (a task group of 32) each encode pieces on the loop
thread. Every ready task runs its step before the loop looks at its timers again, so 32 steps
of a few milliseconds froze a 1 ms heartbeat for 150-400 ms. Taking turns for the CPU-bound
steps keeps one of them ready at a time; the I/O between them still overlaps.

Writers of one index in this process queue on an event-loop lock instead of each holding a
worker thread while it polls SQLite's lock (the retry loop stays, for other processes).

And each loop counts the values larger than a small one it is storing right now
(:func:`storing`): one stored alone is verified in a thread of this process, one of many in
the pool's worker processes, so that many at once use every core.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import sniffio
from anyio.lowlevel import RunVar

__all__ = [
    "STEPS_SECONDS",
    "cpu_turn",
    "next_turn",
    "others_storing",
    "pace",
    "soon",
    "storing",
    "writer_turn",
]

_CPU: RunVar[_Turn] = RunVar("response_compaction_cpu_turn")
_paced = threading.local()
#: Work done on the loop without a schedule point (inline reads) is cut at about this long.
PACE_SECONDS = 0.001
#: CPU-bound steps run back to back on the loop for at most about this long before one of
#: them yields while holding the turn, so the others queue behind it and the loop runs timers.
STEPS_SECONDS = 0.01
_WRITERS: RunVar[dict[str, anyio.Lock]] = RunVar("response_compaction_writer_turns")
_STORING: RunVar[list[int]] = RunVar("response_compaction_storing")


class _Turn:
    """The CPU turn of one event loop: a lock, and how long steps ran since the loop last did.

    A free lock is taken without a trip through the loop, so when many tasks become ready in
    one pass of the loop (32 compactions started together, or their writes done together),
    each would run its step in that same pass: 32 steps of 3 ms froze the loop for 130 ms.
    Once steps have run for ``STEPS_SECONDS`` since the last yield, the next one yields first,
    holding the lock: the tasks still due in this pass queue on it and the loop gets a turn.
    """

    def __init__(self) -> None:
        self.lock = anyio.Lock(fast_acquire=True)  # no extra trip through the loop when free
        self.spent = 0.0
        self._began = 0.0

    async def acquire(self) -> None:
        await self.lock.acquire()
        if self.spent >= STEPS_SECONDS:
            try:
                await self.breathe()
            except BaseException:
                self.lock.release()
                raise
        self._began = time.perf_counter()

    async def breathe(self) -> None:
        """Let the loop run what is due (its timers too) before this task's next step.

        One checkpoint is not enough: asyncio runs a due timer's callback behind the task
        already queued, and the task it wakes one pass later still, so a heartbeat waited
        for this task's next step too (two steps, 26-30 ms for the first ones of a 562k-key
        dict). Three passes let it run first; each costs microseconds, once per turn.
        """
        self.spent = 0.0
        for _ in range(3):
            await anyio.lowlevel.checkpoint()

    async def take_back(self) -> None:
        """:meth:`acquire` inside a block that holds the turn and let it go (:func:`next_turn`).

        Cancelled while waiting, it still takes the lock, shielded, then raises: the block's
        exit lets go of the turn, and releasing a lock this task did not hold replaced the
        caller's cancellation with a RuntimeError. The shielded wait is behind every task
        queued for the turn, a CPU step each (up to 10 ms): with 32 compactions at once a
        cancellation can land a few hundred milliseconds late.
        """
        try:
            await self.acquire()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.lock.acquire()
            self._began = time.perf_counter()
            raise

    def wanted(self) -> bool:
        """Whether other tasks are waiting for this turn."""
        return self.lock.statistics().tasks_waiting > 0

    def release(self) -> None:
        self.spent += time.perf_counter() - self._began
        self.lock.release()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


def cpu_turn() -> _Turn:
    """The turn CPU-bound steps on this event loop take, held with ``async with``."""
    try:
        return _CPU.get()
    except LookupError:
        turn = _Turn()
        _CPU.set(turn)
        return turn


async def next_turn() -> None:
    """Between two CPU-bound steps taken under :func:`cpu_turn`: let the loop and others run.

    The loop's three passes of :meth:`_Turn.breathe`, not one checkpoint: on asyncio a timer
    that fell due during a step wakes its task two passes later, so a 1 ms heartbeat waited
    for two more 4 ms slices of a large read (90 MB of short strings: 28-44 ms, 15-25 now).
    """
    turn = cpu_turn()
    turn.release()
    try:
        await turn.breathe()
    finally:
        await turn.take_back()


async def pace() -> None:
    """After work done inline on the loop: a schedule point once ``PACE_SECONDS`` have passed.

    Small reads complete without ever waiting, so a task reading many in a row would never
    let the loop run: it yields when this loop last had one of our yields long enough ago.
    Always a cancellation point.
    """
    now = time.perf_counter()
    # Per thread, so per running loop (one at a time per thread), and cheaper than a RunVar.
    last = getattr(_paced, "last", None)
    if last is None:
        last = _paced.last = now
    if now - last >= PACE_SECONDS:
        _paced.last = now
        await anyio.lowlevel.checkpoint()
    else:
        await anyio.lowlevel.checkpoint_if_cancelled()


def writer_turn(root: str) -> anyio.Lock:
    """The lock this event loop's writers of ``root``'s index queue on."""
    try:
        locks = _WRITERS.get()
    except LookupError:
        locks = {}
        _WRITERS.set(locks)
    lock = locks.get(root)
    if lock is None:
        lock = locks[root] = anyio.Lock()
    return lock


def _storing_count() -> list[int]:
    try:
        return _STORING.get()
    except LookupError:
        count = [0]
        _STORING.set(count)
        return count


@contextlib.contextmanager
def storing() -> Iterator[None]:
    """Count one value being stored on this event loop for as long as the block runs."""
    count = _storing_count()
    count[0] += 1
    try:
        yield
    finally:
        count[0] -= 1


def others_storing() -> bool:
    """Whether this event loop is storing another value beside the caller's (see storing)."""
    return _storing_count()[0] > 1


def soon(fn: Callable[..., object], *args: Any) -> None:
    """Call ``fn(*args)`` on this event loop's thread once the running task has yielded.

    For work the caller should not wait for, started only once its task yields: a helper
    begun any earlier shares the GIL with the rest of the call (see ``_medium``). Where there
    is no loop to hand it to (one closing, a coroutine driven by hand), it runs now. What it
    raises is dropped: on trio a callback's exception would end the whole run.
    """
    try:
        if sniffio.current_async_library() == "trio":
            import trio.lowlevel  # only ever on a trio loop, which imported it

            trio.lowlevel.current_trio_token().run_sync_soon(_never_raising, fn, *args)
            return
        import asyncio  # here, not at the top: already loaded when asyncio runs; 20-30 ms otherwise

        asyncio.get_running_loop().call_soon(_never_raising, fn, *args)
    except RuntimeError:  # no loop here after all (sniffio's own error is one)
        _never_raising(fn, *args)


def _never_raising(fn: Callable[..., object], *args: Any) -> None:
    # Work nobody waits for (a free): whatever it could not do, the references dropping do.
    with contextlib.suppress(Exception):
        fn(*args)
