"""The trusted store: atomic, verified, bounded.

Layout below ``workspace_temp_dir()``::

    response-compaction-v1/        0700, owned by us, never a symlink
        index.sqlite3              one row per entry: digest, size, expiry, last use
        tmp/                       temporary files, renamed into place when verified
        key                        the store's secret digest key, 0600 (see _key)
        exact/ab/abcdef...         canonical bytes, named by their keyed digest
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
safely), ``_clocks`` (expiry rules across skewed clocks), ``_key`` (the store key),
``_verify`` (digest, seal and schema checks), ``_fileio`` (the per-event-loop file seam).
This module puts them together; nothing below it imports it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from .._canonical import Span
from .._digest import digest_of, new_hasher
from .._errors import StoreError, map_errors
from .._harness import LocalWorkspace
from .._models import Broken, Found, Missing
from .._slices import decode_layout, encode_layout
from . import _index
from ._fileio import FileBackend, current_backend, write_all
from ._index import CorruptRowError, Index, IndexBusy, Row
from ._key import load_key
from ._paths import (
    KINDS,
    ROOT_NAME,
    STALE_TEMP_SECONDS,
    Dirs,
    Kind,
    NotRegularFileError,
    open_dir,
    open_fanout,
    opener,
    prepare_root,
    sweep_temps,
    unlink_quietly,
)
from ._verify import (
    EntryReport,
    check_entry,
    check_trusted,
    decoded_value,
    read_all,
    seal,
    verify_file,
)

__all__ = ["KINDS", "ROOT_NAME", "EntryReport", "Kind", "Store", "Stored", "open_store"]

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
    there); other workspaces get the running event loop's backend.
    """
    file_backend: FileBackend | None = None
    if isinstance(fs, LocalWorkspace):
        clock, file_backend = fs.clock, fs.file_backend
    else:
        clock = getattr(fs, "clock", None)  # the duck-typed workspace contract of earlier builds
    backend = file_backend or current_backend()
    base = os.fspath(fs.workspace_temp_dir())
    with map_errors(f"cannot use the workspace {base!r} for the store"):
        root, key = await backend.run(_prepare, base)
    return Store(root, clock or time.time, backend, key)


def _prepare(base: str) -> tuple[str, bytes]:
    root = prepare_root(base)
    return root, load_key(root)


class Store:
    """Content-addressed entries under an owned root, with TTL and LRU in an index."""

    def __init__(self, root: str, clock: Clock, backend: FileBackend, key: bytes) -> None:
        self.root = root
        self.clock = clock
        self._backend = backend
        self._key = key

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

    def digest_of(self, data: bytes | memoryview) -> str:
        """The keyed digest of ``data`` under this store's key, as receipts carry it."""
        return digest_of(self._key, data)

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
        backend = self._backend
        temp_name = f"{secrets.token_hex(12)}.tmp"
        with map_errors(f"could not retain the {kind} value"):
            tmp_fd = await backend.run(open_dir, os.path.join(self.root, "tmp"), False)
            published = False
            try:
                hex_digest, size, value = await self._write_verified(
                    temp_name, tmp_fd, pieces, schema, layout, size_for_value=want_value_up_to
                )
                now = self.clock()
                row = Row(
                    seal(self._key, kind, key or hex_digest, hex_digest),
                    size,
                    now + ttl_seconds,
                    encode_layout(layout) if layout else None,
                )
                async with self._using_index() as index:
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
            hasher = new_hasher(self._key)
            size = 0
            for piece in pieces:
                hasher.update(piece)
                size += len(piece)
                await write_all(file, piece)
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
            self._key,
            want_value=size <= size_for_value,
        )
        return hex_digest, size, value

    async def get(self, kind: Kind, key: str, schema: Any) -> Found[Any] | Missing | Broken:
        """Read, digest-check and validate one entry; a read counts as a use."""
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
                await self._backend.run(check_trusted, data, kind, key, row.digest, self._key)
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
            removed = await self._patiently(_prune, index, now, max_entries)
        # Temp files carry real file times, so their age is judged by the real clock.
        with map_errors("could not sweep the store's temporary files"):
            removed += await self._backend.run(
                sweep_temps, self.root, time.time() - STALE_TEMP_SECONDS
            )
        return removed

    async def remove(self, kind: Kind, key: str) -> None:
        """Delete one entry (row and file), e.g. one that ``verify`` found broken."""
        async with self._using_index() as index:
            await self._patiently(_remove, index, kind, key)

    async def verify(self) -> list[EntryReport]:
        """Re-check every recorded entry's bytes against its digest (not its schema)."""
        now = self.clock()
        async with self._using_index() as index:
            entries = await self._patiently(index.entries)
        return [
            await self._backend.run(
                check_entry, self.root, entry, entry.expires_at <= now, self._key
            )
            for entry in entries
        ]

    async def counts(self) -> dict[str, int]:
        """Live entries per kind."""
        async with self._using_index() as index:
            return await self._patiently(index.counts, self.clock())


# ----------------------------------------------------------------- blocking, in worker threads


def publish(
    index: Index, temp_name: str, kind: Kind, key: str, row: Row, now: float, max_entries: int
) -> bool:
    """Rename the verified temp file into place, record it and evict, under the write lock.

    Returns whether ``key`` was live before.
    """
    with index.transaction() as tx, Dirs(index.root) as dirs:
        tx.saw(now)
        reused = tx.is_live(kind, key, now)
        dirs.publish(temp_name, kind, key)
        tx.upsert(kind, key, row, now)
        victims = tx.victims((kind,), now, max_entries, keep=key, expired_limit=64)
        for victim_kind, victim_key in victims:
            tx.delete(victim_kind, victim_key)
            dirs.unlink(victim_kind, victim_key)
    return reused


def _prune(index: Index, now: float, max_entries: int | None) -> int:
    with index.transaction() as tx, Dirs(index.root) as dirs:
        tx.saw(now)
        victims = tx.victims(KINDS, now, max_entries)
        for kind, key in victims:
            tx.delete(kind, key)
            dirs.unlink(kind, key)
        removed = len(victims)
        # A writer renames its file into place and records the row inside one write
        # transaction; we hold that lock, so a file without a row was left by a writer that
        # died between the two. Nobody will ever read it.
        for kind in KINDS:
            recorded = tx.keys(kind)
            for name in list(dirs.entry_files(kind)):
                if name not in recorded:
                    dirs.unlink(kind, name)
                    removed += 1
    return removed


def _remove(index: Index, kind: Kind, key: str) -> None:
    with index.transaction() as tx, Dirs(index.root) as dirs:
        tx.delete(kind, key)
        dirs.unlink(kind, key)
