"""The file backends' ``run``: a blocking call in a ``hop`` thread, its task woken by that thread.

It replaced the loop's default executor (asyncio) and anyio's worker threads (trio) and must
behave as they did: the result or the exception comes back, a cancellation never abandons a
call under way, and a thread survives a waiter that went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from anyio.lowlevel import checkpoint

from response_compaction._store._fileio import AiofilesBackend, current_backend
from response_compaction._store._hop import HOP_THREADS, run_in_thread

pytestmark = pytest.mark.anyio

_ROOT = Path(__file__).resolve().parent.parent


def _fails() -> None:
    raise LookupError("raised in the thread")


async def test_a_call_runs_in_a_hop_thread_and_returns_or_raises() -> None:
    name = await current_backend().run(lambda: threading.current_thread().name)
    assert name == "response-compaction-hop"
    assert await current_backend().run(divmod, 7, 2) == (3, 1)
    with pytest.raises(LookupError, match="raised in the thread"):
        await current_backend().run(_fails)


def _held_call() -> tuple[threading.Event, threading.Event, list[str], Callable[[], str]]:
    """A call that says it started, waits for ``release``, then records that it returned."""
    started, release = threading.Event(), threading.Event()
    steps: list[str] = []

    def blocking() -> str:
        started.set()
        release.wait(timeout=30)
        steps.append("call returned")
        return "done"

    return started, release, steps, blocking


async def test_a_cancelled_caller_waits_for_its_call_then_is_cancelled() -> None:
    """The call is never abandoned: its task resumes once it returned, and only then ends."""
    started, release, steps, blocking = _held_call()

    async def caller(scope: anyio.CancelScope) -> None:
        with scope:
            steps.append(await run_in_thread(blocking))
            await checkpoint()  # the cancellation is delivered here
            steps.append("went on after the cancellation")

    scope = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(caller, scope)
        await anyio.to_thread.run_sync(started.wait, 30)
        scope.cancel()
        try:
            for _ in range(20):  # many passes of the loop: the caller must still be waiting
                await checkpoint()
            assert steps == []
        finally:
            release.set()
    assert steps == ["call returned", "done"]
    assert scope.cancelled_caught


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_native_cancellation_waits_for_the_call_then_is_raised() -> None:
    """``task.cancel()`` (``asyncio.timeout``, ``wait_for``) never abandons a running call."""
    started, release, steps, blocking = _held_call()

    async def caller() -> None:
        steps.append(await run_in_thread(blocking))  # what it made reaches its caller
        await asyncio.sleep(0)  # the cancellation is delivered here
        steps.append("went on after the cancellation")

    task = asyncio.ensure_future(caller())
    await anyio.to_thread.run_sync(started.wait, 30)
    task.cancel()
    try:
        for _ in range(20):  # many passes of the loop, a second cancellation among them
            await checkpoint()
            if _ == 10:
                task.cancel()
        assert not task.done()
    finally:
        release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["call returned", "done"]
    assert task.cancelling() == 2  # both cancellations counted, as asyncio.timeout reads them


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_asyncio_timeout_around_a_hop_call_is_a_timeout_error() -> None:
    """The count asyncio.timeout keeps is left as it was: its own expiry becomes TimeoutError."""
    started, release, steps, blocking = _held_call()

    async def bounded() -> None:
        async with asyncio.timeout(0) as timeout:  # expired at its first await
            steps.append(await run_in_thread(blocking))
            await asyncio.sleep(0)
        assert timeout.expired()

    task = asyncio.ensure_future(bounded())
    await anyio.to_thread.run_sync(started.wait, 30)
    release.set()
    with pytest.raises(TimeoutError):
        await task
    assert steps == ["call returned", "done"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_native_cancellation_waits_for_an_aiofiles_write(tmp_path: Path) -> None:
    """A write into a full pipe, cancelled natively: the task ends only once the write did."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        # "xb" is what the store writes with; its opener opens the existing FIFO instead.
        file = await AiofilesBackend().open(str(fifo), "xb", lambda p, _: os.open(p, os.O_WRONLY))
        data = b"x" * (4 << 20)  # far more than a pipe holds: the write blocks in its thread
        task = asyncio.ensure_future(file.write(data))
        for _ in range(20):
            await checkpoint()
        task.cancel()
        for _ in range(20):
            await checkpoint()
        assert not task.done()  # still writing: nothing read yet
        drained = await anyio.to_thread.run_sync(_drain, reader, len(data))
        with pytest.raises(asyncio.CancelledError):
            await task
        assert drained == len(data)  # the whole write ran; the fd was never given up early
        await file.close()
    finally:
        os.close(reader)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_native_cancellation_outlives_the_interrupted_call_s_failure(
    tmp_path: Path,
) -> None:
    """The write fails once cancelled (its reader gone): the caller sees the failure, and is
    still cancelled at its next await."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    file = await AiofilesBackend().open(str(fifo), "xb", lambda p, _: os.open(p, os.O_WRONLY))
    _fill(file.fileno())  # full before the write: it moves no byte, so it fails, not short
    steps: list[str] = []

    async def caller() -> None:
        try:
            await file.write(b"x" * (4 << 20))
        except BrokenPipeError:
            steps.append("the write failed")
        await asyncio.sleep(0)  # the cancellation is delivered here
        steps.append("went on after the cancellation")

    task = asyncio.ensure_future(caller())
    for _ in range(20):
        await checkpoint()
    task.cancel()
    for _ in range(20):
        await checkpoint()
    assert not task.done()
    os.close(reader)  # the blocked write now fails with EPIPE
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["the write failed"]
    await file.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("path", ["hop", "aiofiles"])
async def test_a_pending_native_cancellation_arrives_after_the_call_with_its_message(
    tmp_path: Path, path: str
) -> None:
    """A task that cancelled itself, then called: the call runs, its result is handed over,
    and the cancellation (its message too) arrives at the next await, never lost."""
    file = await AiofilesBackend().open(str(tmp_path / "f"), "xb", os.open)
    steps: list[object] = []

    async def caller() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel("why")
        if path == "hop":
            steps.append(await run_in_thread(divmod, 7, 2))
        else:
            steps.append(await file.write(b"abc"))
        await asyncio.sleep(0)
        steps.append("went on after the cancellation")

    task = asyncio.ensure_future(caller())
    with pytest.raises(asyncio.CancelledError) as cancelled:
        await task
    await file.close()
    assert steps == [(3, 1) if path == "hop" else 3]
    assert cancelled.value.args == ("why",)


def _fill(fd: int) -> None:
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(fd, b"x" * 65536)
    os.set_blocking(fd, True)


def _drain(fd: int, size: int) -> int:
    os.set_blocking(fd, True)
    got = 0
    while got < size:
        got += len(os.read(fd, 1 << 20))
    return got


async def test_a_caller_cancelled_before_the_call_never_starts_it() -> None:
    ran: list[int] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        await run_in_thread(ran.append, 1)
    assert ran == []


async def test_calls_beyond_the_bound_wait_for_a_thread_of_the_pool() -> None:
    """At most HOP_THREADS threads: 256 concurrent small puts ran 1.5-3x slower with 32."""
    release = threading.Event()
    results: list[int] = []

    def blocking(i: int) -> int:
        release.wait(timeout=30)
        return i

    async def one(i: int) -> None:
        results.append(await run_in_thread(blocking, i))

    async with anyio.create_task_group() as tg:
        for i in range(HOP_THREADS + 4):
            tg.start_soon(one, i)
        await wait_all_tasks_blocked()  # every call handed to the pool, each thread started
        try:
            hop = [t for t in threading.enumerate() if t.name == "response-compaction-hop"]
            assert len(hop) == HOP_THREADS
        finally:
            release.set()
    assert sorted(results) == list(range(HOP_THREADS + 4))


_LOOP_GONE = """
import asyncio, threading
from response_compaction._store import _hop

_hop.HOP_THREADS = 1  # one thread: the next call waits for it, so it must still be there
release = threading.Event()
threads = []

def blocking():
    threads.append(threading.get_ident())
    release.wait(30)

async def start():
    task = asyncio.ensure_future(_hop.run_in_thread(blocking))
    while not threads:
        await asyncio.sleep(0.001)
    return task

loop = asyncio.new_event_loop()
loop.set_exception_handler(lambda loop, context: None)  # "destroyed but pending": as meant
task = loop.run_until_complete(start())
loop.close()  # its caller still waits: a host closing its loop anyway
release.set()  # the thread now wakes a closed loop

async def again():
    return await asyncio.wait_for(_hop.run_in_thread(threading.get_ident), 30)

assert asyncio.run(again()) == threads[0], "the hop thread died waking a closed loop"
print("ok")
"""


def _prints_ok(script: str) -> None:
    """Run ``script`` in a fresh interpreter: it must print "ok" and nothing else."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")


def test_a_thread_whose_loop_closed_meanwhile_serves_the_next_call() -> None:
    _prints_ok(_LOOP_GONE)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_after_the_helpers_stopped_at_exit_a_call_runs_in_its_caller(backend: str) -> None:
    """Its task is woken all the same (on trio, before it is parked)."""
    script = textwrap.dedent(
        f"""
        import threading
        import anyio
        from response_compaction._store import _aside
        from response_compaction._store._fileio import AiofilesBackend, current_backend

        async def main():
            with anyio.fail_after(30):
                return await current_backend().run(threading.current_thread)

        assert anyio.run(main, backend="{backend}") is not threading.main_thread()
        _aside._stop_helpers()  # what the interpreter's exit runs
        assert anyio.run(main, backend="{backend}") is threading.main_thread()
        print("ok")
        """
    )
    _prints_ok(script)
