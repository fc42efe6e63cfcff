"""Helpers for the store tests: the on-disk layout seen from outside, snapshots, fault seams."""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec
from hypothesis import settings

import response_compaction as rc
from response_compaction._store import _index, _indexes
from response_compaction._store._fileio import (
    AsyncBinaryFile,
    FileBackend,
    Mode,
    Opener,
    current_backend,
)
from tests.schemas import FALLBACK, Exact, Summary, big_exact

ROOT_NAME = "response-compaction-v1"
T = TypeVar("T")

#: Hypothesis for these tests: modest example counts, and no deadline because event-loop
#: startup (trio or asyncio, a worker thread per file call) varies from run to run.
settings.register_profile("response_compaction_store", max_examples=100, deadline=None)
HYPOTHESIS = settings.get_profile("response_compaction_store")


def options(**overrides: Any) -> dict[str, Any]:
    """Compaction options with no model: fallback and ladder, plus ``overrides``."""
    return {"fallback": FALLBACK, "ladder": "cheap", **overrides}


async def compact(harness: Any, value: Any, **overrides: Any) -> rc.Compacted[Any, Any]:
    """``response_compact`` of an ``Exact`` value with :func:`options`."""
    return await rc.response_compact(harness, value, Exact, Summary, options(**overrides))


async def compact_at_once(harness: Any, values: list[Any]) -> dict[int, rc.Receipt]:
    """:func:`compact` of every value in one task group: the receipts by position."""
    receipts: dict[int, rc.Receipt] = {}

    async def one(i: int) -> None:
        receipts[i] = (await compact(harness, values[i])).receipt

    async with anyio.create_task_group() as tg:
        for i in range(len(values)):
            tg.start_soon(one, i)
    return receipts


def canonical(value: Any) -> bytes:
    """The canonical form computed straight from msgspec, independently of the library."""
    return msgspec.json.encode(value, order="sorted")


#: The key :func:`seed_key` gives a store, so tests can name entries before they exist.
TEST_KEY = bytes(range(32))


def seed_key(base: Path | str, key: bytes = TEST_KEY) -> None:
    """Give the store below workspace ``base`` a known key, as its first use would (0600)."""
    root = Path(base) / ROOT_NAME
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(root / "key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(key)


def hex_of(value: Any) -> str:
    """The keyed digest hex of ``value``'s canonical bytes under :data:`TEST_KEY` (its name)."""
    return hmac.new(TEST_KEY, canonical(value), hashlib.sha256).hexdigest()


def ref_of(value: Any) -> str:
    """The exact reference ``value`` gets."""
    return "rc1:" + hex_of(value)


def store_root(workspace: rc.Workspace | str | Path) -> Path:
    """The library's directory below a workspace."""
    base = workspace if isinstance(workspace, str | Path) else workspace.workspace_temp_dir()
    return Path(base) / ROOT_NAME


@contextmanager
def open_index(harness: rc.Harness) -> Iterator[tuple[Path, _index.Index]]:
    """The store's root and its index, as this process shares it (released after)."""
    root = store_root(harness.fs)
    index = _indexes.acquire(str(root))
    try:
        yield root, index
    finally:
        _indexes.release(index)


def index_settings(index: _index.Index) -> tuple[object, ...]:
    """The settings a transaction may change: synchronous, busy_timeout, wal_autocheckpoint."""
    with index._lock:  # not inside a helper's batch
        return tuple(
            index._conn.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("synchronous", "busy_timeout", "wal_autocheckpoint")
        )


@contextmanager
def loop_statements(harness: rc.Harness) -> Iterator[list[str]]:
    """The statements the index's write connection runs on this (the event loop's) thread."""
    loop_thread = threading.get_ident()
    on_loop: list[str] = []

    def trace(statement: str) -> None:
        if threading.get_ident() == loop_thread:
            on_loop.append(statement)

    with open_index(harness) as (_, index), traced(index, trace):
        yield on_loop


@contextmanager
def traced(index: _index.Index, trace: Callable[[str], object]) -> Iterator[None]:
    """``trace`` called with each statement of the index's write connection, while inside.

    Set and cleared holding the index's write lock, so that no statement runs meanwhile:
    ``set_trace_callback`` waits for SQLite's connection mutex holding the GIL, and a helper
    thread's statement holds that mutex while its trace call waits for the GIL (a deadlock
    that hung CI when a batch of uses was being written as a test cleared its trace).
    """
    with index._lock:
        index._conn.set_trace_callback(trace)
    try:
        yield
    finally:
        with index._lock:
            index._conn.set_trace_callback(None)


def entry_path(root: Path, hex_digest: str, kind: str = "exact") -> Path:
    """Where the entry for ``hex_digest`` lives."""
    return root / kind / hex_digest[:2] / hex_digest


def entry_files(root: Path, kind: str = "exact") -> set[str]:
    """Names of every non-directory below ``root/kind`` (entries, or anything else left)."""
    found: set[str] = set()
    base = root / kind
    if not base.exists():
        return found
    for dirpath, dirnames, filenames in os.walk(base):
        found.update(filenames)
        found.update(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))
    return found


def temp_files(root: Path) -> list[str]:
    """Whatever is in ``tmp/``."""
    tmp = root / "tmp"
    return sorted(os.listdir(tmp)) if tmp.exists() else []


def index_rows(root: Path, kind: str = "exact") -> set[str]:
    """Keys recorded in the index for ``kind`` (expired rows included)."""
    path = root / "index.sqlite3"
    if not path.exists():
        return set()
    conn = sqlite3.connect(path)
    try:
        return {
            str(key) for (key,) in conn.execute("SELECT key FROM entries WHERE kind = ?", (kind,))
        }
    finally:
        conn.close()


def assert_nothing_stored(root: Path) -> None:
    """No entry, temporary file or index row of an exact value under ``root``."""
    assert entry_files(root) == set()
    assert temp_files(root) == []
    assert index_rows(root) == set()


def stored_layout(root: Path, key: str) -> bytes:
    """The layout column of the index row of exact entry ``key``, as stored."""
    conn = sqlite3.connect(root / "index.sqlite3")
    try:
        (stored,) = conn.execute("SELECT layout FROM entries WHERE key = ?", (key,)).fetchone()
    finally:
        conn.close()
    return bytes(stored)


def rewrite_layout(root: Path, key: str, layout: bytes) -> None:
    """Replace the layout column of ``key``'s index row (a forger with write access to it)."""
    conn = sqlite3.connect(root / "index.sqlite3")
    try:
        with conn:
            conn.execute("UPDATE entries SET layout = ? WHERE key = ?", (layout, key))
    finally:
        conn.close()


Snapshot = dict[str, tuple[int, int, int, int, str]]


def snapshot(top: Path) -> Snapshot:
    """Every path below ``top`` with its mode, size, mtime, inode and link target."""
    seen: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            target = os.readlink(path) if os.path.islink(path) else ""
            seen[os.path.relpath(path, top)] = (
                st.st_mode,
                st.st_size,
                st.st_mtime_ns,
                st.st_ino,
                target,
            )
    return seen


# ----------------------------------------------------------------------------- fault seams

WriteFn = Callable[[AsyncBinaryFile, bytes | memoryview], Awaitable[int]]
RunHook = Callable[[Callable[..., Any]], Awaitable[None]]
OpenHook = Callable[[str], Awaitable[None]]
ThreadHook = Callable[[Callable[..., Any]], AbstractContextManager[None]]


class WrappedFile:
    """A temp file whose ``write`` goes through a test-chosen function."""

    def __init__(self, inner: AsyncBinaryFile, write: WriteFn) -> None:
        self._inner = inner
        self._write = write

    async def write(self, data: bytes | memoryview, /) -> int:
        return await self._write(self._inner, data)

    async def read(self, size: int = -1, /) -> bytes:
        return await self._inner.read(size)

    async def close(self) -> None:
        await self._inner.close()

    def fileno(self) -> int:
        return self._inner.fileno()


class FaultyBackend:
    """The running loop's real file backend, with faults injected where a test asks.

    ``write`` replaces every write to a store temp file (short writes, ENOSPC, no progress);
    ``before_open`` and ``before_run`` are awaited ahead of each open and each blocking call
    (EIO on fsync, a cancellation point); ``in_thread`` wraps a blocking call inside its worker
    thread (a cancellation that lands while the call runs).
    """

    name = "faulty"

    def __init__(
        self,
        *,
        write: WriteFn | None = None,
        before_open: OpenHook | None = None,
        before_run: RunHook | None = None,
        in_thread: ThreadHook | None = None,
    ) -> None:
        self._write = write
        self._before_open = before_open
        self._before_run = before_run
        self._in_thread = in_thread

    async def open(self, path: str, mode: Mode, opener: Opener) -> AsyncBinaryFile:
        if self._before_open is not None:
            await self._before_open(mode)
        file = await current_backend().open(path, mode, opener)
        return WrappedFile(file, self._write) if mode == "xb" and self._write else file

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._before_run is not None:
            await self._before_run(fn)
        wrap = self._in_thread
        if wrap is None:
            return await current_backend().run(fn, *args)

        def call() -> T:
            with wrap(fn):
                return fn(*args)

        return await current_backend().run(call)


def with_backend(harness: rc.Harness, backend: FileBackend) -> rc.Harness:
    """``harness`` on the same workspace and clock, its store using ``backend``."""
    fs = harness.fs
    assert isinstance(fs, rc.LocalWorkspace)
    return rc.Harness(
        fs=rc.LocalWorkspace(fs.path, clock=fs.clock, file_backend=backend), llm=harness.llm
    )


_READERS = """
import threading, anyio, response_compaction as rc
from response_compaction._store import _reading
from tests.schemas import FALLBACK, Exact, Summary, big_exact

def readers():
    return sum(t.name == "response-compaction-read" for t in threading.enumerate())

async def main():
    harness = rc.Harness(fs=rc.LocalWorkspace({workspace!r}))
    options = {{"fallback": FALLBACK, "ladder": "cheap"}}
    _reading.HASHED_BYTES = 1 << 62  # the compaction's read-back takes no read helper
    out = await rc.response_compact(harness, big_exact({rows}), Exact, Summary, options)
    ref = out.receipt.exact_ref
    _reading.HASHED_BYTES = 4 << 20  # as in the tests of large reads
    before = readers()
    got = await {call}
    assert isinstance(got, rc.Found), got
    print(before, readers())

anyio.run(main)
"""


def read_helpers_around(workspace: Path, rows: int, call: str) -> list[str]:
    """In a fresh process: read helper threads before and after ``call`` (an expression on
    ``harness`` and ``ref``, an entry of ``big_exact(rows)`` stored without any)."""
    script = _READERS.format(workspace=str(workspace), rows=rows, call=call)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


#: About 6 MB: past the 4 MiB to which the tests of large reads lower ``HASHED_BYTES``.
LARGE = big_exact(100_000)


async def store_large(harness: rc.Harness) -> tuple[str, Path]:
    """:data:`LARGE` compacted: its reference, and the path of its entry file."""
    ref = (await compact(harness, LARGE)).receipt.exact_ref
    path = entry_path(store_root(harness.fs), ref.removeprefix("rc1:"))
    assert path.stat().st_size > 4 << 20  # past the thresholds as those tests lower them
    return ref, path
