"""The index's own bookkeeping: the row counter.

The test that upgraded "an index from an older build" in place is gone with that upgrade:
no release ever wrote an index without the layout column and the row counter (issue 8).
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import response_compaction as rc
from response_compaction._errors import map_errors
from response_compaction._store import ROOT_NAME, _index, _indexes, _sqlite, open_store
from response_compaction._store._paths import prepare_root
from response_compaction._store._tx import LOOKUP
from tests._store_support import hex_of, index_settings, store_root
from tests.conftest import FakeClock
from tests.schemas import FALLBACK, Exact, Row, Summary

pytestmark = pytest.mark.anyio


def _value(i: int) -> Exact:
    return Exact(rows=[Row(id=i, name=f"row {i}")], total=1)


def _index_path(workspace: rc.LocalWorkspace) -> Path:
    return Path(workspace.workspace_temp_dir()) / ROOT_NAME / "index.sqlite3"


async def test_the_row_counter_matches_the_rows_through_stores_reuses_and_evictions(
    harness: rc.Harness, workspace: rc.LocalWorkspace, clock: FakeClock
) -> None:
    """Triggers keep counts.n equal to count(*) per kind, and the bound still holds."""
    options = {"fallback": FALLBACK, "ladder": "cheap", "max_entries": 3, "ttl_seconds": 50}
    for i in range(10):
        await rc.response_compact(harness, _value(i % 6), Exact, Summary, options)
        clock.advance(7)
    with sqlite3.connect(_index_path(workspace)) as conn:
        (rows,) = conn.execute("SELECT count(*) FROM entries WHERE kind = 'exact'").fetchone()
        (counted,) = conn.execute("SELECT n FROM counts WHERE kind = 'exact'").fetchone()
    assert rows == counted
    assert rows <= 3


def test_an_index_in_use_stays_open_and_idle_ones_beyond_the_cap_close(tmp_path: Path) -> None:
    """Shared connections are reference counted: never closed in use, at most the cap idle."""
    _indexes.close_all()
    roots = [prepare_root(str(tmp_path / f"ws{n}")) for n in range(_indexes.MAX_IDLE_INDEXES + 3)]
    held = [_indexes.acquire(root) for root in roots]
    for index in held[1:]:
        _indexes.release(index)
    # The first is still in use although it is the least recently opened: it still works.
    assert held[0].counts(0.0) == {}
    _indexes.wait_for_closes()  # closed in a helper thread, off the releasing call's path
    with pytest.raises(sqlite3.ProgrammingError):
        held[1].counts(0.0)  # idle and beyond the cap: closed
    assert held[-1].counts(0.0) == {}
    _indexes.release(held[0])
    _indexes.close_all()
    with pytest.raises(sqlite3.ProgrammingError):
        held[0].counts(0.0)
    fresh = _indexes.acquire(roots[0])
    assert fresh is not held[0]  # a new connection after close_all
    _indexes.release(fresh)
    _indexes.close_all()


def test_an_index_let_go_beyond_the_cap_closes_off_the_releasing_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing (a checkpoint: a write and an fsync) is not paid by whoever released last.

    Each close here waits for a gate the test opens only after ``release`` returned: a close
    run by the releasing call would block it for the gate's whole timeout, then be seen.
    """
    _indexes.close_all()
    gate, closed = threading.Event(), threading.Event()
    close = _index.Index.close

    def gated(index: _index.Index) -> None:
        gate.wait(timeout=60)
        close(index)
        closed.set()

    monkeypatch.setattr(_index.Index, "close", gated)
    roots = [prepare_root(str(tmp_path / f"ws{n}")) for n in range(_indexes.MAX_IDLE_INDEXES + 1)]
    held = [_indexes.acquire(root) for root in roots]
    try:
        for index in held:
            _indexes.release(index)  # the last one's release lets the first go
        assert not closed.is_set()
        assert held[0].counts(0.0) == {}  # out of the table, not closed yet
    finally:
        gate.set()
    _indexes.wait_for_closes()
    assert closed.is_set()
    with pytest.raises(sqlite3.ProgrammingError):
        held[0].counts(0.0)
    fresh = _indexes.acquire(roots[0])
    assert fresh is not held[0]
    assert fresh.counts(0.0) == {}
    _indexes.release(fresh)
    _indexes.close_all()


def test_map_errors_names_the_action_and_the_type_not_the_value() -> None:
    """OSError and sqlite errors leave as StoreError with the action, errno and type name."""
    with pytest.raises(rc.StoreError) as info, map_errors("could not read the exact entry"):
        raise OSError(5, "Input/output error")
    assert info.value.errno == 5
    assert "could not read the exact entry: Input/output error" in str(info.value)
    with pytest.raises(rc.StoreError, match="DatabaseError"), map_errors("index"):
        raise sqlite3.DatabaseError("file is not a database")
    unsafe = rc.UnsafeStoreError("store path is a symlink", "/x")
    with pytest.raises(rc.UnsafeStoreError) as passed, map_errors("anything"):
        raise unsafe
    assert passed.value is unsafe


def test_an_error_after_sqlite_rolled_back_on_its_own_is_the_error_raised(tmp_path: Path) -> None:
    """When SQLite already rolled back (a full disk mid-statement), the real error surfaces."""
    index = _indexes.acquire(prepare_root(str(tmp_path / "ws")))
    try:
        full = sqlite3.OperationalError("database or disk is full")

        def fail_after_sqlite_rolled_back() -> None:
            with index.transaction():
                index._conn.execute("ROLLBACK")  # what SQLite does by itself on SQLITE_FULL
                raise full

        with pytest.raises(sqlite3.OperationalError) as info:
            fail_after_sqlite_rolled_back()
        assert info.value is full
        with index.transaction() as tx:  # and the index is usable afterwards
            assert tx.keys("exact") == set()
    finally:
        _indexes.release(index)
        _indexes.close_all()


def test_a_setting_a_failed_set_back_left_changed_is_set_back_by_the_next_transaction(
    tmp_path: Path,
) -> None:
    """A setting that could not be set back (say an interrupt between statements) is not kept.

    Without that, the next durable, waiting transaction would run with ``busy_timeout = 0``.
    """
    index = _indexes.acquire(prepare_root(str(tmp_path / "ws")))
    refused: list[str] = []

    def refuse_busy_timeout(action: int, name: str | None, value: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_PRAGMA and name == "busy_timeout" and value and value != "0":
            refused.append(value)
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    try:
        settled = index_settings(index)
        with index._lock:
            index._conn.set_authorizer(refuse_busy_timeout)
        with pytest.raises(sqlite3.DatabaseError), index.transaction(durable=False, wait=False):
            pass
        with index._lock:
            index._conn.set_authorizer(None)
        assert refused  # the set-back did fail, after synchronous was set back
        assert index_settings(index) != settled
        with index.transaction() as tx:  # changes no setting itself
            assert tx.keys("exact") == set()
        assert index_settings(index) == settled
    finally:
        _indexes.release(index)
        _indexes.close_all()


def test_a_writers_lookup_while_the_write_lock_is_held_reads_the_committed_row(
    tmp_path: Path,
) -> None:
    """lookup(writer=True) with the write lock taken neither waits nor sees uncommitted rows."""
    index = _indexes.acquire(prepare_root(str(tmp_path / "ws")))
    key = "ab" * 32
    try:
        with index.transaction() as tx:
            tx.saw(1.0)
            tx.upsert("exact", key, _index.Row("cd" * 32, 5, 100.0, None), 1.0)
        with index.transaction() as tx:
            tx.upsert("exact", key, _index.Row("ef" * 32, 6, 200.0, None), 1.0)
            # The write lock is this thread's: the lookup takes the reader connection.
            seen = index.lookup("exact", key, 1.0, writer=True)
        assert seen is not None
        assert (seen.digest, seen.size) == ("cd" * 32, 5)
        after = index.lookup("exact", key, 1.0, writer=True)  # the lock is free again
        assert after is not None
        assert (after.digest, after.size, after.expires_at) == ("ef" * 32, 6, 200.0)
    finally:
        _indexes.release(index)
        _indexes.close_all()


@pytest.mark.parametrize(
    ("column", "cell"),
    [
        ("size", "'many'"),
        ("size", "-5"),
        ("expires_at", "'later'"),
        ("expires_at", "X'00'"),
        ("digest", "42"),
        ("digest", "'../../etc'"),
        ("layout", "17"),
    ],
)
async def test_corrupt_index_cells_read_broken_not_raw_errors(
    harness: rc.Harness, workspace: rc.LocalWorkspace, column: str, cell: str
) -> None:
    """A cell of the wrong type or range reads Broken and verify reports it; nothing raw."""
    value = _value(1)
    compacted = await rc.response_compact(
        harness, value, Exact, Summary, {"fallback": FALLBACK, "ladder": "cheap"}
    )
    with sqlite3.connect(_index_path(workspace)) as conn:
        conn.execute(f"UPDATE entries SET {column} = {cell}")  # noqa: S608 - test constants
    result = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)
    if column == "layout":
        assert result == rc.Found(value=value)  # a layout is only a hint
    else:
        assert isinstance(result, rc.Broken)
        assert "index row" in result.detail
    store = await open_store(workspace)
    reports = await store.verify()
    assert len(reports) == 1
    await store.prune(1)


async def test_a_corrupt_clock_cell_witnesses_no_expiry(
    harness: rc.Harness, workspace: rc.LocalWorkspace, clock: FakeClock
) -> None:
    """A clock cell holding text (which SQLite sorts above every number) deletes nothing."""
    options = {"fallback": FALLBACK, "ladder": "cheap", "ttl_seconds": 60}
    await rc.response_compact(harness, _value(1), Exact, Summary, options)
    with sqlite3.connect(_index_path(workspace)) as conn:
        conn.execute("UPDATE entries SET writer = 'someone else'")
        conn.execute("INSERT INTO clocks VALUES ('forged', 'far future')")
    clock.advance(120)
    await rc.response_compact(harness, _value(2), Exact, Summary, options)
    with sqlite3.connect(_index_path(workspace)) as conn:
        (rows,) = conn.execute("SELECT count(*) FROM entries").fetchone()
    assert rows == 2  # expired by this clock alone, and no honest second clock saw it


@pytest.mark.parametrize(("kind", "key"), [("exact", "../../victim"), ("../..", "victim")])
async def test_index_rows_naming_paths_outside_the_store_touch_nothing(
    harness: rc.Harness, workspace: rc.LocalWorkspace, tmp_path: Path, kind: str, key: str
) -> None:
    """Rows rewritten to name '..' paths: verify and prune neither read nor unlink outside."""
    await rc.response_compact(
        harness, _value(1), Exact, Summary, {"fallback": FALLBACK, "ladder": "cheap"}
    )
    victim = tmp_path / "ws" / "victim"
    victim.write_bytes(b"keep me")
    with sqlite3.connect(_index_path(workspace)) as conn:
        conn.execute(
            "INSERT INTO entries (kind, key, digest, size, expires_at, last_used)"
            " VALUES (?, ?, ?, 7, 0, 0)",
            (kind, key, "0" * 64),
        )
    store = await open_store(workspace)
    assert {report.key for report in await store.verify()} == {hex_of(_value(1))}
    await store.prune(0)
    assert victim.read_bytes() == b"keep me"


def test_an_index_without_the_clocks_index_gets_it_and_reads_walk_it(tmp_path: Path) -> None:
    """An index lacking clocks_seen gains it on open, and the lookup's clock scan sorts nothing."""
    _indexes.close_all()
    root = prepare_root(str(tmp_path / "ws"))
    _indexes.release(_indexes.acquire(root))
    _indexes.close_all()
    path = Path(root) / "index.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("DROP INDEX clocks_seen")
    index = _indexes.acquire(root)
    try:
        with sqlite3.connect(path) as conn:
            names = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
            plan = conn.execute(
                "EXPLAIN QUERY PLAN " + LOOKUP, ("exact", "ab" * 32, 1.0, "me")
            ).fetchall()
        assert "clocks_seen" in names
        assert not any("TEMP B-TREE" in str(step) for step in plan), plan
    finally:
        _indexes.release(index)
        _indexes.close_all()


def test_a_forked_child_knows_its_own_pid_and_writer_id() -> None:
    """The pid kept by the fork hook (not asked per call) is the child's, so is its writer id."""
    # In a fresh single-threaded interpreter: a fork of the test process (threads running)
    # can leave the child waiting forever on a lock some other thread held.
    script = """
import os
from response_compaction._store._clocks import writer_id
from response_compaction._store._paths import PROCESS
parent = writer_id()
assert PROCESS.pid == os.getpid()
child = os.fork()
if child == 0:
    ok = PROCESS.pid == os.getpid() and writer_id() not in ("", parent)
    os._exit(0 if ok else 3)
_, status = os.waitpid(child, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert writer_id() == parent and PROCESS.pid == os.getpid()
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


_ENDLESS = (
    "SELECT count(*) FROM (WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r)"
    " SELECT n FROM r)"
)
_TAMPERING = {
    # A view in place of the table: every lookup would run the endless query.
    "view": "DROP TABLE entries; CREATE VIEW entries(kind, key, digest, size, expires_at,"
    " last_used, layout, writer) AS SELECT 'exact', 'x', 'y', 1, 1.0, 1.0, NULL, NULL"
    " FROM (WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n FROM r)",
    # A trigger of someone else's on every insert.
    "foreign trigger": "CREATE TRIGGER endless BEFORE INSERT ON entries BEGIN "
    + _ENDLESS
    + "; END",
    # One of ours with its body replaced.
    "replaced trigger": "DROP TRIGGER entries_added; CREATE TRIGGER entries_added AFTER INSERT"
    " ON entries BEGIN " + _ENDLESS + "; END",
    # The table remade with a costly generated column: every read of a row ran it. Its
    # indexes and triggers are made again as they were, so only the table's SQL differs.
    "remade table": "DROP TABLE entries; "
    + _sqlite._SCHEMA[0].replace(
        "layout BLOB,", "layout BLOB, slow AS (length(printf('%.*c', 100000000, 'x'))),"
    )
    + "; "
    + "; ".join(s for s in _sqlite._SCHEMA if " ON entries " in s)
    + ";",
}


@pytest.mark.parametrize("tampering", list(_TAMPERING.values()), ids=list(_TAMPERING))
async def test_an_index_with_schema_objects_we_did_not_make_is_refused(
    harness: rc.Harness, tampering: str
) -> None:
    """Reads and writes hung forever inside SQLite (adversarial review); now the index is
    refused when it is opened, naming its path and no content."""
    out = await rc.response_compact(
        harness, {"rows": [1, 2, 3]}, dict, Summary, {"fallback": FALLBACK, "ladder": "cheap"}
    )
    _indexes.close_all()  # the next use opens it afresh, as another process would
    root = store_root(harness.fs)
    with contextlib.closing(sqlite3.connect(root / "index.sqlite3", isolation_level=None)) as db:
        db.executescript(tampering)
    with pytest.raises(rc.UnsafeStoreError, match="schema objects"):
        await rc.response_compaction_read_exact(harness, out.receipt.exact_ref, dict)
    with pytest.raises(rc.UnsafeStoreError, match="schema objects"):
        await rc.response_compact(
            harness, {"rows": [2]}, dict, Summary, {"fallback": FALLBACK, "ladder": "cheap"}
        )


@pytest.mark.parametrize("tampering", list(_TAMPERING.values()), ids=list(_TAMPERING))
async def test_an_index_changed_while_this_process_holds_it_open_is_refused(
    harness: rc.Harness, tampering: str
) -> None:
    """Checked only when opened, an index tampered with meanwhile ran the endless SQL on the
    next lookup or write (on the loop thread for inline reads); now both are refused."""
    options = {"fallback": FALLBACK, "ladder": "cheap"}
    out = await rc.response_compact(harness, {"rows": [1, 2, 3]}, dict, Summary, options)
    root = store_root(harness.fs)
    with contextlib.closing(sqlite3.connect(root / "index.sqlite3", isolation_level=None)) as db:
        db.executescript(tampering)
    if "VIEW" in tampering:  # triggers run on writes only
        with pytest.raises(rc.UnsafeStoreError, match="schema objects"):
            await rc.response_compaction_read_exact(harness, out.receipt.exact_ref, dict)
    with pytest.raises(rc.UnsafeStoreError, match="schema objects"):
        await rc.response_compact(harness, {"rows": [2]}, dict, Summary, options)
