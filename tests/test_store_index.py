"""The index's own bookkeeping: the row counter and upgrading an index from an older build."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import response_compaction as rc
from response_compaction import _store
from response_compaction._store import ROOT_NAME
from tests.conftest import FakeClock
from tests.schemas import FALLBACK, Exact, Row, Summary

pytestmark = pytest.mark.anyio


def _value(i: int) -> Exact:
    return Exact(rows=[Row(id=i, name=f"row {i}")], total=1)


def _index(workspace: rc.LocalWorkspace) -> Path:
    return Path(workspace.workspace_temp_dir()) / ROOT_NAME / "index.sqlite3"


async def test_the_row_counter_matches_the_rows_through_stores_reuses_and_evictions(
    harness: rc.Harness, workspace: rc.LocalWorkspace, clock: FakeClock
) -> None:
    """Triggers keep counts.n equal to count(*) per kind, and the bound still holds."""
    options = {"fallback": FALLBACK, "ladder": "cheap", "max_entries": 3, "ttl_seconds": 50}
    for i in range(10):
        await rc.response_compact(harness, _value(i % 6), Exact, Summary, options)
        clock.advance(7)
    with sqlite3.connect(_index(workspace)) as conn:
        (rows,) = conn.execute("SELECT count(*) FROM entries WHERE kind = 'exact'").fetchone()
        (counted,) = conn.execute("SELECT n FROM counts WHERE kind = 'exact'").fetchone()
    assert rows == counted
    assert rows <= 3


async def test_an_index_from_an_older_build_is_upgraded_in_place(
    harness: rc.Harness, workspace: rc.LocalWorkspace
) -> None:
    """An index without the layout column and the counter is upgraded, and its entries read."""
    options = {"fallback": FALLBACK, "ladder": "cheap"}
    first = await rc.response_compact(harness, _value(1), Exact, Summary, options)
    index = _index(workspace)
    with sqlite3.connect(index) as conn:
        conn.executescript(
            """
            DROP TRIGGER entries_added; DROP TRIGGER entries_removed; DROP TABLE counts;
            CREATE TABLE old (
                kind TEXT NOT NULL, key TEXT NOT NULL, digest TEXT NOT NULL,
                size INTEGER NOT NULL, expires_at REAL NOT NULL, last_used REAL NOT NULL,
                PRIMARY KEY (kind, key)) WITHOUT ROWID;
            INSERT INTO old SELECT kind, key, digest, size, expires_at, last_used FROM entries;
            DROP TABLE entries; ALTER TABLE old RENAME TO entries;
            """
        )
    # As a fresh process would: forget this process's open connection to the index.
    _store._indexes.clear()
    reopened = harness
    read = await rc.response_compaction_read_exact(reopened, first.receipt.exact_ref, Exact)
    assert read == rc.Found(value=_value(1))
    await rc.response_compact(reopened, _value(2), Exact, Summary, options)
    with sqlite3.connect(index) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
        (counted,) = conn.execute("SELECT n FROM counts WHERE kind = 'exact'").fetchone()
    assert "layout" in columns
    assert counted == 2
