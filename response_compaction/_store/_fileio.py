"""The per-backend seam: how bytes reach the disk without blocking the event loop.

aiofiles drives files on asyncio (it runs on the loop's executor and cannot run under trio,
aiofiles issue #96); under trio the same calls go through anyio's file API and worker
threads. Blocking calls other than file I/O (``run``) go to the library's own threads on
either loop (``_hop``). Everything above this module (the atomic-write algorithm, the index,
eviction) is written once against :class:`FileBackend`.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import sniffio

from ._hop import cancel_again, run_in_thread

__all__ = ["AsyncBinaryFile", "FileBackend", "Opener", "current_backend", "write_all"]

T = TypeVar("T")
Opener = Callable[[str, int], int]
Mode = Literal["rb", "xb"]


class AsyncBinaryFile(Protocol):
    """An unbuffered binary file whose blocking calls run off the event loop."""

    async def write(self, data: bytes | memoryview, /) -> int:
        """Write some of ``data`` and return how many bytes went out (may be short)."""

    async def read(self, size: int = -1, /) -> bytes:
        """Read up to ``size`` bytes (all of them when -1)."""

    async def close(self) -> None:
        """Close the file."""

    def fileno(self) -> int:
        """The OS file descriptor."""


class FileBackend(Protocol):
    """The two things the store needs from an async library: files and worker threads."""

    name: str

    async def open(self, path: str, mode: Mode, opener: Opener) -> AsyncBinaryFile:
        """Open ``path`` unbuffered through ``opener`` (which adds dir_fd and O_NOFOLLOW)."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking ``fn(*args)`` in a worker thread."""


async def _run_to_completion(start: Callable[[], Awaitable[T]]) -> T:
    """Await an aiofiles call the way anyio's worker threads behave under trio.

    aiofiles runs each call in an executor thread that cancellation cannot stop. Abandoning it
    would leak what it opens, let a write run on after its file was closed (and its fd reused),
    and race the cleanup that follows. So: a cancellation point before the call starts, none
    while it runs; anyio's pending cancellation is delivered at the caller's next checkpoint,
    a native ``task.cancel()`` once the call has returned (see ``_hop``).
    """
    await anyio.lowlevel.checkpoint_if_cancelled()
    with anyio.CancelScope(shield=True):
        result = await _unabandoned(start)
    return result  # noqa: RET504 - CancelScope.__exit__ may suppress, so mypy wants it outside


async def _unabandoned(start: Callable[[], Awaitable[T]]) -> T:
    """``await start()`` in a task of its own, waited for through native cancellations.

    A cancellation meanwhile is delivered at the caller's next await (``_hop.cancel_again``),
    after its result or its error: a file opened is the caller's to close as it is cancelled.
    """
    import asyncio  # aiofiles runs on asyncio only

    call = asyncio.ensure_future(start())
    cancelled: asyncio.CancelledError | None = None
    while not call.done():
        try:
            await asyncio.shield(call)
        except asyncio.CancelledError as exc:
            if not call.cancelled():  # this task's cancellation (a pending one too): absorbed
                cancelled = exc
        except Exception:  # noqa: S110 - the call's own error: raised by call.result() below
            pass
    if cancelled is not None:
        cancel_again(cancelled)
    return call.result()


class _AiofilesFile:
    def __init__(self, file: Any) -> None:
        self._file = file

    async def write(self, data: bytes | memoryview, /) -> int:
        written: int = await _run_to_completion(lambda: self._file.write(data))
        return written

    async def read(self, size: int = -1, /) -> bytes:
        data: bytes = await _run_to_completion(lambda: self._file.read(size))
        return data

    async def close(self) -> None:
        await _run_to_completion(self._file.close)

    def fileno(self) -> int:
        fd: int = self._file.fileno()
        return fd


class AiofilesBackend:
    """asyncio: aiofiles for files, the library's own threads for other blocking calls."""

    name = "asyncio"

    # aiofiles is imported on first use: it imports asyncio (20-30 ms), which a trio
    # process never needs and which counts against the import budget.
    async def open(self, path: str, mode: Mode, opener: Opener) -> AsyncBinaryFile:
        import aiofiles

        file = await _run_to_completion(
            lambda: aiofiles.open(path, mode, buffering=0, opener=opener)
        )
        return _AiofilesFile(file)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await run_in_thread(fn, *args)


class _AnyioFile:
    def __init__(self, file: anyio.AsyncFile[bytes]) -> None:
        self._file = file

    async def write(self, data: bytes | memoryview, /) -> int:
        written: int = await self._file.write(data)
        return written

    async def read(self, size: int = -1, /) -> bytes:
        return await self._file.read(size)

    async def close(self) -> None:
        await self._file.aclose()

    def fileno(self) -> int:
        return self._file.wrapped.fileno()


class AnyioBackend:
    """Any other anyio backend (trio): anyio's file API; the library's own threads on trio."""

    name = "anyio"

    async def open(self, path: str, mode: Mode, opener: Opener) -> AsyncBinaryFile:
        file = await anyio.open_file(path, mode, buffering=0, opener=opener)
        return _AnyioFile(file)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await run_in_thread(fn, *args)


_AIOFILES = AiofilesBackend()
_ANYIO = AnyioBackend()


def current_backend() -> FileBackend:
    """The seam for the async library running this task."""
    return _AIOFILES if sniffio.current_async_library() == "asyncio" else _ANYIO


async def write_all(file: AsyncBinaryFile, piece: bytes | memoryview) -> None:
    """Write all of ``piece`` (``write`` may be short); no progress is an error."""
    view = memoryview(piece).cast("B")
    while view:
        written = await file.write(view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]
