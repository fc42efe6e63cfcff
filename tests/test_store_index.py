"""The index's own bookkeeping: the row counter.

The test that upgraded "an index from an older build" in place is gone with that upgrade:
no release ever wrote an index without the layout column and the row counter (issue 8).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import response_compaction as rc
from response_compaction._errors import map_errors
from response_compaction._store import ROOT_NAME, _index
from response_compaction._store._paths import prepare_root
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
    _index.close_all()
    roots = [prepare_root(str(tmp_path / f"ws{n}")) for n in range(_index.MAX_IDLE_INDEXES + 3)]
    held = [_index.acquire(root) for root in roots]
    for index in held[1:]:
        _index.release(index)
    # The first is still in use although it is the least recently opened: it still works.
    assert held[0].counts(0.0) == {}
    with pytest.raises(sqlite3.ProgrammingError):
        held[1].counts(0.0)  # idle and beyond the cap: closed
    assert held[-1].counts(0.0) == {}
    _index.release(held[0])
    _index.close_all()
    with pytest.raises(sqlite3.ProgrammingError):
        held[0].counts(0.0)
    fresh = _index.acquire(roots[0])
    assert fresh is not held[0]  # a new connection after close_all
    _index.release(fresh)
    _index.close_all()


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
