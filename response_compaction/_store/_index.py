"""The SQLite index: one row per entry for TTL and LRU. SQL only; files are the caller's job.

Every method blocks; the store calls them through its file backend's worker threads. Writes
happen inside :meth:`Index.transaction`, which holds the database's write lock
(``BEGIN IMMEDIATE``), so the caller can rename or unlink files under the same lock.

Connections are shared per process and root through :func:`acquire` / :func:`release`: an
index in use is never closed, and at most ``MAX_IDLE_INDEXES`` idle ones stay open.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from typing import NamedTuple

from .._errors import UnsafeStoreError
from ._paths import Kind

__all__ = [
    "MAX_IDLE_INDEXES",
    "Entry",
    "Index",
    "Row",
    "Transaction",
    "acquire",
    "close_all",
    "release",
]

MAX_IDLE_INDEXES = 8
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


class Transaction:
    """The write statements, valid only inside :meth:`Index.transaction`."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def is_live(self, kind: Kind, key: str, now: float) -> bool:
        """Whether ``key`` has an unexpired row."""
        row = self._conn.execute(
            "SELECT expires_at FROM entries WHERE kind = ? AND key = ?", (kind, key)
        ).fetchone()
        return row is not None and float(row[0]) > now

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
            if counted is None or counted[0] <= max_entries:
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

    def delete(self, kind: Kind, key: str) -> None:
        """Drop one row."""
        self._conn.execute("DELETE FROM entries WHERE kind = ? AND key = ?", (kind, key))

    def keys(self, kind: Kind) -> set[str]:
        """Every recorded key of ``kind``, expired or not."""
        return {
            key for (key,) in self._conn.execute("SELECT key FROM entries WHERE kind = ?", (kind,))
        }


class Index:
    """One connection to one root's ``index.sqlite3``."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._lock = threading.Lock()
        path = os.path.join(root, "index.sqlite3")
        if os.path.islink(path):
            raise UnsafeStoreError("store index is a symlink", path)
        self._conn = sqlite3.connect(
            path, timeout=60, isolation_level=None, check_same_thread=False
        )
        try:
            # The data file and its directory are fsynced; FULL makes the row as durable.
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            # One writer at a time creates the schema, so concurrent first opens agree.
            with self.transaction():
                for statement in _SCHEMA:
                    self._conn.execute(statement)
            os.chmod(path, 0o600)
        except BaseException:
            self._conn.close()
            raise

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Hold the write lock; commit on success, roll back on any exception."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield Transaction(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def lookup(self, kind: Kind, key: str) -> Row | None:
        """The row of ``key``, expired or not."""
        with self._lock:
            row = self._conn.execute(
                "SELECT digest, size, expires_at, layout FROM entries WHERE kind = ? AND key = ?",
                (kind, key),
            ).fetchone()
        return None if row is None else Row(str(row[0]), int(row[1]), float(row[2]), row[3])

    def touch(self, kind: Kind, key: str, now: float) -> None:
        """Count a read as a use."""
        with self._lock:
            self._conn.execute(
                "UPDATE entries SET last_used = max(last_used, ?) WHERE kind = ? AND key = ?",
                (now, kind, key),
            )

    def entries(self) -> list[Entry]:
        """Every recorded entry."""
        with self._lock:
            rows = self._conn.execute("SELECT kind, key, digest, size, expires_at FROM entries")
            return [Entry(*row) for row in rows]

    def counts(self, now: float) -> dict[str, int]:
        """Live entries per kind."""
        with self._lock:
            return {
                str(kind): int(n)
                for kind, n in self._conn.execute(
                    "SELECT kind, count(*) FROM entries WHERE expires_at > ? GROUP BY kind", (now,)
                )
            }

    def close(self) -> None:
        """Close the connection (only :func:`release` calls this, once nobody uses it)."""
        self._conn.close()


class _Slot:
    __slots__ = ("index", "users")

    def __init__(self, index: Index) -> None:
        self.index = index
        self.users = 0


# One connection per process and root, reopened after fork. Insertion order is recency.
_open: collections.OrderedDict[tuple[int, str], _Slot] = collections.OrderedDict()
_open_lock = threading.Lock()


def acquire(root: str) -> Index:
    """The shared index of ``root``, opened if needed; pair every call with :func:`release`."""
    key = (os.getpid(), root)
    with _open_lock:
        slot = _open.get(key)
        if slot is None:
            slot = _open[key] = _Slot(Index(root))
        _open.move_to_end(key)
        slot.users += 1
        return slot.index


def release(index: Index) -> None:
    """Let go of ``index``; close the least recently used idle ones beyond the cache size."""
    with _open_lock:
        slot = _open.get((os.getpid(), index.root))
        if slot is not None and slot.index is index:
            slot.users -= 1
        idle = [key for key, slot in _open.items() if slot.users == 0]
        for key in idle[: max(0, len(idle) - MAX_IDLE_INDEXES)]:
            _open.pop(key).index.close()


def close_all() -> None:
    """Close every idle index of this process (tests, and hosts that want their fds back)."""
    with _open_lock:
        for key in [key for key, slot in _open.items() if slot.users == 0]:
            _open.pop(key).index.close()
