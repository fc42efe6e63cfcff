"""The SQLite index: one row per entry for TTL and LRU. SQL only; files are the caller's job.

Every method blocks; the store calls them through its file backend's worker threads. Writes
happen inside :meth:`Index.transaction`, which holds the database's write lock
(``BEGIN IMMEDIATE``), so the caller can rename or unlink files under the same lock.

No method waits for a lock for long: a worker thread cannot be cancelled, so a lock held by
another thread or process raises :class:`IndexBusy` after at most ``BUSY_MS`` and the caller
retries from the event loop, where the caller's deadline can stop it. Reads go through their
own connection and never need the write lock (WAL readers do not block on a writer); a read's
"use" for the LRU order is recorded best-effort (:meth:`Index.record_use`).

One index per process and root is shared through ``_indexes``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

from .._errors import StoreError
from ._clocks import writer_id
from ._paths import Kind
from ._sqlite import (
    BUSY_MS,
    READONLY_CODES,
    IndexBusy,
    busy,
    check_schema,
    connect,
    connect_read_only,
    identity,
    own_files,
    refused,
    schema_version,
)
from ._tx import (
    HAS_ROW,
    HEX,
    LOOKUP,
    CorruptRowError,
    Entry,
    Row,
    Transaction,
    entry_of,
    number,
)
from ._wal import SETTLED, WalIndex, settings

__all__ = [
    "BUSY_MS",
    "CorruptRowError",
    "Entry",
    "Index",
    "IndexBusy",
    "IndexReplacedError",
    "Row",
    "Transaction",
]

#: Uses not yet written to the index (the write lock was busy) are kept up to this many.
_MAX_PENDING_USES = 4096
#: Uses recorded by reads are written at most this often (and with every write before that).
USE_FLUSH_SECONDS = 1.0
#: A commit on the event loop thread writes at most this many of them (each a few frames).
_LOOP_USES = 16


class IndexReplacedError(StoreError):
    """``index.sqlite3`` is not the file this connection has open any more."""


class _Witness:
    """The highest clock at which a lookup of this process found a row of one store expired.

    Reads record no clock of their own otherwise, so a clock that then went back revived the
    entry. It raises the attested time of this process's lookups at once, and is recorded in
    the index with the next write (best effort, like a use). One per store root, not per
    connection: an index closed as idle, or reopened, keeps it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # lookups run on the loop thread and in worker threads
        self.now = 0.0
        self._written = 0.0

    def forked(self) -> None:
        """In a forked child: the lock may have been held by a thread that does not exist here."""
        self._lock = threading.Lock()

    def saw_expired(self, now: float) -> None:
        with self._lock:
            self.now = max(self.now, now)

    def unwritten(self) -> float | None:
        """The time to record with the next write, if there is one."""
        now = self.now
        return now if now > self._written else None

    def written(self, now: float | None) -> None:
        """``now`` was committed (not just written: a rolled-back write keeps it due)."""
        if now is not None:
            with self._lock:
                self._written = max(self._written, now)


_witnesses: dict[str, _Witness] = {}


def _new_witness_locks_in_child() -> None:
    for witness in _witnesses.values():
        witness.forked()


os.register_at_fork(after_in_child=_new_witness_locks_in_child)


class Index:
    """One root's ``index.sqlite3``: a writer connection and a reader connection."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.read_only = False
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._pending: dict[tuple[Kind, str], float] = {}
        self._next_flush = 0.0
        self._witness = _witnesses.setdefault(root, _Witness())  # outlives this connection
        self._wal = WalIndex(root)
        self._unsettled = False  # True: the write connection's settings are not the defaults
        path = os.path.join(root, "index.sqlite3")
        own_files(path)
        try:
            self._conn = connect(path)
        except sqlite3.OperationalError as exc:
            if busy(exc):
                raise IndexBusy from exc
            if getattr(exc, "sqlite_errorcode", None) not in READONLY_CODES:
                raise
            # A read-only mount: reads and verify still work, writes raise.
            self._conn = connect_read_only(path)
            self.read_only = True
        self.path = path
        try:
            self._identity = identity(path)
            # Not read here: a change between connect's check and this read would pass as
            # checked. The first write transaction checks, under the write lock.
            self._schema = -1
            self._reader = self._conn if self.read_only else connect(path, schema=False)
            # One cursor per connection, used under that connection's lock: a cursor made per
            # statement cost a small read 0.2 us of its 45.
            self._reads = self._reader.cursor()
            self._writes = self._conn.cursor()
        except BaseException:
            self._conn.close()
            raise

    def is_current(self) -> bool:
        """Whether ``index.sqlite3`` is still the file this index opened (not removed, replaced)."""
        try:
            return identity(self.path) == self._identity
        except FileNotFoundError:
            return False

    def _check_current(self) -> None:
        if not self.is_current():
            raise IndexReplacedError(
                "the store index was removed or replaced while this process used it;"
                " nothing was recorded, and the next call reopens it"
            )

    @contextlib.contextmanager
    def transaction(
        self, *, durable: bool = True, wait: bool = True, on_loop: bool = False
    ) -> Iterator[Transaction]:
        """Hold the write lock; commit on success, roll back on any exception.

        ``durable=False`` commits without syncing the WAL (``synchronous=NORMAL`` for this
        transaction only): a crash may lose it, never tear it, and the next durable commit of
        any connection makes it durable too (the WAL is synced as a whole, in order). Only for
        changes whose loss is harmless (see ``_commit.renew``). ``wait=False``: never waits
        for a lock, here or in SQLite (:class:`IndexBusy` at once).

        ``on_loop=True`` (the event loop thread): neither durable nor waiting, and never an
        fsync: :class:`IndexBusy` if more than a few uses wait to be written or the commit
        would sync the log (``_wal``); its COMMIT never checkpoints.

        Raises :class:`IndexBusy` (before anything was done) when the lock is not free, and
        :class:`IndexReplacedError` when ``index.sqlite3`` is no longer the file this
        connection writes to: rows committed to an orphan would be receipts no other process
        can honour. Checked once the lock is held and again just before the commit.
        """
        if self.read_only:
            raise sqlite3.OperationalError("the store index is on a read-only file system")
        wait = wait and not on_loop
        before, after = settings(durable=durable and not on_loop, wait=wait, checkpoint=not on_loop)
        if on_loop and len(self._pending) > _LOOP_USES:
            raise IndexBusy
        if not self._lock.acquire(timeout=BUSY_MS / 1000 if wait else 0):
            raise IndexBusy
        try:
            self._set(SETTLED if self._unsettled else ())  # set back what could not be
            self._set(before)
            self._begin()
            try:
                self._check_current()
                self._check_schema()
                if on_loop:
                    self._check_unsynced()
                tx = Transaction(self._conn)
                witnessed = self._flush_uses(tx)
                yield tx
                self._check_current()
                self._conn.execute("COMMIT")
                self._witness.written(witnessed)
            except BaseException as exc:
                # SQLite may have rolled back already (a full disk during COMMIT does): a
                # second ROLLBACK would replace the real error with "no transaction is active".
                if self._conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error) and (unsafe := refused(exc, self.path)):
                    raise unsafe from exc
                raise
        finally:
            self._set_back(after)

    def _check_schema(self) -> None:
        """Check the schema again if any connection changed it since (UnsafeStoreError).

        Under the write lock nobody else changes it until the commit: a trigger of ours
        rewritten meanwhile (its name is allowed by the authorizer) is found before it runs.
        """
        version = schema_version(self._conn)
        if version != self._schema:
            check_schema(self._conn, self.path)
            self._schema = version

    def _set(self, statements: tuple[str, ...]) -> None:
        self._unsettled = True  # until every one has run
        for statement in statements:
            self._conn.execute(statement)
        self._unsettled = False

    def _set_back(self, statements: tuple[str, ...]) -> None:
        """Undo a transaction's settings and let go of the lock, whatever failed before."""
        try:
            if self._conn.in_transaction:  # its ROLLBACK failed; no setting changes inside one
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
            self._set(statements)
        finally:
            self._lock.release()

    def _begin(self) -> None:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if busy(exc):
                raise IndexBusy from exc
            raise

    def _check_unsynced(self) -> None:
        if not self._wal.appends_unsynced():  # read under the lock (see _wal)
            raise IndexBusy

    def _flush_uses(self, tx: Transaction) -> float | None:
        """Write the uses noted so far, and the clock witnessed if not yet written (which)."""
        witnessed = self._witness.unwritten()
        if witnessed is not None:
            tx.saw(witnessed)
        pending, self._pending = self._pending, {}
        # A copy made in one step: a worker's record_use may still add to ``pending`` (that
        # use is lost: best-effort), and iterating a dict that grows raises.
        for (kind, key), when in list(pending.items()):
            tx.touch(kind, key, when)
        return witnessed

    def record_use(self, kind: Kind, key: str, now: float) -> None:
        """Note a read as a use, best-effort: never waits, never writes, never raises.

        The uses noted go out with this process's next write, or in a batch at most every
        ``USE_FLUSH_SECONDS`` (``_indexes.note_use``); losing some only changes which entry
        the LRU bound evicts first.
        """
        if self.read_only:
            return
        # One reference: a writer's _flush_uses may swap in an empty dict between two reads
        # of the attribute (next(iter({})) raised StopIteration); a use noted in the old one
        # is then lost, as a use noted during its flush is.
        pending = self._pending
        if len(pending) >= _MAX_PENDING_USES:
            with contextlib.suppress(StopIteration, RuntimeError, KeyError):  # another reader's
                pending.pop(next(iter(pending)))
        pending[(kind, key)] = max(now, pending.get((kind, key), now))

    def take_flush(self) -> bool:
        """Whether a batch of uses is due now; if so the next one is due an interval later.

        True hands the caller the batch: it writes it (:meth:`flush_uses`) or has it written.
        """
        due = time.monotonic()
        if not self._pending or due < self._next_flush:
            return False
        self._next_flush = due + USE_FLUSH_SECONDS
        return True

    def flush_uses(self, now: float) -> None:
        """Write the uses noted so far in a commit that does not sync; best-effort."""
        # Busy, full or read-only: the uses are kept for the next write, or lost.
        quietly = contextlib.suppress(IndexBusy, sqlite3.Error, OSError)
        with quietly, self.transaction(durable=False, wait=False) as tx:
            tx.saw(now)

    def _read(
        self, sql: str, args: Any = (), *, wait: bool = True, writer: bool = False
    ) -> list[tuple[object, ...]]:
        lock, cursor = self._read_lock, self._reads
        # A writer about to write reads through its own connection when it is free: every
        # commit empties the reader connection's page cache, so its next read fetches the
        # pages again (it cost a small put 40-50 us); the writer's cache stays valid.
        if writer and self._lock.acquire(blocking=False):
            lock, cursor = self._lock, self._writes
        elif not lock.acquire(timeout=BUSY_MS / 1000 if wait else 0):
            raise IndexBusy
        try:
            return cursor.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as exc:
            if busy(exc):
                raise IndexBusy from exc
            if unsafe := refused(exc, self.path):
                raise unsafe from exc
            raise
        finally:
            lock.release()

    def lookup(
        self, kind: Kind, key: str, now: float = 0.0, *, wait: bool = True, writer: bool = False
    ) -> Row | None:
        """The row of ``key``, expired or not, with the attested time at ``now``.

        ``wait=False`` (on the event loop thread): :class:`IndexBusy` at once if in use.
        ``writer=True``: for a writer that commits next (through the write connection if free).
        """
        rows = self._read(
            LOOKUP, (kind, key, now, writer_id()), wait=wait, writer=writer and not self.read_only
        )
        if not rows:
            return None
        digest, size, expires_at, layout, attested = rows[0]
        when = number(expires_at)
        if (
            not (isinstance(digest, str) and HEX.fullmatch(digest))
            or not (isinstance(size, int) and size >= 0)
            or when is None
        ):
            raise CorruptRowError("the index row of this entry is corrupt")
        hint = layout if isinstance(layout, bytes) else None  # a layout is only a hint
        if when <= now and now > self._witness.now:
            self._witness.saw_expired(now)
        return Row(digest, size, when, hint, max(number(attested) or now, self._witness.now))

    def has_row(self, kind: Kind, key: str) -> bool:
        """Whether ``key`` is recorded, expired or not (the writer's connection if free)."""
        return bool(self._read(HAS_ROW, (kind, key), writer=not self.read_only))

    def entries(self) -> list[Entry]:
        """Every recorded entry."""
        rows = self._read("SELECT kind, key, digest, size, expires_at FROM entries")
        entries = []
        for row in rows:
            with contextlib.suppress(CorruptRowError):  # a row naming no entry has no file
                entries.append(entry_of(*row))
        return entries

    def counts(self, now: float) -> dict[str, int]:
        """Live entries per kind."""
        rows = self._read(
            "SELECT kind, count(*) FROM entries WHERE expires_at > ? GROUP BY kind", (now,)
        )
        return {str(kind): int(n) for kind, n in rows if isinstance(n, int)}

    def close(self) -> None:
        """Close the connections (only ``_indexes`` calls this, once nobody uses it)."""
        if self._reader is not self._conn:
            self._reader.close()
        self._conn.close()
        self._wal.close()
