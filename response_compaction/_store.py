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
eviction) reports ``Missing``; any byte that does not hash to the recorded digest is ``Broken``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import gc
import hashlib
import os
import pickle
import re
import secrets
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.lowlevel
import anyio.to_process

from ._canonical import Span, decode_exact
from ._errors import StoreError, UnsafeStoreError
from ._fileio import AsyncBinaryFile, FileBackend, current_backend
from ._models import Broken, Found, Missing
from ._slices import decode_layout, decode_sliced, encode_layout

__all__ = ["ROOT_NAME", "EntryReport", "Store", "Stored", "open_store"]

ROOT_NAME = "response-compaction-v1"
Kind = Literal["exact", "summary"]
KINDS: tuple[Kind, ...] = ("exact", "summary")
#: Verifying more bytes than this runs in a worker process: msgspec holds the GIL while it
#: decodes, and a thread would freeze the caller's event loop for the whole decode.
PROCESS_VERIFY_BYTES = 8 << 20
#: Decoding more bytes than this in the caller's process pauses the cyclic GC meanwhile:
#: a full collection over a freshly decoded tree can cost more than the decode itself.
GC_PAUSE_BYTES = 1 << 20
#: Temporary files older than this were left by a process that died mid-write.
STALE_TEMP_SECONDS = 3600.0
_EXPIRED_PER_COMMIT = 64
# Rows per kind are counted by triggers: a count(*) on every commit grew with the store
# (1.4 ms at 10,000 rows, 14 ms at 100,000).
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS entries (
        kind TEXT NOT NULL, key TEXT NOT NULL, digest TEXT NOT NULL,
        size INTEGER NOT NULL, expires_at REAL NOT NULL, last_used REAL NOT NULL,
        layout BLOB, PRIMARY KEY (kind, key)) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS entries_lru ON entries (kind, last_used)",
    "CREATE INDEX IF NOT EXISTS entries_expiry ON entries (expires_at)",
    "CREATE TABLE IF NOT EXISTS counts (kind TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID",
    """CREATE TRIGGER IF NOT EXISTS entries_added AFTER INSERT ON entries BEGIN
        INSERT INTO counts VALUES (NEW.kind, 1) ON CONFLICT (kind) DO UPDATE SET n = n + 1;
    END""",
    """CREATE TRIGGER IF NOT EXISTS entries_removed AFTER DELETE ON entries BEGIN
        UPDATE counts SET n = n - 1 WHERE kind = OLD.kind;
    END""",
)
_FANOUT = re.compile(r"[0-9a-f]{2}")
_HEX_KEY = re.compile(r"[0-9a-f]{64}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Stored:
    """What :meth:`Store.put` retained."""

    hex_digest: str
    size: int
    reused: bool
    value: Any = None


@dataclass(frozen=True, slots=True)
class _Entry:
    """An entry's bytes as read, before they are checked, and when they were read."""

    data: bytes
    hex_digest: str
    size: int
    layout: bytes | None
    now: float


@dataclass(frozen=True, slots=True)
class EntryReport:
    """One entry as ``verify`` saw it."""

    kind: Kind
    key: str
    state: Literal["found", "expired", "missing", "broken"]
    size: int
    detail: str = ""


# ----------------------------------------------------------------------------- root safety


def _check_dir(fd: int, path: str) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise UnsafeStoreError("store directory is owned by another user", path)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeStoreError("store directory is writable by group or others", path)


def _open_dir(path: str, create: bool, dir_fd: int | None = None) -> int:
    """Open (creating 0700 if asked) a directory we own, refusing symlinks and shared modes."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700, dir_fd=dir_fd)
    try:
        fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeStoreError("store path is a symlink or not a directory", path) from exc
        raise
    try:
        _check_dir(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


_swept: set[tuple[int, str]] = set()
_swept_lock = threading.Lock()


def _prepare_root(base: str) -> str:
    os.makedirs(base, mode=0o700, exist_ok=True)
    root = os.path.join(os.path.abspath(base), ROOT_NAME)
    root_fd = _open_dir(root, create=True)
    try:
        for sub in ("tmp", *KINDS):
            os.close(_open_dir(sub, create=True, dir_fd=root_fd))
    finally:
        os.close(root_fd)
    with _swept_lock:
        first = (os.getpid(), root) not in _swept
        _swept.add((os.getpid(), root))
    if first:
        _sweep_temps(root, time.time() - STALE_TEMP_SECONDS)
    return root


def _sweep_temps(root: str, older_than: float) -> int:
    """Remove temporary files left by writers that died; return how many."""
    removed = 0
    tmp_fd = _open_dir(os.path.join(root, "tmp"), create=False)
    try:
        for name in os.listdir(tmp_fd):
            try:
                st = os.stat(name, dir_fd=tmp_fd, follow_symlinks=False)
                if st.st_mtime < older_than:
                    os.unlink(name, dir_fd=tmp_fd)
                    removed += 1
            except FileNotFoundError:
                continue
    finally:
        os.close(tmp_fd)
    return removed


# ----------------------------------------------------------------------------- the index


class _Index:
    """SQLite rows for TTL and LRU. Every method is blocking; call through a worker thread."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.lock = threading.Lock()
        path = os.path.join(root, "index.sqlite3")
        if os.path.islink(path):
            raise UnsafeStoreError("store index is a symlink", path)
        self.conn = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
        # The data file and its directory are fsynced; FULL makes the row as durable.
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self._create_schema()
        os.chmod(path, 0o600)

    def _create_schema(self) -> None:
        # One writer at a time creates or upgrades the schema, so concurrent first opens agree.
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            tables = {row[0] for row in self.conn.execute("SELECT name FROM sqlite_master")}
            for statement in _SCHEMA:
                self.conn.execute(statement)
            columns = {row[1] for row in self.conn.execute("PRAGMA table_info(entries)")}
            if "layout" not in columns:  # an index written before reads were sliced
                self.conn.execute("ALTER TABLE entries ADD COLUMN layout BLOB")
            if "counts" not in tables:
                self.conn.execute(
                    "INSERT INTO counts SELECT kind, count(*) FROM entries GROUP BY kind"
                )
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    def lookup(self, kind: Kind, key: str) -> tuple[str, int, float, bytes | None] | None:
        with self.lock:
            row = self.conn.execute(
                "SELECT digest, size, expires_at, layout FROM entries WHERE kind = ? AND key = ?",
                (kind, key),
            ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]), float(row[2]), row[3])

    def touch(self, kind: Kind, key: str, now: float) -> None:
        with self.lock:
            self.conn.execute(
                "UPDATE entries SET last_used = max(last_used, ?) WHERE kind = ? AND key = ?",
                (now, kind, key),
            )

    def commit(
        self,
        *,
        kind: Kind,
        key: str,
        temp_name: str,
        hex_digest: str,
        size: int,
        expires_at: float,
        now: float,
        max_entries: int,
        layout: bytes | None,
    ) -> bool:
        """Rename the verified temp file into place and record it; True if it was live before."""
        with self.lock, _Dirs(self.root) as dirs:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                row = self.conn.execute(
                    "SELECT expires_at FROM entries WHERE kind = ? AND key = ?", (kind, key)
                ).fetchone()
                reused = row is not None and float(row[0]) > now
                fan_fd = dirs.fanout(kind, key)
                os.rename(temp_name, key, src_dir_fd=dirs.tmp, dst_dir_fd=fan_fd)
                os.fsync(fan_fd)
                # An upsert, not INSERT OR REPLACE: a replace deletes without firing triggers.
                self.conn.execute(
                    "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (kind, key)"
                    " DO UPDATE SET digest = excluded.digest, size = excluded.size,"
                    " expires_at = excluded.expires_at, last_used = excluded.last_used,"
                    " layout = excluded.layout",
                    (kind, key, hex_digest, size, expires_at, now, layout),
                )
                self._evict(dirs, kind, key, now, max_entries)
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
        return reused

    def _evict(self, dirs: _Dirs, kind: Kind, keep: str, now: float, max_entries: int) -> None:
        victims: list[tuple[Kind, str]] = [
            (k, key)
            for k, key in self.conn.execute(
                "SELECT kind, key FROM entries WHERE expires_at <= ? LIMIT ?",
                (now, _EXPIRED_PER_COMMIT),
            )
        ]
        row = self.conn.execute("SELECT n FROM counts WHERE kind = ?", (kind,)).fetchone()
        count = 0
        if row is not None and row[0] > max_entries:
            # The counter includes expired rows not yet deleted: count the live ones.
            (count,) = self.conn.execute(
                "SELECT count(*) FROM entries WHERE kind = ? AND expires_at > ?", (kind, now)
            ).fetchone()
        if count > max_entries:
            victims.extend(
                (kind, key)
                for (key,) in self.conn.execute(
                    "SELECT key FROM entries WHERE kind = ? AND key != ? AND expires_at > ?"
                    " ORDER BY last_used ASC LIMIT ?",
                    (kind, keep, now, count - max_entries),
                )
            )
        for victim_kind, victim_key in victims:
            self.conn.execute(
                "DELETE FROM entries WHERE kind = ? AND key = ?", (victim_kind, victim_key)
            )
            dirs.unlink(victim_kind, victim_key)

    def prune(self, now: float, max_entries: int | None) -> int:
        """Delete expired entries, and the least recently used beyond ``max_entries``."""
        removed = 0
        with self.lock, _Dirs(self.root) as dirs:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                victims = list(
                    self.conn.execute("SELECT kind, key FROM entries WHERE expires_at <= ?", (now,))
                )
                if max_entries is not None:
                    for kind in KINDS:
                        victims.extend(
                            (kind, key)
                            for (key,) in self.conn.execute(
                                "SELECT key FROM entries WHERE kind = ? AND expires_at > ?"
                                " ORDER BY last_used DESC LIMIT -1 OFFSET ?",
                                (kind, now, max_entries),
                            )
                        )
                for kind, key in victims:
                    self.conn.execute("DELETE FROM entries WHERE kind = ? AND key = ?", (kind, key))
                    dirs.unlink(kind, key)
                    removed += 1
                removed += self._remove_orphans(dirs)
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
        return removed

    def _remove_orphans(self, dirs: _Dirs) -> int:
        # A writer renames its file into place and records the row inside one write
        # transaction; we hold that lock, so a file without a row was left by a writer that
        # died between the two. Nobody will ever read it.
        removed = 0
        for kind in KINDS:
            recorded = {
                key
                for (key,) in self.conn.execute("SELECT key FROM entries WHERE kind = ?", (kind,))
            }
            kind_fd = _open_dir(kind, False, dirs.root_fd)
            try:
                fans = [name for name in os.listdir(kind_fd) if _FANOUT.fullmatch(name)]
            finally:
                os.close(kind_fd)
            for fan in fans:
                fan_fd = dirs.fanout(kind, fan)
                for name in os.listdir(fan_fd):
                    if name not in recorded and _HEX_KEY.fullmatch(name):
                        dirs.unlink(kind, name)
                        removed += 1
        return removed

    def remove(self, kind: Kind, key: str) -> None:
        """Delete one entry, row and file (``prune --broken`` uses it)."""
        with self.lock, _Dirs(self.root) as dirs:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                self.conn.execute("DELETE FROM entries WHERE kind = ? AND key = ?", (kind, key))
                dirs.unlink(kind, key)
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def rows(self) -> list[tuple[Kind, str, str, int, float]]:
        with self.lock:
            return list(
                self.conn.execute("SELECT kind, key, digest, size, expires_at FROM entries")
            )

    def counts(self, now: float) -> dict[str, int]:
        with self.lock:
            return {
                str(kind): int(n)
                for kind, n in self.conn.execute(
                    "SELECT kind, count(*) FROM entries WHERE expires_at > ? GROUP BY kind", (now,)
                )
            }

    def __del__(self) -> None:
        # Closed when the last user lets go, not when the cache drops it: a read or write that
        # fetched this index before may still be using it ("Cannot operate on a closed database").
        with contextlib.suppress(Exception):
            self.conn.close()


class _Dirs:
    """Directory fds for one blocking operation; every component opened without following links."""

    def __init__(self, root: str) -> None:
        self.root = root

    def __enter__(self) -> _Dirs:
        self.root_fd = _open_dir(self.root, create=False)
        self.tmp = _open_dir("tmp", create=False, dir_fd=self.root_fd)
        self._fans: dict[tuple[Kind, str], int] = {}
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fans.values():
            os.close(fd)
        os.close(self.tmp)
        os.close(self.root_fd)

    def fanout(self, kind: Kind, key: str) -> int:
        slot = (kind, key[:2])
        if slot not in self._fans:
            kind_fd = _open_dir(kind, create=True, dir_fd=self.root_fd)
            try:
                self._fans[slot] = _open_dir(key[:2], create=True, dir_fd=kind_fd)
            finally:
                os.close(kind_fd)
        return self._fans[slot]

    def unlink(self, kind: Kind, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(key, dir_fd=self.fanout(kind, key))


_indexes: collections.OrderedDict[tuple[int, str], _Index] = collections.OrderedDict()
_indexes_lock = threading.Lock()
_MAX_OPEN_INDEXES = 8


def _index_for(root: str) -> _Index:
    # One connection per process and root, reopened after fork; a few roots kept open.
    key = (os.getpid(), root)
    with _indexes_lock:
        index = _indexes.get(key)
        if index is not None:
            _indexes.move_to_end(key)
            return index
        index = _Index(root)
        _indexes[key] = index
        while len(_indexes) > _MAX_OPEN_INDEXES:
            _indexes.popitem(last=False)  # closed by _Index.__del__ once nobody uses it
        return index


# ----------------------------------------------------------------------------- verification


def _check_bytes(data: bytes, hex_digest: str, size: int) -> None:
    """Raise ``ValueError`` unless ``data`` is ``size`` bytes hashing to ``hex_digest``."""
    if len(data) != size:
        raise ValueError(f"truncated or padded: {len(data)} bytes on disk, {size} recorded")
    actual = hashlib.sha256(data).hexdigest()
    if actual != hex_digest:
        raise ValueError(f"bytes hash to sha256:{actual}, expected sha256:{hex_digest}")


_gc_pauses = 0
_gc_pause_lock = threading.Lock()
_gc_was_enabled = False


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic GC while large decodes run; nested and concurrent uses share one pause.

    A full collection over a freshly decoded tree can cost more than the decode itself (4.4 s
    against 1.3 s for 89 MB). Decoded values hold no cycles, so nothing is lost by waiting.
    When the pause ends, everything allocated meanwhile is moved to the oldest generation
    (``gc.freeze`` then ``gc.unfreeze``, constant time) instead of being walked by the next
    young collection, which took 213 ms for 90 MB of rows right after the read returned. It is
    scanned at the process's next ordinary full collection.
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_pause_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_pause_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.freeze()
                gc.unfreeze()
                gc.enable()


def _verify_file_in_worker(path: str, hex_digest: str, size: int, schema: Any) -> str | None:
    """Runs in a worker process: read the file back and verify it, GC off (we own the process).

    Returns what is wrong, or None; raising is kept for "this worker could not do the job".
    """
    fd = os.open(path, os.O_RDONLY | _FILE_FLAGS)
    with os.fdopen(fd, "rb", buffering=0) as file:
        data = file.readall()
    gc.disable()
    try:
        _check_bytes(data, hex_digest, size)
        decode_exact(data, schema)
    except ValueError as exc:
        return str(exc)
    finally:
        gc.enable()
    return None


def _worker_can_load(schema: Any) -> bool:
    """Whether a fresh interpreter can unpickle ``schema`` (a module-level type, by reference)."""
    module = sys.modules.get(getattr(schema, "__module__", ""), None)
    if module is None or (module.__name__ == "__main__" and not getattr(module, "__file__", None)):
        return False
    try:
        pickle.dumps(schema)
    except Exception:
        return False
    return True


# ----------------------------------------------------------------------------- the store


async def open_store(fs: Any) -> Store:
    """The store below ``fs.workspace_temp_dir()``, created and checked on first use."""
    backend = current_backend()
    base = os.fspath(fs.workspace_temp_dir())
    try:
        root = await backend.run(_prepare_root, base)
    except StoreError:
        raise
    except OSError as exc:
        raise StoreError(
            exc.errno, f"cannot use the workspace {base!r} for the store: {exc.strerror or exc}"
        ) from exc
    clock: Clock = getattr(fs, "clock", None) or time.time
    return Store(root, clock, backend)


class Store:
    """Content-addressed entries under an owned root, with TTL and LRU in an index."""

    def __init__(self, root: str, clock: Clock, backend: FileBackend) -> None:
        self.root = root
        self.clock = clock
        self._backend = backend

    async def _index(self) -> _Index:
        return await self._backend.run(_index_for, self.root)

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
        temp_path = os.path.join(self.root, "tmp", temp_name)
        tmp_fd = await backend.run(_open_dir, os.path.join(self.root, "tmp"), False)
        file: AsyncBinaryFile | None = None
        published = False
        try:
            file = await backend.open(temp_name, "xb", _opener(tmp_fd, 0o600))
            hasher = hashlib.sha256()
            size = 0
            for piece in pieces:
                hasher.update(piece)
                size += len(piece)
                await _write_all(file, piece)
            await backend.run(os.fsync, file.fileno())
            await file.close()
            file = None
            hex_digest = hasher.hexdigest()
            value = await self._verify_temp(
                temp_path,
                hex_digest,
                size,
                schema,
                tuple(layout or ()),
                want_value=size <= want_value_up_to,
            )
            index = await self._index()
            now = self.clock()
            reused = await backend.run(
                lambda: index.commit(
                    kind=kind,
                    key=key or hex_digest,
                    temp_name=temp_name,
                    hex_digest=hex_digest,
                    size=size,
                    expires_at=now + ttl_seconds,
                    now=now,
                    max_entries=max_entries,
                    layout=encode_layout(layout) if layout else None,
                )
            )
            published = True
            return Stored(hex_digest=hex_digest, size=size, reused=reused, value=value)
        except StoreError:
            raise
        except OSError as exc:
            raise StoreError(
                exc.errno, f"could not retain the {kind} value: {exc.strerror or exc}"
            ) from exc
        except sqlite3.Error as exc:
            raise StoreError(f"could not record the {kind} value in the index: {exc}") from exc
        finally:
            with anyio.CancelScope(shield=True):
                if file is not None:
                    await _close_quietly(file)
                if not published:
                    await backend.run(_unlink_quietly, temp_name, tmp_fd)
                await backend.run(os.close, tmp_fd)

    async def _verify_temp(
        self,
        path: str,
        hex_digest: str,
        size: int,
        schema: Any,
        spans: tuple[Span, ...],
        *,
        want_value: bool,
    ) -> Any:
        if size >= PROCESS_VERIFY_BYTES and not want_value and _worker_can_load(schema):
            try:
                problem = await anyio.to_process.run_sync(
                    _verify_file_in_worker, path, hex_digest, size, schema, cancellable=True
                )
            except (anyio.BrokenWorkerProcess, ImportError, AttributeError, pickle.PickleError):
                pass  # the worker could not load the schema: verify here instead
            else:
                if problem is not None:
                    raise ValueError(problem)
                return None
        data = await self._read(path)
        value = await self._checked_value(data, hex_digest, size, schema, spans)
        return value if want_value else None

    async def _checked_value(
        self, data: bytes, hex_digest: str, size: int, schema: Any, spans: tuple[Span, ...]
    ) -> Any:
        """Digest-check ``data`` off the loop, then decode it, in slices when it is large."""
        await self._backend.run(_check_bytes, data, hex_digest, size)
        if size < GC_PAUSE_BYTES:
            return decode_exact(data, schema)
        with paused_gc():
            return await decode_sliced(data, schema, spans, anyio.lowlevel.checkpoint)

    async def _read(self, path: str, dir_fd: int | None = None) -> bytes:
        file = await self._backend.open(path, "rb", _regular_opener(dir_fd))
        try:
            return await file.read(-1)
        finally:
            with anyio.CancelScope(shield=True):
                await file.close()

    async def get(self, kind: Kind, key: str, schema: Any) -> Found[Any] | Missing | Broken:
        """Read, digest-check and validate one entry; a read counts as a use."""
        read = await self._read_entry(kind, key)
        if not isinstance(read, _Entry):
            return read
        try:
            value = await self._checked_value(
                read.data, read.hex_digest, read.size, schema, decode_layout(read.layout)
            )
        except ValueError as exc:
            return Broken(detail=f"{kind} entry does not verify: {exc}")
        await self._touch(kind, key, read.now)
        return Found(value=value)

    async def get_bytes(self, kind: Kind, key: str) -> bytes | Missing | Broken:
        """The digest-checked bytes of one entry (not decoded); a read counts as a use.

        For readers that look at part of a large entry without decoding all of it. The
        digest is checked in a worker thread (hashlib lets go of the GIL), so the caller's
        event loop keeps running meanwhile.
        """
        read = await self._read_entry(kind, key)
        if not isinstance(read, _Entry):
            return read
        try:
            await self._backend.run(_check_bytes, read.data, read.hex_digest, read.size)
        except ValueError as exc:
            return Broken(detail=f"{kind} entry does not verify: {exc}")
        await self._touch(kind, key, read.now)
        return read.data

    async def _read_entry(self, kind: Kind, key: str) -> _Entry | Missing | Broken:
        """The unverified bytes of a live entry and what its row says they should be."""
        with _index_errors():
            index = await self._index()
            row = await self._backend.run(index.lookup, kind, key)
        now = self.clock()
        if row is None or row[2] <= now:
            return Missing()
        hex_digest, size, _, layout = row
        try:
            # Every component from the root down is opened without following links, so a
            # symlinked fan-out directory cannot redirect the read (UnsafeStoreError).
            fan_fd = await self._backend.run(_open_fanout, self.root, kind, key)
            try:
                data = await self._read(key, fan_fd)
            finally:
                os.close(fan_fd)
        except FileNotFoundError:
            return Missing()  # evicted by another process between lookup and open
        except StoreError:
            raise
        except _NotRegularFileError:
            return Broken(detail=f"{kind} entry is not a regular file")
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return Broken(detail=f"{kind} entry is a symlink; refusing to follow it")
            raise StoreError(exc.errno, f"could not read the {kind} entry: {exc.strerror}") from exc
        return _Entry(data, hex_digest, size, layout, now)

    async def _touch(self, kind: Kind, key: str, now: float) -> None:
        with _index_errors():
            index = await self._index()
            await self._backend.run(index.touch, kind, key, now)

    async def prune(self, max_entries: int | None = None) -> int:
        """Remove expired entries, and those beyond ``max_entries`` per kind.

        Also removes files no row names (left by a writer that died mid-commit) and temporary
        files over an hour old. Returns how many files went.
        """
        now = self.clock()
        with _index_errors():
            index = await self._index()
            removed = await self._backend.run(index.prune, now, max_entries)
        # Temp files carry real file times, so their age is judged by the real clock.
        removed += await self._backend.run(
            lambda: _sweep_temps(self.root, time.time() - STALE_TEMP_SECONDS)
        )
        return removed

    async def remove(self, kind: Kind, key: str) -> None:
        """Delete one entry (row and file), e.g. one that ``verify`` found broken."""
        with _index_errors():
            index = await self._index()
            await self._backend.run(index.remove, kind, key)

    async def verify(self) -> list[EntryReport]:
        """Re-check every recorded entry's bytes against its digest (not its schema)."""
        now = self.clock()
        with _index_errors():
            index = await self._index()
            rows = await self._backend.run(index.rows)
        reports = []
        for kind, key, hex_digest, size, expires_at in rows:
            reports.append(
                await self._backend.run(
                    _check_entry, self.root, kind, key, hex_digest, size, expires_at <= now
                )
            )
        return reports

    async def counts(self) -> dict[str, int]:
        """Live entries per kind."""
        with _index_errors():
            index = await self._index()
            return await self._backend.run(index.counts, self.clock())


@contextlib.contextmanager
def _index_errors() -> Iterator[None]:
    """Sqlite's exceptions, as the StoreError (an OSError) callers are promised."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreError(f"could not use the store index: {exc}") from exc


def _check_entry(
    root: str, kind: Kind, key: str, hex_digest: str, size: int, expired: bool
) -> EntryReport:
    try:
        fan_fd = _open_fanout(root, kind, key)
        try:
            fd = _regular_opener(fan_fd)(key, os.O_RDONLY)
        finally:
            os.close(fan_fd)
    except FileNotFoundError:
        return EntryReport(kind, key, "missing", size)
    except OSError as exc:
        return EntryReport(kind, key, "broken", size, f"cannot open: {exc.strerror or exc}")
    with os.fdopen(fd, "rb", buffering=0) as file:
        data = file.readall()
    try:
        _check_bytes(data, hex_digest, size)
    except ValueError as exc:
        return EntryReport(kind, key, "broken", size, str(exc))
    return EntryReport(kind, key, "expired" if expired else "found", size)


def _opener(dir_fd: int | None, mode: int) -> Callable[[str, int], int]:
    def opener(path: str, flags: int) -> int:
        return os.open(path, flags | _FILE_FLAGS, mode, dir_fd=dir_fd)

    return opener


class _NotRegularFileError(OSError):
    """Something other than a regular file sits where an entry should be."""


def _regular_opener(dir_fd: int | None) -> Callable[[str, int], int]:
    # O_NONBLOCK so a FIFO planted in the store cannot hang the open; it changes nothing for
    # the regular files we then insist on.
    def opener(path: str, flags: int) -> int:
        fd = os.open(path, flags | _FILE_FLAGS | os.O_NONBLOCK, dir_fd=dir_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise _NotRegularFileError(errno.EINVAL, "not a regular file", path)
        return fd

    return opener


def _open_fanout(root: str, kind: Kind, key: str) -> int:
    """The fan-out directory of ``key``, every component checked and opened without links."""
    root_fd = _open_dir(root, create=False)
    try:
        kind_fd = _open_dir(kind, create=False, dir_fd=root_fd)
        try:
            return _open_dir(key[:2], create=False, dir_fd=kind_fd)
        finally:
            os.close(kind_fd)
    finally:
        os.close(root_fd)


async def _write_all(file: AsyncBinaryFile, piece: bytes | memoryview) -> None:
    view = memoryview(piece).cast("B")
    while view:
        written = await file.write(view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]


async def _close_quietly(file: AsyncBinaryFile) -> None:
    with contextlib.suppress(OSError):
        await file.close()


def _unlink_quietly(name: str, dir_fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
