"""The index's own bookkeeping: the row counter.

The test that upgraded "an index from an older build" in place is gone with that upgrade:
no release ever wrote an index without the layout column and the row counter (issue 8).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import response_compaction as rc
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
