"""An attacker with write access to the store: what must still never read ``Found``.

Each test plays the attacker against real files and the real index, then reads back.
"""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest

import response_compaction as rc
from response_compaction import _store
from tests._store_support import (
    TEST_KEY,
    FaultyBackend,
    compact,
    entry_path,
    hex_of,
    ref_of,
    store_root,
    with_backend,
)
from tests.schemas import Exact, Row, Summary

pytestmark = pytest.mark.anyio

A = Exact(rows=[Row(id=1, name="alpha")], total=1)
B = Exact(rows=[Row(id=2, name="bravo")], total=2)
SUMMARY_KEY = "5" * 64
GENUINE = Summary(overview="genuine", critical_facts=["one"])
FORGED = Summary(overview="forged!", critical_facts=["two"])


async def read(harness: rc.Harness, value: Any) -> rc.Found[Any] | rc.Missing | rc.Broken:
    return await rc.response_compaction_read_exact(harness, ref_of(value), Exact)


def _rewrite(root: Path, kind: str, key: str, data: bytes) -> None:
    """Replace an entry's bytes AND make its index row agree with them (digest and size)."""
    entry_path(root, key, kind).write_bytes(data)
    with sqlite3.connect(root / "index.sqlite3") as conn:
        conn.execute(
            "UPDATE entries SET digest = ?, size = ? WHERE kind = ? AND key = ?",
            (hmac.new(TEST_KEY, data, hashlib.sha256).hexdigest(), len(data), kind, key),
        )


async def _put_summary(store: _store.Store, value: Summary) -> None:
    await store.put(
        "summary",
        [msgspec.json.encode(value, order="sorted")],
        key=SUMMARY_KEY,
        schema=Summary,
        ttl_seconds=3600,
        max_entries=100,
        want_value_up_to=0,
    )


async def test_rewritten_exact_entry_with_a_matching_row_reads_broken(
    harness: rc.Harness,
) -> None:
    """Schema-valid bytes plus a row updated to match them: Broken, and verify says broken."""
    await compact(harness, A)
    await compact(harness, B)
    root = store_root(harness.fs)
    forged = msgspec.json.encode(Exact(rows=[Row(id=1, name="alphb")], total=1), order="sorted")
    _rewrite(root, "exact", hex_of(A), forged)
    result = await read(harness, A)
    assert isinstance(result, rc.Broken)
    assert await read(harness, B) == rc.Found(value=B)
    store = await _store.open_store(harness.fs)
    states = {report.key: report.state for report in await store.verify()}
    assert states == {hex_of(A): "broken", hex_of(B): "found"}


async def test_rewritten_summary_entry_with_a_matching_row_reads_broken(
    harness: rc.Harness,
) -> None:
    """A summary is sealed to its cache key: forged bytes with a matching row read Broken."""
    store = await _store.open_store(harness.fs)
    await _put_summary(store, GENUINE)
    assert await store.get("summary", SUMMARY_KEY, Summary) == rc.Found(value=GENUINE)
    _rewrite(Path(store.root), "summary", SUMMARY_KEY, msgspec.json.encode(FORGED))
    assert isinstance(await store.get("summary", SUMMARY_KEY, Summary), rc.Broken)
    assert [report.state for report in await store.verify()] == ["broken"]
    # The store's own writes still verify after the attack is repaired.
    await _put_summary(store, GENUINE)
    assert await store.get("summary", SUMMARY_KEY, Summary) == rc.Found(value=GENUINE)
    assert [report.state for report in await store.verify()] == ["found"]


@pytest.mark.parametrize("size", [2**40, 2**62])
async def test_a_row_claiming_a_huge_size_reads_the_file_as_it_is(
    harness: rc.Harness, size: int
) -> None:
    """The row's size bounds a read, never what is allocated for it: a row claiming a
    terabyte is read as the bytes the file holds (which the reference's digest vouches
    for), with no MemoryError; read_part too."""
    await compact(harness, A)
    root = store_root(harness.fs)
    with sqlite3.connect(root / "index.sqlite3") as conn:
        conn.execute("UPDATE entries SET size = ? WHERE key = ?", (size, hex_of(A)))
    assert await read(harness, A) == rc.Found(value=A)
    part = await rc.response_compaction_read_part(harness, ref_of(A), pointer="/rows/0")
    assert isinstance(part, rc.Found)


@pytest.mark.parametrize("outside_size", [1234, len(b'{"rows":[],"total":0}')])
async def test_entry_hardlinked_to_an_outside_file_reveals_nothing_about_it(
    harness: rc.Harness, tmp_path: Path, outside_size: int
) -> None:
    """An entry hard-linked to a foreign file reads Broken without its size or sha256."""
    await compact(harness, A)
    root = store_root(harness.fs)
    outside = tmp_path / "outside-secret"
    outside.write_bytes((b'{"rows":[],"total":0}' + b" " * outside_size)[:outside_size])
    facts = [str(outside_size), hashlib.sha256(outside.read_bytes()).hexdigest()]
    path = entry_path(root, hex_of(A))
    path.unlink()
    path.hardlink_to(outside)
    result = await read(harness, A)
    assert isinstance(result, rc.Broken)
    store = await _store.open_store(harness.fs)
    (report,) = await store.verify()
    assert report.state == "broken"
    for detail in (result.detail, report.detail):
        assert "hard links" in detail
        assert not any(fact in detail for fact in facts), detail


async def test_tampered_entry_detail_names_no_digest_or_size_of_the_bytes(
    harness: rc.Harness,
) -> None:
    """Broken.detail and verify's detail say what failed, not what the bytes on disk hash to."""
    await compact(harness, A)
    root = store_root(harness.fs)
    planted = b'{"rows":[],"total":7}   '
    entry_path(root, hex_of(A)).write_bytes(planted)
    facts = [str(len(planted)), hashlib.sha256(planted).hexdigest()]
    result = await read(harness, A)
    assert isinstance(result, rc.Broken)
    store = await _store.open_store(harness.fs)
    (report,) = await store.verify()
    for detail in (result.detail, report.detail):
        assert "do not hash to the reference" in detail
        assert not any(fact in detail for fact in facts), detail


@pytest.mark.parametrize("expiry", ["x", b"\x00", float("inf")])
async def test_compacting_again_replaces_a_tampered_expiry(
    harness: rc.Harness, expiry: object
) -> None:
    """An expiry cell that is not a finite number reads Broken, until the value is stored again.

    The new receipt must read ``Found``: its write replaces the cell (``max`` with text kept
    the text, which SQLite ranks above any number, and the key read Broken for good).
    """
    await compact(harness, A)
    root = store_root(harness.fs)
    with sqlite3.connect(root / "index.sqlite3") as conn:
        conn.execute("UPDATE entries SET expires_at = ? WHERE key = ?", (expiry, hex_of(A)))
    assert isinstance(await read(harness, A), rc.Broken)
    again = await compact(harness, A)
    assert again.receipt.exact_cache == "stored"
    assert await read(harness, A) == rc.Found(value=A)


@pytest.mark.parametrize("stepwise", [False, True], ids=["own-backend", "injected-backend"])
async def test_a_row_claiming_a_terabyte_reserves_no_memory_for_it(
    harness: rc.Harness, stepwise: bool
) -> None:
    """The row's size bounds a read; the file's own size bounds what is reserved for it.

    A terabyte reserved up front was a MemoryError out of the read (a mapping span steers
    ``read_part`` past the size-bounded routes; an injected backend takes that read for all).
    """
    await compact(harness, A)
    root = store_root(harness.fs)
    mapping = msgspec.json.encode([["rows", 0, 1, [[1, 1]], [], "", True]])
    with sqlite3.connect(root / "index.sqlite3") as conn:
        conn.execute(
            "UPDATE entries SET size = ?, layout = ? WHERE key = ?", (1 << 40, mapping, hex_of(A))
        )
    conn.close()
    reader = with_backend(harness, FaultyBackend()) if stepwise else harness
    assert await read(reader, A) == rc.Found(value=A)
    part = await rc.response_compaction_read_part(reader, ref_of(A), pointer="/total")
    assert isinstance(part, rc.Found)
    assert part.value.value == 1
