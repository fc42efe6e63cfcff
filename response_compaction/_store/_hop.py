"""A blocking call in a thread of the library's own, its task woken by that thread.

The file backends' ``run`` (every blocking step of the store, and the one call of a small
put) went through the loop's default executor on asyncio (aiofiles' ``wrap``) and anyio's
worker threads on trio. Both wrap the call in futures, conditions and limiters: a call that
does nothing took 57-93 us there and back at the minimum (96-110 us median) and 61-66 us of
the event loop thread's CPU. Here the call is an :class:`~._aside.Aside` job of the ``hop``
pool, and the thread that ran it wakes the waiting task itself (asyncio's
``call_soon_threadsafe``, trio's ``run_sync_soon``): 17-46 us at the minimum (62-72 us
median), 31-42 us of the loop's CPU. In 2 KB compactions alternating both ways in one
process, the minimum fell by 45-50 us on either loop (p10 by 90-100 us).

The call runs in a copy of the caller's ``contextvars`` context. A cancellation is honoured
before the call starts and never while it runs: the task waits for it (a thread cannot be
stopped, and abandoning it would let it write on after the caller cleaned up: a medium put
cancelled by ``asyncio.wait_for`` closed its temp file while a thread still wrote to the fd,
and the next file the process opened got the rest of the value). anyio's cancellation is
delivered at the task's next checkpoint, and so is a native ``task.cancel()`` on asyncio
(``asyncio.timeout``, ``wait_for``): the call's result (an fd it opened...) reaches its caller,
whose cleanup runs as the cancellation arrives. Any other anyio backend uses
``anyio.to_thread``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import sniffio

from ._aside import Aside

if TYPE_CHECKING:
    import asyncio

__all__ = ["HOP_THREADS", "cancel_again", "run_in_thread"]

T = TypeVar("T")

#: Threads of the ``hop`` pool at most; calls beyond wait their turn. More threads only
#: contend for the index's write lock (each backing off on a busy lock): 256 concurrent 2 KB
#: compactions took 230-310 ms with 4 to 12 threads, 370-840 ms with 32, and 1.1-1.4 s
#: through anyio's 40 worker threads on trio (the loop's default executor has 6 here).
HOP_THREADS = 8


async def run_in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a ``hop`` thread; returns what it returned, raises what it raised."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    library = sniffio.current_async_library()
    if library == "asyncio":
        return await _on_asyncio(call)
    if library == "trio":
        return await _on_trio(call)
    return await anyio.to_thread.run_sync(call)


async def _on_asyncio(call: Callable[[], T]) -> T:
    import asyncio  # imported by then (the loop runs); not at import: trio never needs it

    await anyio.lowlevel.checkpoint_if_cancelled()
    loop = asyncio.get_running_loop()
    woken = [loop.create_future()]  # the future the call's end settles (a new one per wait)

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, woken)

    with anyio.CancelScope(shield=True):
        job = Aside(call, pool="hop", then=wake, limit=HOP_THREADS)
        try:
            await woken[0]
        except asyncio.CancelledError as exc:  # a foreign task.cancel(): waited for too
            await _until_done(job, woken)
            cancel_again(exc)
    return job.take()  # what it made (an fd...) is the caller's to close as it is cancelled


def cancel_again(absorbed: BaseException) -> None:
    """Deliver the native cancellation just absorbed at this task's next await, as anyio does.

    The cancel count is left as it was (``asyncio.timeout`` turns it into ``TimeoutError``
    only if it is its own), and so is its message; a task that returns before awaiting again
    ends cancelled.
    """
    import asyncio

    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
        task.cancel(absorbed.args[0] if absorbed.args else None)


async def _until_done(job: Aside[Any], woken: list[asyncio.Future[None]]) -> None:
    """Wait for ``job`` whatever cancels this task meanwhile (its caller cleans up after)."""
    import asyncio

    while not job.done():  # else wake() was called: nothing else will settle a new future
        woken[0] = asyncio.get_running_loop().create_future()
        with contextlib.suppress(asyncio.CancelledError):
            await woken[0]


def _settle(woken: list[asyncio.Future[None]]) -> None:
    if not woken[0].done():  # cancelled by a foreign task.cancel(): see _until_done
        woken[0].set_result(None)


async def _on_trio(call: Callable[[], T]) -> T:
    import trio  # the running library

    await trio.lowlevel.checkpoint_if_cancelled()
    token = trio.lowlevel.current_trio_token()
    task = trio.lowlevel.current_task()

    def wake() -> None:
        # Run by the trio thread too when the job ran there (at exit): the reschedule is
        # queued, and runs once the task below is parked.
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(trio.lowlevel.reschedule, task)

    job = Aside(call, pool="hop", then=wake, limit=HOP_THREADS)
    await trio.lowlevel.wait_task_rescheduled(_not_abortable)
    return job.take()


def _not_abortable(_: Any) -> Any:
    import trio

    return trio.lowlevel.Abort.FAILED
