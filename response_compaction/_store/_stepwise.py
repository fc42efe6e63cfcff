"""The call-by-call algorithm under the store: every blocking step through the file backend.

Large values take it (pieces are encoded on the loop and written as they come), and so does
every value on an injected file backend (the tests' fault seam), where each open, write,
fsync, read and commit is a separate call the seam can fail or cancel. ``Store`` (the
package module) adds the one-hop paths of ``_oneshot`` for small values on its own backends.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from .._canonical import Span
from .._digest import new_hasher
from .._errors import StoreError, map_errors
from .._models import Broken, Found, Missing
from .._slices import decode_layout
from . import _indexes
from ._commit import Publication
from ._fileio import AsyncBinaryFile, FileBackend, write_all
from ._group import publish_grouped
from ._index import CorruptRowError, Entry, Index, IndexBusy, Row
from ._paths import (
    Kind,
    NotRegularFileError,
    open_dir,
    open_entry,
    open_fanout,
    opener,
    unlink_quietly,
)
from ._reading import Data, read_hashed
from ._turns import cpu_turn
from ._verify import (
    EntryReport,
    check_entry,
    check_trusted,
    decoded_value,
    read_all,
    seal,
    sealed_layout,
    verify_file,
)

__all__ = ["INDEX_ERRORS", "LOCK_WAIT_SECONDS", "Stepwise", "Stored", "beside"]

T = TypeVar("T")
INDEX_ERRORS = "could not use the store index"
#: How long an operation waits for another process's write lock before giving up. Every wait
#: is a series of short tries with event-loop checkpoints between them, so a caller's deadline
#: or cancellation stops it at once.
LOCK_WAIT_SECONDS = 60.0
#: Pieces at least this big may be hashed in a worker thread beside their write.
HASH_BESIDE_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class Stored:
    """What ``Store.put`` retained."""

    hex_digest: str
    size: int
    reused: bool
    value: Any = None


class Stepwise:
    """The store's call-by-call operations (see the module docstring)."""

    root: str
    clock: Callable[[], float]
    _backend: FileBackend
    _key: bytes
    _fast: bool

    def _new_row(
        self,
        kind: Kind,
        name: str,
        hex_digest: str,
        size: int,
        expires_at: float,
        layout: list[Span] | None,
    ) -> Row:
        """The index row of a new entry: its digest (sealed for a summary) and sealed layout."""
        recorded = seal(self._key, kind, name, hex_digest)
        return Row(
            recorded, size, expires_at, sealed_layout(self._key, kind, name, recorded, layout)
        )

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
        with map_errors(INDEX_ERRORS):
            index = await self._patiently(_indexes.acquire, self.root)
        try:
            with map_errors(INDEX_ERRORS):
                yield index
        finally:
            _indexes.release(index)

    async def verify(self) -> list[EntryReport]:
        """Re-check every recorded entry's bytes against its digest (not its schema).

        An entry without its file is looked at once more after the walk, its row read again:
        a small put commits its row just before it renames its file into place
        (``_commit.publish_recorded``), and another writer may evict an entry once the walk
        has read the rows. Still recorded and still without its file, it is missing; no
        longer recorded, it is left out. (A put whose file lands only after that second look
        still reads as missing: nothing here waits for it, and rows are walked in key order,
        so one near the end of the walk gets little more than a read of the rows.)
        """
        now = self.clock()
        reports = await self._entry_reports(now, lambda entry: True)
        missing = {(report.kind, report.key) for report in reports if report.state == "missing"}
        if not missing:
            return reports
        again = {
            (report.kind, report.key): report
            for report in await self._entry_reports(
                now, lambda entry: (entry.kind, entry.key) in missing
            )
        }
        kept: list[EntryReport] = []
        for report in reports:
            name = (report.kind, report.key)
            if name not in missing:
                kept.append(report)
            elif name in again:  # as it is now, whatever that is; gone from the rows: left out
                kept.append(again[name])
        return kept

    async def _entry_reports(
        self, now: float, chosen: Callable[[Entry], bool]
    ) -> list[EntryReport]:
        """:func:`check_entry` of every recorded entry ``chosen`` says to check, in turn."""
        async with self._using_index() as index:
            entries = await self._patiently(index.entries)
        return [
            await self._backend.run(
                check_entry, self.root, entry, entry.expires_at <= now, self._key
            )
            for entry in entries
            if chosen(entry)
        ]

    async def _put_streaming(
        self,
        kind: Kind,
        pieces: Iterable[bytes | memoryview],
        key: str | None,
        schema: Any,
        ttl_seconds: int,
        max_entries: int,
        want_value_up_to: int,
        layout: list[Span] | None,
    ) -> Stored:
        """The call-by-call algorithm: large values, and every value on an injected backend."""
        temp_name = f"{secrets.token_hex(12)}.tmp"
        backend = self._backend
        with map_errors(f"could not retain the {kind} value"):
            tmp_fd = await backend.run(open_dir, os.path.join(self.root, "tmp"), False)
            published = False
            try:
                hex_digest, size, value = await self._write_verified(
                    temp_name, tmp_fd, pieces, schema, layout, size_for_value=want_value_up_to
                )
                now = self.clock()
                name = key or hex_digest
                row = self._new_row(kind, name, hex_digest, size, now + ttl_seconds, layout)
                item = Publication(temp_name, kind, name, row, now, max_entries)
                async with self._using_index() as index:
                    with map_errors(f"could not publish the {kind} value in the store index"):
                        reused = await publish_grouped(self._patiently, index, item)
                published = True
            finally:
                with anyio.CancelScope(shield=True):
                    if not published:
                        await backend.run(unlink_quietly, temp_name, tmp_fd)
                    await backend.run(os.close, tmp_fd)
        return Stored(hex_digest=hex_digest, size=size, reused=reused, value=value)

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
        """Write the temp file, fsync it while verifying it, close it: (digest, size, value).

        The read-back sees the bytes written whether or not they are on disk yet, so the fsync
        (a disk wait) runs beside the verification (CPU) instead of before it; both end before
        anything is published.
        """
        backend = self._backend
        file = await backend.open(temp_name, "xb", opener(tmp_fd, 0o600))
        try:
            hex_digest, size = await self._write_pieces(file, pieces)
            verify = functools.partial(
                verify_file,
                backend,
                os.path.join(self.root, "tmp", temp_name),
                hex_digest,
                size,
                schema,
                tuple(layout or ()),
                self._key,
                want_value=size <= size_for_value,
                use_worker=self._fast,
                land=self._fast,
            )
            fsync = functools.partial(backend.run, os.fsync, file.fileno())
            value = await beside(fsync, verify)
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                await file.close()
            raise
        await file.close()  # a failing close after fsync is still a failure to retain
        return hex_digest, size, value

    async def _write_pieces(
        self, file: AsyncBinaryFile, pieces: Iterable[bytes | memoryview]
    ) -> tuple[str, int]:
        """Encode and write every piece: (keyed digest, size)."""
        hasher = new_hasher(self._key)
        size = 0
        it = iter(pieces)
        turn = cpu_turn()
        while True:
            async with turn:  # encoding the next piece holds the loop
                piece = next(it, None)
                # Others waiting for the loop: hash a big piece in a worker thread (hashing
                # lets go of the GIL) beside its write. Alone, the extra hop costs more.
                aside = piece is not None and len(piece) >= HASH_BESIDE_BYTES and turn.wanted()
                if piece is not None and not aside:
                    hasher.update(piece)
            if piece is None:
                break
            size += len(piece)
            if aside:
                update = functools.partial(self._backend.run, hasher.update, piece)
                await beside(update, functools.partial(write_all, file, piece))
            else:
                await write_all(file, piece)
        return hasher.hexdigest(), size

    async def _get_stepwise(
        self, kind: Kind, key: str, schema: Any
    ) -> Found[Any] | Missing | Broken:
        now = self.clock()
        async with self._using_index() as index:
            row = await self._live_row(index, kind, key, now)
            if isinstance(row, (Missing, Broken)):
                return row
            with map_errors(f"could not read the {kind} entry"):
                data = await self._read_entry(kind, key, row.size)
            if isinstance(data, (Missing, Broken)):
                return data
            try:
                # The reference (or, for a summary, the sealed row) is the only digest trusted.
                await self._backend.run(check_trusted, data, kind, key, row.digest, self._key)
                value = await decoded_value(data, schema, decode_layout(row.layout))
            except ValueError as exc:
                return Broken(detail=f"{kind} entry does not verify: {exc}")
            # Best-effort and without waiting: a held lock, a full disk or a read-only mount
            # must not turn an intact entry into an error (a due batch: by a helper).
            _indexes.note_use(index, kind, key, now)
        return Found(value=value)

    async def _live_row(
        self, index: Index, kind: Kind, key: str, now: float
    ) -> Row | Missing | Broken:
        """The index row of an entry a read may use, or why there is none."""
        try:
            row = await self._patiently(index.lookup, kind, key, now)
        except CorruptRowError:
            return Broken(detail=f"{kind} entry's index row is corrupt")
        # Expired by this clock, or by the time other clocks already witnessed (_clocks):
        # a clock that went backwards does not revive an entry.
        if row is None or row.expires_at <= max(now, row.attested):
            return Missing()
        return row

    async def _read_entry(self, kind: Kind, key: str, size: int) -> bytes | Missing | Broken:
        # At most one byte more than the row's size: a file grown since (a sparse terabyte)
        # fails its check instead of being read whole (MemoryError).
        try:
            # Every component from the root down is opened without following links, so a
            # symlinked fan-out directory cannot redirect the read (UnsafeStoreError).
            fan_fd = await self._backend.run(open_fanout, self.root, kind, key)
            try:
                return await read_all(self._backend, key, fan_fd, limit=size + 1)
            finally:
                os.close(fan_fd)
        except OSError as exc:
            return _unread(kind, exc)

    async def _read_hashed(
        self, kind: Kind, key: str, size: int
    ) -> tuple[Data, str] | Missing | Broken:
        """:meth:`_read_entry` and the bytes' keyed digest, hashed as they are read.

        Only for the library's own file backends: one worker-thread call (``read_hashed``).
        """
        try:
            return await self._backend.run(_entry_hashed, self.root, kind, key, size, self._key)
        except OSError as exc:
            return _unread(kind, exc)


def _entry_hashed(root: str, kind: Kind, key: str, size: int, secret: bytes) -> tuple[Data, str]:
    """Blocking: the entry's bytes (at most a byte past ``size``) and their keyed digest."""
    fd = open_entry(root, kind, key)  # no link followed from the root down
    try:
        return read_hashed(fd, size, secret)
    finally:
        os.close(fd)


def _unread(kind: Kind, exc: OSError) -> Missing | Broken:
    """Why an entry could not be read, as a read answers it; any other error is raised."""
    if isinstance(exc, FileNotFoundError):
        return Missing()  # evicted by another process between lookup and open
    if isinstance(exc, NotRegularFileError):
        return Broken(detail=f"{kind} entry {exc.strerror}; refusing to read it")
    if exc.errno == errno.ELOOP:
        return Broken(detail=f"{kind} entry is a symlink; refusing to follow it")
    raise exc


async def beside(blocking: Callable[[], Awaitable[object]], work: Callable[[], Awaitable[T]]) -> T:
    """``work()`` while ``blocking()`` (a worker-thread call) runs beside it.

    A failure of ``blocking`` wins over one of ``work``; neither is wrapped in a group.
    """
    failed: list[Exception] = []

    async def aside() -> None:
        try:
            await blocking()
        except Exception as exc:  # raised below, after the work, so it is not grouped
            failed.append(exc)

    problem: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(aside)
        try:
            result = await work()
        except Exception as exc:
            problem = exc
    if failed:
        raise failed[0]
    if problem is not None:
        raise problem
    return result
