"""Writers with skewed clocks share one store: no single clock destroys or revives others' data.

Each writer is a process (the clock rules tell writers apart by process); children run with a
clock stopped at a given time (``tests._store_child clocked``).
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import sys
from pathlib import Path

import anyio
import pytest

import response_compaction as rc
from response_compaction._store import _indexes
from tests._store_child import tagged
from tests._store_support import compact, hex_of, index_rows, ref_of, seed_key, store_root
from tests.conftest import FakeClock
from tests.schemas import Exact

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
T0 = 1_900_000_000.0
DAY = 86_400
TEN_YEARS = 10 * 365 * DAY


async def _writer(ws: Path, backend: str, now: float, ttl: int, *steps: str) -> list[str]:
    command = [sys.executable, "-m", "tests._store_child", "clocked", str(ws), backend]
    result = await anyio.run_process([*command, str(now), str(ttl), *steps], cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr.decode()
    outcome: list[str] = json.loads(result.stdout)
    return outcome


def _harness(ws: Path, clock: FakeClock) -> rc.Harness:
    return rc.Harness(fs=rc.LocalWorkspace(ws, clock=clock), llm=None)


async def _read(harness: rc.Harness, tag: str) -> rc.Found[Exact] | rc.Missing | rc.Broken:
    return await rc.response_compaction_read_exact(harness, ref_of(tagged(tag)), Exact)


async def test_a_writer_ten_years_ahead_deletes_no_live_entry_of_others(
    tmp_path: Path, anyio_backend: str
) -> None:
    """A clock 10 years ahead stores and prunes; others' 1-day entries stay and read Found."""
    ws = tmp_path / "ws"
    seed_key(ws)  # a known key, so entries can be named (hex_of) from outside
    harness = _harness(ws, FakeClock(T0))
    for tag in ("a", "b"):
        await compact(harness, tagged(tag), ttl_seconds=DAY)
    skewed = await _writer(ws, anyio_backend, T0 + TEN_YEARS, DAY, "put:c", "prune", "read:a")
    assert skewed[0] == "stored"
    assert skewed[2] == "Missing"  # by its own clock, a is long expired: it may say so
    assert {hex_of(tagged(t)) for t in "ab"} <= index_rows(ws / "response-compaction-v1")
    for tag in ("a", "b"):
        assert await _read(harness, tag) == rc.Found(value=tagged(tag))


async def test_honest_expiry_is_deleted_once_a_second_clock_witnesses_it(
    tmp_path: Path, anyio_backend: str
) -> None:
    """Expired by one other writer's clock it reads Missing; a second witness lets it go."""
    ws = tmp_path / "ws"
    seed_key(ws)  # a known key, so entries can be named (hex_of) from outside
    root = ws / "response-compaction-v1"
    assert await _writer(ws, anyio_backend, T0, 60, "put:a") == ["stored"]
    harness = _harness(ws, FakeClock(T0 + 120))
    await compact(harness, tagged("b"))
    assert await _read(harness, "a") == rc.Missing()
    assert hex_of(tagged("a")) in index_rows(root)  # one clock alone did not delete it
    await _writer(ws, anyio_backend, T0 + 130, 60, "prune")
    assert hex_of(tagged("a")) not in index_rows(root)
    assert await _read(harness, "b") == rc.Found(value=tagged("b"))


async def test_a_clock_going_backwards_revives_no_expired_entry(
    tmp_path: Path, anyio_backend: str
) -> None:
    """Once readers witnessed a later time, a clock that went back still reads Missing."""
    ws = tmp_path / "ws"
    seed_key(ws)  # a known key, so entries can be named (hex_of) from outside
    assert await _writer(ws, anyio_backend, T0, 60, "put:a") == ["stored"]
    assert await _writer(ws, anyio_backend, T0, DAY, "put:b") == ["stored"]
    clock = FakeClock(T0 + 120)
    harness = _harness(ws, clock)
    assert await _read(harness, "b") == rc.Found(value=tagged("b"))  # records T0 + 120
    assert await _writer(ws, anyio_backend, T0 + 125, DAY, "read:b") == ["Found"]
    # No write has deleted a yet: only the witnessed clocks keep it expired.
    assert await _writer(ws, anyio_backend, T0, 60, "read:a") == ["Missing"]
    clock.now = T0  # this very process's clock jumps back
    assert await _read(harness, "a") == rc.Missing()


async def test_a_read_that_found_an_entry_expired_keeps_it_expired_for_an_earlier_clock(
    tmp_path: Path,
) -> None:
    """One process, one clock: a read at T0+100 says Missing, and after the clock steps back
    to T0+5 (inside the TTL) reads still say Missing, whole or in part, also after a write;
    an entry stored after that is corrected to expire after the time witnessed."""
    clock = FakeClock(T0)
    seed_key(tmp_path / "ws")  # a known key, so refs can be made here (ref_of)
    harness = _harness(tmp_path / "ws", clock)
    await compact(harness, tagged("a"), ttl_seconds=10)
    assert await _read(harness, "a") == rc.Found(value=tagged("a"))
    clock.now = T0 + 100
    assert await _read(harness, "a") == rc.Missing()
    _indexes.close_all()  # as when more stores are in use than stay open: not forgotten
    clock.now = T0 + 5
    assert await _read(harness, "a") == rc.Missing()
    assert await rc.response_compaction_read_part(harness, ref_of(tagged("a"))) == rc.Missing()
    await compact(harness, tagged("b"), ttl_seconds=10)  # expires at T0+110, not T0+15
    assert await _read(harness, "a") == rc.Missing()
    clock.now = T0 + 50
    assert await _read(harness, "b") == rc.Found(value=tagged("b"))


@pytest.mark.parametrize("broken", [math.nan, math.inf, -math.inf])
async def test_a_clock_that_is_not_finite_is_a_store_error(tmp_path: Path, broken: float) -> None:
    """A NaN compares false with every expiry and an infinity expires what it stores: an
    injected clock giving either fails the operation, it is never taken as a time."""
    clock = FakeClock(T0)
    seed_key(tmp_path / "ws")
    harness = _harness(tmp_path / "ws", clock)
    await compact(harness, tagged("a"), ttl_seconds=10)
    clock.now = broken
    with pytest.raises(rc.StoreError, match="clock gave a time that is not finite"):
        await _read(harness, "a")
    with pytest.raises(rc.StoreError, match="clock gave a time that is not finite"):
        await compact(harness, tagged("b"))
    clock.now = T0 + 1
    assert await _read(harness, "a") == rc.Found(value=tagged("a"))


async def test_capacity_eviction_follows_use_order_not_a_clock_going_backwards(
    tmp_path: Path,
) -> None:
    """With the clock stepping back before each write, the least recently stored entry goes."""
    clock = FakeClock(T0)
    seed_key(tmp_path / "ws")
    harness = _harness(tmp_path / "ws", clock)
    for tag in ("a", "b", "c"):
        await compact(harness, tagged(tag), max_entries=2)
        clock.advance(-1000)
    assert await _read(harness, "a") == rc.Missing()
    assert await _read(harness, "b") == rc.Found(value=tagged("b"))
    assert await _read(harness, "c") == rc.Found(value=tagged("c"))


def _uses(root: Path, *tags: str) -> list[object]:
    with contextlib.closing(sqlite3.connect(root / "index.sqlite3")) as conn:
        found = dict(conn.execute("SELECT key, last_used FROM entries"))
    return [found[hex_of(tagged(tag))] for tag in tags]


def _tamper(root: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    with contextlib.closing(sqlite3.connect(root / "index.sqlite3")) as conn, conn:
        for sql, args in statements:
            conn.execute(sql, args)


async def test_a_store_takes_a_use_number_above_every_number_recorded(tmp_path: Path) -> None:
    """Above the rows' own numbers (a cell that is no number, or too large to count on, is
    passed over) and above the counter an older version kept in ``meta``, which is then
    deleted: the newest use is always evicted last, by either version."""
    clock = FakeClock(T0)
    seed_key(tmp_path / "ws")
    harness = _harness(tmp_path / "ws", clock)
    root = store_root(tmp_path / "ws")
    for tag in ("a", "b"):
        await compact(harness, tagged(tag), max_entries=10)
    assert _uses(root, "a", "b") == [1.0, 2.0]
    set_use = "UPDATE entries SET last_used = ? WHERE key = ?"
    set_counter = "INSERT INTO meta VALUES ('uses', ?) ON CONFLICT (name) DO UPDATE SET value = ?"
    _tamper(
        root,
        (set_use, (40, hex_of(tagged("a")))),
        (set_use, ("not a number", hex_of(tagged("b")))),
        (set_counter, ("junk", "junk")),
    )
    await compact(harness, tagged("c"), max_entries=10)
    assert _uses(root, "c") == [41.0]
    _tamper(root, (set_counter, (100, 100)), (set_use, (1e20, hex_of(tagged("b")))))
    await compact(harness, tagged("d"), max_entries=10)
    assert _uses(root, "d") == [101.0]  # 1e20 + 1 == 1e20: such a cell is passed over too
    await compact(harness, tagged("e"), max_entries=10)
    # The counter was deleted once read: an older version, which trusts it whenever it exists,
    # looks at the rows instead of handing its next write a stale low number.
    assert _uses(root, "e") == [102.0]
    with contextlib.closing(sqlite3.connect(root / "index.sqlite3")) as conn:
        assert conn.execute("SELECT count(*) FROM meta WHERE name = 'uses'").fetchone() == (0,)
