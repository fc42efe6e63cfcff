"""Opening ``index.sqlite3`` safely: our own private file, WAL, a short busy timeout, the schema.

Nothing here waits long for a lock: a worker thread cannot be cancelled, so a lock held
elsewhere surfaces as :class:`IndexBusy` after at most ``BUSY_MS`` and the caller retries from
the event loop.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sqlite3
import stat
import urllib.parse

from .._errors import UnsafeStoreError
from ._paths import fsync_parent

__all__ = [
    "BUSY_MS",
    "CHECKPOINT_FRAMES",
    "READONLY_CODES",
    "IndexBusy",
    "busy",
    "check_schema",
    "connect",
    "connect_read_only",
    "identity",
    "own_files",
    "refused",
    "schema_version",
]

#: The longest a worker thread waits inside SQLite for a lock before giving the event loop back.
BUSY_MS = 20
#: The log's frames at which a commit checkpoints it (``wal_autocheckpoint``, set at connect).
CHECKPOINT_FRAMES = 1000
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_BUSY_CODES = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED
READONLY_CODES = frozenset({8, 14})  # SQLITE_READONLY, SQLITE_CANTOPEN

# Rows per kind are counted by triggers: a count(*) on every commit grew with the store
# (1.4 ms at 10,000 rows, 14 ms at 100,000).
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS entries (
        kind TEXT NOT NULL, key TEXT NOT NULL, digest TEXT NOT NULL,
        size INTEGER NOT NULL, expires_at REAL NOT NULL, last_used REAL NOT NULL,
        layout BLOB, writer TEXT, PRIMARY KEY (kind, key)) WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS clocks (writer TEXT PRIMARY KEY, seen REAL NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS entries_lru ON entries (kind, last_used)",
    "CREATE INDEX IF NOT EXISTS entries_expiry ON entries (expires_at)",
    "CREATE TABLE IF NOT EXISTS counts (kind TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID",
    """CREATE TRIGGER IF NOT EXISTS entries_added AFTER INSERT ON entries BEGIN
        INSERT INTO counts VALUES (NEW.kind, 1) ON CONFLICT (kind) DO UPDATE SET n = n + 1;
    END""",
    """CREATE TRIGGER IF NOT EXISTS entries_removed AFTER DELETE ON entries BEGIN
        UPDATE counts SET n = n - 1 WHERE kind = OLD.kind;
    END""",
    # Every read asks for the second-highest clock (_clocks.attested_sql): without it, a
    # sort of the table in a temp B-tree (1.4 us of a 5 us lookup with one writer, 9 us at
    # 61 writers). Last, so an index of an older build, which lacks it, is brought up to date.
    "CREATE INDEX IF NOT EXISTS clocks_seen ON clocks (seen)",
)
#: The schema object created last: an index that has it has every one.
_LAST = "clocks_seen"
_OBJECTS = frozenset((statement.split()[1].lower(), statement.split()[5]) for statement in _SCHEMA)
_TRIGGER_NAMES = frozenset(name for kind, name in _OBJECTS if kind == "trigger")
_SQLITE_AUTH = 23
_UNSAFE = "store index has schema objects this library did not make"


class IndexBusy(Exception):  # noqa: N818 - a signal to retry, not an error anyone sees
    """The write lock is held by another thread or process right now; retry later."""


def busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in _BUSY_CODES or "locked" in str(exc)


def identity(path: str) -> tuple[int, int]:
    st = os.stat(path, follow_symlinks=False)
    return st.st_dev, st.st_ino


def own_files(path: str) -> None:
    """Make sure the index and its -wal/-shm are private regular files of ours, one link each.

    The index is created here, 0600, before SQLite opens it: SQLite gives the -wal and -shm it
    creates the database file's mode, and a database it creates itself gets 0644 (or 0666
    under umask 0). A hard link (into another database) or another owner is refused; a mode
    left open by an older build is narrowed.
    """
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600))
    except FileExistsError:
        pass
    else:
        fsync_parent(path)  # the index's name is as durable as the entries it records
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
            if st.st_nlink == 0 and name != path:
                continue  # removed since: the last other connection (any process) closed
            if st.st_nlink != 1:
                raise UnsafeStoreError("store index has other hard links", name)
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def connect(path: str, *, schema: bool = True) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, timeout=BUSY_MS / 1000, isolation_level=None, check_same_thread=False
    )
    try:
        # The data file and its directory are fsynced; FULL makes the row as durable.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA wal_autocheckpoint={CHECKPOINT_FRAMES}")
        if (
            schema
            and not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (_LAST,)).fetchone()
        ):
            # One writer at a time creates the schema, so concurrent first opens agree.
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    conn.execute(statement)
                columns = {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
                if "writer" not in columns:  # an index from before the clock rules
                    conn.execute("ALTER TABLE entries ADD COLUMN writer TEXT")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        if schema:
            check_schema(conn, path)
        conn.set_authorizer(_authorize)
    except BaseException:
        conn.close()
        raise
    return conn


def check_schema(conn: sqlite3.Connection, path: str, *, complete: bool = True) -> None:
    """Refuse an index whose schema this library did not make (:class:`UnsafeStoreError`).

    Every object's SQL must be ours, as SQLite keeps it: a view in place of a table, a trigger
    of someone else's, one of ours rewritten, a table remade with a costly generated column or
    CHECK runs its SQL inside our statements (an endless recursive one hung every read and
    write: adversarial review). ``complete=False`` (a read-only index, which nobody brings up
    to date) lets an index of an older build lack the object created last.
    """
    found = {(kind, name): sql for kind, name, sql in conn.execute(_LIST_SCHEMA)}
    known = _known_sql()
    missing = known.keys() - found.keys()
    if (
        any(known.get(item) != sql or sql is None for item, sql in found.items())
        or (missing and (complete or missing != {("index", _LAST)}))
    ):  # fmt: skip
        raise UnsafeStoreError(_UNSAFE, path)


_LIST_SCHEMA = "SELECT type, name, sql FROM sqlite_master"


@functools.cache
def _known_sql() -> dict[tuple[str, str], str]:
    """The SQL SQLite keeps for each of our objects, as it keeps it (made in memory once).

    An ``entries`` made without the writer column and given it by :func:`connect` has the
    same text (SQLite puts the column where this schema has it).
    """
    with contextlib.closing(sqlite3.connect(":memory:", isolation_level=None)) as fresh:
        for statement in _SCHEMA:
            fresh.execute(statement)
        return {(kind, name): sql for kind, name, sql in fresh.execute(_LIST_SCHEMA)}


def schema_version(conn: sqlite3.Connection) -> int:
    """The number SQLite bumps on every schema change, by any connection."""
    (version,) = conn.execute("PRAGMA schema_version").fetchone()
    return int(version)


def _authorize(
    action: int, _1: str | None, _2: str | None, _db: str | None, source: str | None
) -> int:
    """Deny SQL run on behalf of a view or a trigger not ours, and any recursive query.

    A schema changed while a connection is open (by another process) is not checked again
    by :func:`check_schema`; SQLite prepares our statements again, and this sees what they
    would run: a view put in place of a table, a trigger added, an endless recursive query.
    """
    if action == sqlite3.SQLITE_RECURSIVE:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK if source is None or source in _TRIGGER_NAMES else sqlite3.SQLITE_DENY


def refused(exc: sqlite3.Error, path: str) -> UnsafeStoreError | None:
    """The :class:`UnsafeStoreError` for a statement the authorizer denied, else None."""
    if getattr(exc, "sqlite_errorcode", None) == _SQLITE_AUTH:
        return UnsafeStoreError(_UNSAFE, path)
    return None


def connect_read_only(path: str) -> sqlite3.Connection:
    uri = "file:" + urllib.parse.quote(path) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.execute("SELECT 1 FROM entries LIMIT 1").fetchall()
    except sqlite3.OperationalError:
        # WAL needs its -shm file; on a read-only mount nobody can change the database.
        conn = sqlite3.connect(
            uri + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False
        )
    try:
        check_schema(conn, path, complete=False)
    except BaseException:
        conn.close()
        raise
    conn.set_authorizer(_authorize)
    return conn
