"""The SQLite index: one row per entry for TTL and LRU. SQL only; files are the caller's job.

Every method blocks; the store calls them through its file backend's worker threads. Writes
happen inside :meth:`Index.transaction`, which holds the database's write lock
(``BEGIN IMMEDIATE``), so the caller can rename or unlink files under the same lock.

No method waits for a lock for long: a worker thread cannot be cancelled, so a lock held by
another thread or process raises :class:`IndexBusy` after at most ``BUSY_MS`` and the caller
retries from the event loop, where the caller's deadline can stop it. Reads go through their
own connection and never need the write lock (WAL readers do not block on a writer); a read's
"use" for the LRU order is recorded best-effort (:meth:`Index.record_use`).

Connections are shared per process and root through :func:`acquire` / :func:`release`: an
index in use is never closed, and at most ``MAX_IDLE_INDEXES`` idle ones stay open.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import math
import os
import re
import sqlite3
import stat
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import NamedTuple

from .._errors import StoreError, UnsafeStoreError
from ._paths import Kind, valid_name

__all__ = [
    "BUSY_MS",
    "MAX_IDLE_INDEXES",
    "CorruptRowError",
    "Entry",
    "Index",
    "IndexBusy",
    "IndexReplacedError",
    "Row",
    "Transaction",
    "acquire",
    "acquire_now",
    "close_all",
    "release",
]

MAX_IDLE_INDEXES = 8
#: The longest a worker thread waits inside SQLite for a lock before giving the event loop back.
BUSY_MS = 20
#: Uses recorded by reads are written at most this often (and with every write before that).
USE_FLUSH_SECONDS = 1.0
#: Uses not yet written to the index (the write lock was busy) are kept up to this many.
_MAX_PENDING_USES = 4096
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_HEX = re.compile(r"[0-9a-f]{64}")
_BUSY_CODES = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED
_READONLY_CODES = frozenset({8, 14})  # SQLITE_READONLY, SQLITE_CANTOPEN
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


class IndexBusy(Exception):  # noqa: N818 - a signal to retry, not an error anyone sees
    """The write lock is held by another thread or process right now; retry later."""


def _busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in _BUSY_CODES or "locked" in str(exc)


class IndexReplacedError(StoreError):
    """``index.sqlite3`` is not the file this connection has open any more."""


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path, follow_symlinks=False)
    return st.st_dev, st.st_ino


class CorruptRowError(ValueError):
    """An index row whose cells are not what this library writes (types, names, ranges)."""


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


class Row(NamedTuple):
    """What a read needs to know about one entry."""

    digest: str
    size: int
    expires_at: float
    layout: bytes | None


class Entry(NamedTuple):
    """One recorded entry, as ``verify`` walks them."""

    kind: Kind
    key: str
    digest: str
    size: int
    expires_at: float
    corrupt: bool = False


def _entry(kind: object, key: object, digest: object, size: object, expires: object) -> Entry:
    """An :class:`Entry`, or a corrupt one (for verify to report) when a cell is wrong."""
    if not (isinstance(kind, str) and isinstance(key, str) and valid_name(kind, key)):
        raise CorruptRowError("index row names no entry")
    when = _number(expires)
    if not (isinstance(digest, str) and _HEX.fullmatch(digest)) or when is None:
        return Entry(kind, key, "", 0, 0.0, corrupt=True)  # type: ignore[arg-type]
    if not (isinstance(size, int) and size >= 0):
        return Entry(kind, key, "", 0, 0.0, corrupt=True)  # type: ignore[arg-type]
    return Entry(kind, key, digest, size, when)  # type: ignore[arg-type]


class Transaction:
    """The write statements, valid only inside :meth:`Index.transaction`."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def is_live(self, kind: Kind, key: str, now: float) -> bool:
        """Whether ``key`` has an unexpired row."""
        row = self._conn.execute(
            "SELECT expires_at FROM entries WHERE kind = ? AND key = ?", (kind, key)
        ).fetchone()
        when = None if row is None else _number(row[0])
        return when is not None and when > now

    def upsert(self, kind: Kind, key: str, row: Row, now: float) -> None:
        """Record ``key`` as just used."""
        # An upsert, not INSERT OR REPLACE: a replace deletes without firing triggers.
        self._conn.execute(
            "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (kind, key)"
            " DO UPDATE SET digest = excluded.digest, size = excluded.size,"
            " expires_at = excluded.expires_at, last_used = excluded.last_used,"
            " layout = excluded.layout",
            (kind, key, row.digest, row.size, row.expires_at, now, row.layout),
        )

    def renew(self, kind: Kind, key: str, row: Row, now: float) -> bool:
        """Give the live row of ``key`` holding ``row``'s digest a new expiry; False if none."""
        cursor = self._conn.execute(
            "UPDATE entries SET expires_at = ?, last_used = max(last_used, ?)"
            " WHERE kind = ? AND key = ? AND digest = ? AND size = ? AND expires_at > ?",
            (row.expires_at, now, kind, key, row.digest, row.size, now),
        )
        return cursor.rowcount == 1

    def victims(
        self,
        kinds: tuple[Kind, ...],
        now: float,
        max_entries: int | None,
        *,
        keep: str = "",
        expired_limit: int = -1,
    ) -> list[tuple[Kind, str]]:
        """The rows to evict: expired ones, then each kind's least recently used beyond the bound.

        At most ``expired_limit`` expired rows (-1: all). ``keep`` is never chosen, and counts
        as one of the ``max_entries`` live rows.
        """
        found: list[tuple[Kind, str]] = [
            (kind, key)
            for kind, key in self._conn.execute(
                "SELECT kind, key FROM entries WHERE expires_at <= ? LIMIT ?", (now, expired_limit)
            )
        ]
        if max_entries is None:
            return found
        for kind in kinds:
            counted = self._conn.execute("SELECT n FROM counts WHERE kind = ?", (kind,)).fetchone()
            # The counter includes expired rows not yet deleted, so it only says when to look.
            if counted is None or (isinstance(counted[0], int) and counted[0] <= max_entries):
                continue
            found.extend(
                (kind, key)
                for (key,) in self._conn.execute(
                    "SELECT key FROM entries WHERE kind = ? AND key != ? AND expires_at > ?"
                    " ORDER BY last_used DESC LIMIT -1 OFFSET ?",
                    (kind, keep, now, max_entries - 1 if keep else max_entries),
                )
            )
        return found

    def touch(self, kind: Kind, key: str, when: float) -> None:
        """Record a use of ``key`` at ``when`` (never moves its last use backwards)."""
        self._conn.execute(
            "UPDATE entries SET last_used = max(last_used, ?) WHERE kind = ? AND key = ?",
            (when, kind, key),
        )

    def delete(self, kind: Kind, key: str) -> None:
        """Drop one row."""
        self._conn.execute("DELETE FROM entries WHERE kind = ? AND key = ?", (kind, key))

    def keys(self, kind: Kind) -> set[str]:
        """Every recorded key of ``kind``, expired or not."""
        return {
            key for (key,) in self._conn.execute("SELECT key FROM entries WHERE kind = ?", (kind,))
        }


class Index:
    """One root's ``index.sqlite3``: a writer connection and a reader connection."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.read_only = False
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._pending: dict[tuple[Kind, str], float] = {}
        self._next_flush = 0.0
        path = os.path.join(root, "index.sqlite3")
        _own_files(path)
        try:
            self._conn = _connect(path)
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                raise IndexBusy from exc
            if getattr(exc, "sqlite_errorcode", None) not in _READONLY_CODES:
                raise
            # A read-only mount: reads and verify still work, writes raise.
            self._conn = _connect_read_only(path)
            self.read_only = True
        self.path = path
        try:
            self._identity = _identity(path)
            self._reader = self._conn if self.read_only else _connect(path, schema=False)
        except BaseException:
            self._conn.close()
            raise

    def is_current(self) -> bool:
        """Whether ``index.sqlite3`` is still the file this index opened (not removed, replaced)."""
        try:
            return _identity(self.path) == self._identity
        except FileNotFoundError:
            return False

    def _check_current(self) -> None:
        if not self.is_current():
            raise IndexReplacedError(
                "the store index was removed or replaced while this process used it;"
                " nothing was recorded, and the next call reopens it"
            )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Hold the write lock; commit on success, roll back on any exception.

        Raises :class:`IndexBusy` (before anything was done) when the lock is not free, and
        :class:`IndexReplacedError` when ``index.sqlite3`` is no longer the file this
        connection writes to: rows committed to an orphan would be receipts no other process
        can honour. Checked once the lock is held and again just before the commit.
        """
        if self.read_only:
            raise sqlite3.OperationalError("the store index is on a read-only file system")
        if not self._lock.acquire(timeout=BUSY_MS / 1000):
            raise IndexBusy
        try:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if _busy(exc):
                    raise IndexBusy from exc
                raise
            try:
                self._check_current()
                tx = Transaction(self._conn)
                self._flush_uses(tx)
                yield tx
                self._check_current()
                self._conn.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled back already (a full disk during COMMIT does): a
                # second ROLLBACK would replace the real error with "no transaction is active".
                if self._conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                raise
        finally:
            self._lock.release()

    def _flush_uses(self, tx: Transaction) -> None:
        pending, self._pending = self._pending, {}
        for (kind, key), when in pending.items():
            tx.touch(kind, key, when)

    def flush_due(self) -> bool:
        """Whether uses are waiting to be written and the batching interval has passed."""
        return bool(self._pending) and time.monotonic() >= self._next_flush

    def record_use(self, kind: Kind, key: str, now: float) -> None:
        """Count a read as a use, best-effort: never waits for the write lock, never raises.

        A use that cannot be written now is kept and written by this process's next write;
        losing some only changes which entry the LRU bound evicts first.
        """
        if self.read_only:
            return
        if len(self._pending) >= _MAX_PENDING_USES:
            self._pending.pop(next(iter(self._pending)))
        self._pending[(kind, key)] = max(now, self._pending.get((kind, key), now))
        # Batched: a commit (and its WAL fsync) per read cost ten times the read itself. Uses
        # go out with this process's next write, or here at most every USE_FLUSH_SECONDS.
        due = time.monotonic()
        if due < self._next_flush or not self._lock.acquire(blocking=False):
            return
        self._next_flush = due + USE_FLUSH_SECONDS
        try:
            self._conn.execute("PRAGMA busy_timeout = 0")
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    self._flush_uses(Transaction(self._conn))
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
            finally:
                self._conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        except (sqlite3.Error, OSError):
            pass  # busy, full or read-only: the use is kept for the next write, or lost
        finally:
            self._lock.release()

    def _read(
        self, sql: str, args: tuple[object, ...] = (), *, wait: bool = True
    ) -> list[tuple[object, ...]]:
        if not self._read_lock.acquire(timeout=BUSY_MS / 1000 if wait else 0):
            raise IndexBusy
        try:
            return self._reader.execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                raise IndexBusy from exc
            raise
        finally:
            self._read_lock.release()

    def lookup(self, kind: Kind, key: str, *, wait: bool = True) -> Row | None:
        """The row of ``key``, expired or not; ``wait=False``: IndexBusy at once if in use."""
        rows = self._read(
            "SELECT digest, size, expires_at, layout FROM entries WHERE kind = ? AND key = ?",
            (kind, key),
            wait=wait,
        )
        if not rows:
            return None
        digest, size, expires_at, layout = rows[0]
        when = _number(expires_at)
        if (
            not (isinstance(digest, str) and _HEX.fullmatch(digest))
            or not (isinstance(size, int) and size >= 0)
            or when is None
            or not (layout is None or isinstance(layout, bytes))
        ):
            raise CorruptRowError("the index row of this entry is corrupt")
        return Row(digest, size, when, layout)

    def entries(self) -> list[Entry]:
        """Every recorded entry."""
        rows = self._read("SELECT kind, key, digest, size, expires_at FROM entries")
        entries = []
        for row in rows:
            with contextlib.suppress(CorruptRowError):  # a row naming no entry has no file
                entries.append(_entry(*row))
        return entries

    def counts(self, now: float) -> dict[str, int]:
        """Live entries per kind."""
        rows = self._read(
            "SELECT kind, count(*) FROM entries WHERE expires_at > ? GROUP BY kind", (now,)
        )
        return {str(kind): int(n) for kind, n in rows if isinstance(n, int)}

    def close(self) -> None:
        """Close the connections (only :func:`release` calls this, once nobody uses it)."""
        if self._reader is not self._conn:
            self._reader.close()
        self._conn.close()


def _own_files(path: str) -> None:
    """Make sure the index and its -wal/-shm are private regular files of ours, one link each.

    The index is created here, 0600, before SQLite opens it: SQLite gives the -wal and -shm it
    creates the database file's mode, and a database it creates itself gets 0644 (or 0666
    under umask 0). A hard link (into another database) or another owner is refused; a mode
    left open by an older build is narrowed.
    """
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600))
    for name in (path, path + "-wal", path + "-shm"):
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeStoreError("store index is a symlink", name) from exc
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise UnsafeStoreError("store index is not a regular file of ours", name)
            if st.st_nlink != 1:
                raise UnsafeStoreError("store index has other hard links", name)
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def _connect(path: str, *, schema: bool = True) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, timeout=BUSY_MS / 1000, isolation_level=None, check_same_thread=False
    )
    try:
        # The data file and its directory are fsynced; FULL makes the row as durable.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        if (
            schema
            and not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'counts'").fetchone()
        ):
            # One writer at a time creates the schema, so concurrent first opens agree.
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
    except BaseException:
        conn.close()
        raise
    return conn


def _connect_read_only(path: str) -> sqlite3.Connection:
    uri = "file:" + urllib.parse.quote(path) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.execute("SELECT 1 FROM entries LIMIT 1").fetchall()
    except sqlite3.OperationalError:
        # WAL needs its -shm file; on a read-only mount nobody can change the database.
        conn = sqlite3.connect(
            uri + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False
        )
    return conn


class _Slot:
    __slots__ = ("index", "users")

    def __init__(self, index: Index) -> None:
        self.index = index
        self.users = 0


# One connection per process and root, reopened after fork. Insertion order is recency.
_open: collections.OrderedDict[tuple[int, str], _Slot] = collections.OrderedDict()
# Indexes whose file was removed or replaced, still in use: closed when their last user leaves.
_retired: dict[int, _Slot] = {}
_open_lock = threading.Lock()


def acquire(root: str) -> Index:
    """The shared index of ``root``, opened if needed; pair every call with :func:`release`.

    An index whose file was removed or replaced since it was opened is retired and a fresh
    one opened, so a process never goes on writing to an orphan.
    """
    key = (os.getpid(), root)
    with _open_lock:
        slot = _open.get(key)
        if slot is not None and not slot.index.is_current():
            del _open[key]
            _retire(slot)
            slot = None
        if slot is None:
            slot = _open[key] = _Slot(Index(root))
        _open.move_to_end(key)
        slot.users += 1
        return slot.index


def acquire_now(root: str) -> Index | None:
    """Like :func:`acquire`, but never waits or opens: the index if already open and current.

    For the event loop thread (small reads inline); None means "take a worker thread".
    """
    if not _open_lock.acquire(blocking=False):
        return None
    try:
        slot = _open.get((os.getpid(), root))
        if slot is None or not slot.index.is_current():
            return None
        slot.users += 1
        return slot.index
    finally:
        _open_lock.release()


def _retire(slot: _Slot) -> None:
    if slot.users == 0:
        slot.index.close()
    else:
        _retired[id(slot.index)] = slot


def release(index: Index, *, close_idle: bool = True) -> None:
    """Let go of ``index``; close the least recently used idle ones beyond the cache size.

    ``close_idle=False`` (on the event loop thread) leaves that to the next release: closing
    a WAL database checkpoints it, a write and an fsync.
    """
    with _open_lock:
        slot = _open.get((os.getpid(), index.root))
        if slot is not None and slot.index is index:
            slot.users -= 1
        elif (retired := _retired.get(id(index))) is not None:
            retired.users -= 1
            if retired.users == 0:
                del _retired[id(index)]
                index.close()
        idle = [key for key, slot in _open.items() if slot.users == 0] if close_idle else []
        for key in idle[: max(0, len(idle) - MAX_IDLE_INDEXES)]:
            _open.pop(key).index.close()


def close_all() -> None:
    """Close every idle index of this process (tests, and hosts that want their fds back)."""
    with _open_lock:
        for key in [key for key, slot in _open.items() if slot.users == 0]:
            _open.pop(key).index.close()
