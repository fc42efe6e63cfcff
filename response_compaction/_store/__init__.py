"""The trusted store: atomic, verified, bounded.

Layout below ``workspace_temp_dir()``::

    response-compaction-v1/        0700, owned by us, never a symlink
        index.sqlite3              one row per entry: digest, size, expiry, last use
        tmp/                       temporary files, renamed into place when verified
        exact/ab/abcdef...         canonical bytes, named by their sha256
        summary/cd/cdef01...       canonical summary bytes, named by their cache identity

Entries are immutable files written by one algorithm (:meth:`Store.put`): a temporary file
in ``tmp/`` (written in a loop, since ``write`` may be short), fsync, read back and verified
(digest and schema), then, holding the index's write lock, renamed into place, the directory
fsynced, and the row upserted. TTL and LRU live in the index, not in file times (relatime and
noatime make atime useless, and a read must count as a use). Eviction deletes the row and the
file under the same lock, so a writer never has its fresh entry unlinked, and fan-out
directories are never removed. A reader that finds the row but not the file (a concurrent
eviction) reports ``Missing``; any byte that does not hash to the reference (or, for a
summary, is not sealed to its key) is ``Broken``: the index is a hint, never trusted for data.

Rooms: ``_paths`` (the owned root, fd-safe file operations), ``_index`` (the connection
registry and reads), ``_tx`` (rows and write statements), ``_sqlite`` (opening the file
safely), ``_clocks`` (expiry rules across skewed clocks), ``_secret`` (the sealing key),
``_verify`` (digest, seal and schema checks), ``_fileio`` (the per-event-loop file seam).
This module puts them together; nothing below it imports it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from .. import _pool
from .._canonical import Span
from .._errors import StoreError, map_errors
from .._harness import LocalWorkspace
from .._models import Broken, Found, Missing
from .._slices import decode_layout, encode_layout
from . import _index
from ._commit import prune_all, publish, remove_entry
from ._fileio import AsyncBinaryFile, FileBackend, current_backend
from ._index import CorruptRowError, Index, IndexBusy, Row
from ._oneshot import NOT_INLINE, SMALL_BYTES, put_small, read_checked, read_inline
from ._paths import (
    KINDS,
    ROOT_NAME,
    STALE_TEMP_SECONDS,
    Kind,
    NotRegularFileError,
    open_dir,
    open_fanout,
    opener,
    prepare_root,
    sweep_temps,
    unlink_quietly,
)
from ._secret import load_secret
from ._turns import cpu_turn, pace, writer_turn
from ._verify import (
    EntryReport,
    check_entry,
    check_trusted,
    decoded_value,
    read_all,
    seal,
    verify_file,
)

__all__ = [
    "KINDS",
    "ROOT_NAME",
    "EntryReport",
    "Kind",
    "Store",
    "Stored",
    "open_store",
    "publish",
]

Clock = Callable[[], float]
T = TypeVar("T")
_INDEX_ERRORS = "could not use the store index"
#: How long an operation waits for another process's write lock before giving up. Every wait
#: is a series of short tries with event-loop checkpoints between them, so a caller's deadline
#: or cancellation stops it at once.
LOCK_WAIT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Stored:
    """What :meth:`Store.put` retained."""

    hex_digest: str
    size: int
    reused: bool
    value: Any = None


async def open_store(fs: Any) -> Store:
    """The store below ``fs.workspace_temp_dir()``, created and checked on first use.

    A :class:`LocalWorkspace` may carry a clock and a file backend (tests inject faults
    there); other workspaces get the running event loop's backend. The root is created and
    checked once per process and workspace; every later operation still opens each directory
    without following links and checks its owner and mode, inside its own worker-thread call.
    """
    file_backend: FileBackend | None = None
    if isinstance(fs, LocalWorkspace):
        clock, file_backend = fs.clock, fs.file_backend
    else:
        clock = getattr(fs, "clock", None)  # the duck-typed workspace contract of earlier builds
    backend = file_backend or current_backend()
    base = os.fspath(fs.workspace_temp_dir())
    prepared = _prepared.get((os.getpid(), base))
    if prepared is None:
        _pool.POOL.start()  # warm before the first large value needs it
        with map_errors(f"cannot use the workspace {base!r} for the store"):
            root = await backend.run(prepare_root, base)
            secret = await backend.run(load_secret, root)
        prepared = _prepared[(os.getpid(), base)] = (root, secret)
    root, secret = prepared
    return Store(root, clock or time.time, backend, secret, fast=file_backend is None)


# Roots created and checked by this process, and their sealing keys, by workspace directory.
_prepared: dict[tuple[int, str], tuple[str, bytes]] = {}


class Store:
    """Content-addressed entries under an owned root, with TTL and LRU in an index."""

    def __init__(
        self, root: str, clock: Clock, backend: FileBackend, secret: bytes, *, fast: bool
    ) -> None:
        self.root = root
        self.clock = clock
        self._backend = backend
        self._secret = secret
        # The one-hop paths of ``_oneshot`` bypass the backend's file calls: only for the
        # library's own backends, never for an injected one.
        self._fast = fast

    async def _patiently(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread, retried while the index is busy.

        Each try waits at most ``BUSY_MS`` inside SQLite; between tries the event loop gets
        control back, so the caller's cancellation and deadlines are honoured.
        """
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        delay = 0.001
        while True:
            try:
                return await self._backend.run(fn, *args)
            except IndexBusy:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        errno.EBUSY,
                        f"the store index stayed locked by another process for"
                        f" {LOCK_WAIT_SECONDS:.0f} s",
                    ) from None
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.05)

    @contextlib.asynccontextmanager
    async def _using_index(self) -> AsyncIterator[Index]:
        with map_errors(_INDEX_ERRORS):
            index = await self._patiently(_index.acquire, self.root)
        try:
            with map_errors(_INDEX_ERRORS):
                yield index
        finally:
            _index.release(index)

    async def put(
        self,
        kind: Kind,
        pieces: Iterable[bytes | memoryview],
        *,
        key: str | None,
        schema: Any,
        ttl_seconds: int,
        max_entries: int,
        want_value_up_to: int,
        layout: list[Span] | None = None,
    ) -> Stored:
        """Write ``pieces`` as one entry, verify it, and publish it atomically.

        ``key`` None means content-addressed (the hex digest). The validated value is returned
        when the entry is at most ``want_value_up_to`` bytes (larger ones may be verified in a
        worker process, and nobody needs their value). ``pieces`` is consumed on the event
        loop thread, one piece per write, so a lazy encoder never holds the loop for long.
        ``layout``, if given, is filled by the encoder as ``pieces`` are consumed and kept
        beside the entry so reads can decode it in slices. Raises ``ValueError`` if the bytes
        do not validate against ``schema`` and :class:`StoreError` if they cannot be retained;
        either way nothing is published and no temporary file is left behind, also when
        cancelled.
        """
        temp_name = f"{secrets.token_hex(12)}.tmp"
        if self._fast:
            async with cpu_turn():
                head, size, rest = _gather(pieces, SMALL_BYTES)
            if rest is None:
                data = b"".join(head)
                return await self._put_small(kind, key, data, layout, schema, ttl_seconds,
                                             max_entries, want_value_up_to)  # fmt: skip
            pieces = itertools.chain(head, rest)
        backend = self._backend
        with map_errors(f"could not retain the {kind} value"):
            tmp_fd = await backend.run(open_dir, os.path.join(self.root, "tmp"), False)
            published = False
            try:
                hex_digest, size, value = await self._write_verified(
                    temp_name, tmp_fd, pieces, schema, layout, size_for_value=want_value_up_to
                )
                now = self.clock()
                row = Row(
                    seal(self._secret, kind, key or hex_digest, hex_digest),
                    size,
                    now + ttl_seconds,
                    encode_layout(layout) if layout else None,
                )
                async with self._using_index() as index, writer_turn(self.root):
                    with map_errors(f"could not publish the {kind} value in the store index"):
                        reused = await self._patiently(
                            publish,
                            index,
                            temp_name,
                            kind,
                            key or hex_digest,
                            row,
                            now,
                            max_entries,
                        )
                published = True
            finally:
                with anyio.CancelScope(shield=True):
                    if not published:
                        await backend.run(unlink_quietly, temp_name, tmp_fd)
                    await backend.run(os.close, tmp_fd)
        return Stored(hex_digest=hex_digest, size=size, reused=reused, value=value)

    async def _put_small(
        self,
        kind: Kind,
        key: str | None,
        data: bytes,
        layout: list[Span] | None,
        schema: Any,
        ttl_seconds: int,
        max_entries: int,
        want_value_up_to: int,
    ) -> Stored:
        """One hop: reuse a live intact entry, or write, verify and publish ``data``."""
        hex_digest = hashlib.sha256(data).hexdigest()
        key = key or hex_digest
        now = self.clock()
        row = Row(
            seal(self._secret, kind, key, hex_digest),
            len(data),
            now + ttl_seconds,
            encode_layout(layout) if layout else None,
        )
        temp_name = f"{secrets.token_hex(12)}.tmp"
        with map_errors(f"could not retain the {kind} value"):
            done = await self._patiently(
                put_small, self.root, temp_name, kind, key, data, hex_digest, row, schema, now,
                max_entries,
            )  # fmt: skip
        value = done.value if row.size <= want_value_up_to else None
        return Stored(hex_digest=hex_digest, size=row.size, reused=done.reused, value=value)

    async def _write_verified(
        self,
        temp_name: str,
        tmp_fd: int,
        pieces: Iterable[bytes | memoryview],
        schema: Any,
        layout: list[Span] | None,
        *,
        size_for_value: int,
    ) -> tuple[str, int, Any]:
        """Write, fsync and close the temp file, then verify it: (digest, size, value)."""
        backend = self._backend
        file = await backend.open(temp_name, "xb", opener(tmp_fd, 0o600))
        try:
            hasher = hashlib.sha256()
            size = 0
            it = iter(pieces)
            while True:
                async with cpu_turn():  # encoding the next piece holds the loop
                    piece = next(it, None)
                    if piece is not None:
                        hasher.update(piece)
                if piece is None:
                    break
                size += len(piece)
                await _write_all(file, piece)
            await backend.run(os.fsync, file.fileno())
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                await file.close()
            raise
        await file.close()  # a failing close after fsync is still a failure to retain
        hex_digest = hasher.hexdigest()
        temp_path = os.path.join(self.root, "tmp", temp_name)
        value = await verify_file(
            backend,
            temp_path,
            hex_digest,
            size,
            schema,
            tuple(layout or ()),
            want_value=size <= size_for_value,
            use_worker=self._fast,
        )
        return hex_digest, size, value

    async def get(self, kind: Kind, key: str, schema: Any) -> Found[Any] | Missing | Broken:
        """Read, digest-check and validate one entry; a read counts as a use."""
        if not self._fast:
            return await self._get_stepwise(kind, key, schema)
        await anyio.lowlevel.checkpoint_if_cancelled()
        now = self.clock()
        with map_errors(f"could not read the {kind} entry"):
            got = read_inline(self.root, kind, key, now, self._secret)
            if got is NOT_INLINE:
                got = await self._patiently(read_checked, self.root, kind, key, now, self._secret)
            else:
                await pace()
        if got is None:
            return Missing()
        if isinstance(got, str):
            return Broken(detail=got)
        row, data = got
        try:
            value = await decoded_value(data, schema, decode_layout(row.layout))
        except ValueError as exc:
            return Broken(detail=f"{kind} entry does not verify: {exc}")
        return Found(value=value)

    async def _get_stepwise(
        self, kind: Kind, key: str, schema: Any
    ) -> Found[Any] | Missing | Broken:
        now = self.clock()
        async with self._using_index() as index:
            try:
                row = await self._patiently(index.lookup, kind, key, now)
            except CorruptRowError:
                return Broken(detail=f"{kind} entry's index row is corrupt")
            # Expired by this clock, or by the time other clocks already witnessed (_clocks):
            # a clock that went backwards does not revive an entry.
            if row is None or row.expires_at <= max(now, row.attested):
                return Missing()
            with map_errors(f"could not read the {kind} entry"):
                data = await self._read_entry(kind, key)
            if isinstance(data, (Missing, Broken)):
                return data
            try:
                # The reference (or, for a summary, the sealed row) is the only digest trusted.
                await self._backend.run(check_trusted, data, kind, key, row.digest, self._secret)
                value = await decoded_value(data, schema, decode_layout(row.layout))
            except ValueError as exc:
                return Broken(detail=f"{kind} entry does not verify: {exc}")
            # Best-effort and without waiting: a held lock, a full disk or a read-only mount
            # must not turn an intact entry into an error.
            await self._backend.run(index.record_use, kind, key, now)
        return Found(value=value)

    async def _read_entry(self, kind: Kind, key: str) -> bytes | Missing | Broken:
        try:
            # Every component from the root down is opened without following links, so a
            # symlinked fan-out directory cannot redirect the read (UnsafeStoreError).
            fan_fd = await self._backend.run(open_fanout, self.root, kind, key)
            try:
                return await read_all(self._backend, key, fan_fd)
            finally:
                os.close(fan_fd)
        except FileNotFoundError:
            return Missing()  # evicted by another process between lookup and open
        except NotRegularFileError as exc:
            return Broken(detail=f"{kind} entry {exc.strerror}; refusing to read it")
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return Broken(detail=f"{kind} entry is a symlink; refusing to follow it")
            raise

    async def prune(self, max_entries: int | None = None) -> int:
        """Remove expired entries, and those beyond ``max_entries`` per kind.

        Also removes files no row names (left by a writer that died mid-commit) and temporary
        files over an hour old. Returns how many files went.
        """
        now = self.clock()
        async with self._using_index() as index:
            removed = await self._patiently(prune_all, index, now, max_entries)
        # Temp files carry real file times, so their age is judged by the real clock.
        with map_errors("could not sweep the store's temporary files"):
            removed += await self._backend.run(
                sweep_temps, self.root, time.time() - STALE_TEMP_SECONDS
            )
        return removed

    async def remove(self, kind: Kind, key: str) -> None:
        """Delete one entry (row and file), e.g. one that ``verify`` found broken."""
        async with self._using_index() as index:
            await self._patiently(remove_entry, index, kind, key)

    async def verify(self) -> list[EntryReport]:
        """Re-check every recorded entry's bytes against its digest (not its schema)."""
        now = self.clock()
        async with self._using_index() as index:
            entries = await self._patiently(index.entries)
        return [
            await self._backend.run(
                check_entry, self.root, entry, entry.expires_at <= now, self._secret
            )
            for entry in entries
        ]

    async def counts(self) -> dict[str, int]:
        """Live entries per kind."""
        async with self._using_index() as index:
            return await self._patiently(index.counts, self.clock())


# ----------------------------------------------------------------- blocking, in worker threads


def _gather(
    pieces: Iterable[bytes | memoryview], limit: int
) -> tuple[list[bytes | memoryview], int, Iterator[bytes | memoryview] | None]:
    """Consume ``pieces`` until more than ``limit`` bytes: (head, its size, the rest or None)."""
    it = iter(pieces)
    head: list[bytes | memoryview] = []
    size = 0
    for piece in it:
        head.append(piece)
        size += len(piece)
        if size > limit:
            return head, size, it
    return head, size, None


async def _write_all(file: AsyncBinaryFile, piece: bytes | memoryview) -> None:
    view = memoryview(piece).cast("B")
    while view:
        written = await file.write(view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]
