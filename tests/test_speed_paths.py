"""The fast paths keep the guarantees: reuse without rewrite, inline reads, worker cancellation."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgspec
import pytest

import response_compaction as rc
from response_compaction import _pool
from response_compaction._store import _indexes
from response_compaction._store._fileio import AsyncBinaryFile
from response_compaction._store._oneshot import read_regular
from response_compaction._store._verify import DECODE_BESIDE_BYTES
from tests._store_support import (
    FaultyBackend,
    compact,
    entry_files,
    entry_path,
    hex_of,
    loop_statements,
    open_index,
    ref_of,
    store_root,
    temp_files,
    traced,
    with_backend,
)
from tests.conftest import FakeClock
from tests.schemas import FALLBACK, Exact, Row, Summary, big_exact

pytestmark = pytest.mark.anyio

A = Exact(rows=[Row(id=1, name="alpha")], total=1)
OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}


#: A small value (one hop) and a medium one (about 1 MB, stored in one worker-thread call).
SIZES = pytest.mark.parametrize(
    ("value", "marker"),
    [(A, b'"alpha"'), (big_exact(16_000), b'"id":0,')],
    ids=["small", "medium"],
)


@SIZES
async def test_an_intact_live_entry_is_renewed_not_rewritten(
    harness: rc.Harness, clock: FakeClock, value: Exact, marker: bytes
) -> None:
    """Compacting a stored value again keeps the same file (inode, mtime) and renews its TTL."""
    await compact(harness, value, ttl_seconds=100)
    path = entry_path(store_root(harness.fs), hex_of(value))
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    before = os.stat(path)
    clock.advance(60)
    again = await compact(harness, value, ttl_seconds=100)
    assert again.receipt.exact_cache == "reused"
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    clock.advance(60)  # past the first expiry, before the renewed one
    found = await rc.response_compaction_read_exact(harness, ref_of(value), Exact)
    assert found == rc.Found(value=value)


class FsyncLog:
    """Replaces ``os.fsync``: records (device, inode) of what it synced; may hold a directory's."""

    def __init__(self, hold_dir_of: Path | None = None) -> None:
        self.synced: list[tuple[int, int]] = []
        self.held = threading.Event()
        self.release = threading.Event()
        self._hold = None if hold_dir_of is None else _identity(hold_dir_of)
        self._real = os.fsync

    def __call__(self, fd: int) -> None:
        self._real(fd)
        st = os.fstat(fd)
        self.synced.append((st.st_dev, st.st_ino))
        if (st.st_dev, st.st_ino) == self._hold and not self.held.is_set():
            self.held.set()
            self.release.wait(60)


async def _beside_a_held_fsync(
    harness: rc.Harness, log: FsyncLog, first: Exact
) -> tuple[rc.Compacted[Any, Any], list[tuple[int, int]]]:
    """Compact ``first`` until ``log`` holds its fsync, then ``A`` beside it: A's result and
    what was synced meanwhile; then let ``first`` finish."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(compact, harness, first)
        assert await anyio.to_thread.run_sync(log.held.wait, 10)
        synced_before = len(log.synced)
        again = await compact(harness, A)
        synced = log.synced[synced_before:]
        log.release.set()
    return again, synced


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


@SIZES
async def test_a_renewal_of_another_writers_entry_syncs_its_directory(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch, value: Exact, marker: bytes
) -> None:
    """A reuse vouches for a name on disk: its writer may still be inside that fsync."""
    await compact(harness, value)
    root = store_root(harness.fs)
    with sqlite3.connect(root / "index.sqlite3") as other:  # as another process's writer
        other.execute("UPDATE entries SET writer = 'another process'")
    log = FsyncLog()
    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", log)
        again = await compact(harness, value)
    assert again.receipt.exact_cache == "reused"
    assert _identity(entry_path(root, hex_of(value)).parent) in log.synced


async def test_a_renewal_beside_a_publish_in_flight_syncs_its_directory(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This process's own entry is vouched for without a sync only when no publish is between
    its rename and its directory's fsync (whichever entry that publish names)."""
    await compact(harness, A)
    root = store_root(harness.fs)
    other = Exact(rows=[Row(id=2, name="beta")], total=1)
    log = FsyncLog(hold_dir_of=entry_path(root, hex_of(other)).parent)
    (entry_path(root, hex_of(other)).parent).mkdir(parents=True, exist_ok=True)
    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", log)
        again, renewal_synced = await _beside_a_held_fsync(harness, log, other)
        log.synced.clear()
        alone = await compact(harness, A)  # none in flight: its own entry needs no sync
    assert again.receipt.exact_cache == alone.receipt.exact_cache == "reused"
    assert _identity(entry_path(root, hex_of(A)).parent) in renewal_synced
    assert _identity(entry_path(root, hex_of(A)).parent) not in log.synced


LARGE_TAMPERS = {
    "a digit changed": lambda data, other: data.replace(b'"id":1,', b'"id":7,', 1),
    "spaces": lambda data, other: data.replace(b",", b", ", 3),
    "another entry's bytes": lambda data, other: other,
    "truncated": lambda data, other: data[: len(data) // 2],
    "broken JSON, same length": lambda data, other: data.replace(b'"name":"', b'"name":[', 1),
}


_BESIDE_CASES = [(8_000, name) for name in LARGE_TAMPERS] + [
    (40_000, name)
    for name in ("a digit changed", "broken JSON, same length")  # in slices
]


@pytest.mark.parametrize(
    ("rows", "tamper"),
    [(rows, LARGE_TAMPERS[name]) for rows, name in _BESIDE_CASES],
    ids=[f"{rows} rows, {name}" for rows, name in _BESIDE_CASES],
)
async def test_an_entry_decoded_in_the_reads_hop_reads_broken_when_tampered(
    harness: rc.Harness, tamper: Any, rows: int
) -> None:
    """A read that decodes in its hop (or beside a decode in slices) checks the digest
    first: a value that decodes from tampered bytes is never Found, the digest decides."""
    value, other = big_exact(rows), big_exact(rows + 1)
    await compact(harness, value)
    await compact(harness, other)
    root = store_root(harness.fs)
    path = entry_path(root, hex_of(value))
    assert path.stat().st_size >= DECODE_BESIDE_BYTES
    path.write_bytes(tamper(path.read_bytes(), entry_path(root, hex_of(other)).read_bytes()))
    found = await rc.response_compaction_read_exact(harness, ref_of(value), Exact)
    assert isinstance(found, rc.Broken)
    assert "do not hash to the reference" in found.detail
    found = await rc.response_compaction_read_exact(harness, ref_of(other), Exact)
    assert found == rc.Found(value=other)


async def test_a_renewal_beside_another_renewal_in_flight_syncs_its_directory(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two reuses of another writer's entry at once: the second does not vouch for a name the
    first is still syncing, though the row now names this process's writer."""
    await compact(harness, A)
    root = store_root(harness.fs)
    with sqlite3.connect(root / "index.sqlite3") as other:  # as another process's writer
        other.execute("UPDATE entries SET writer = 'another process'")
    fan_out = entry_path(root, hex_of(A)).parent
    log = FsyncLog(hold_dir_of=fan_out)
    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", log)
        again, second = await _beside_a_held_fsync(harness, log, A)
    assert again.receipt.exact_cache == "reused"
    assert _identity(fan_out) in second


async def test_after_a_directory_fsync_failed_no_renewal_skips_its_sync(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed directory fsync leaves a row of this process whose name may not be on disk:
    from then on every renewal syncs, its own rows included."""
    await compact(harness, A)
    other = Exact(rows=[Row(id=2, name="beta")], total=1)
    real_fsync = os.fsync

    def failing(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "injected")
        real_fsync(fd)

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", failing)
        with pytest.raises(rc.StoreError):
            await compact(harness, other)
    log = FsyncLog()
    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", log)
        again = await compact(harness, A)
    assert again.receipt.exact_cache == "reused"
    assert _identity(entry_path(store_root(harness.fs), hex_of(A)).parent) in log.synced


@SIZES
async def test_a_tampered_entry_is_rewritten_not_renewed(
    harness: rc.Harness, value: Exact, marker: bytes
) -> None:
    """A live entry whose bytes changed on disk is written afresh by the next compaction."""
    await compact(harness, value)
    path = entry_path(store_root(harness.fs), hex_of(value))
    tampered = path.read_bytes().replace(marker, marker[:-2] + b"9" + marker[-1:], 1)
    assert tampered != path.read_bytes()
    path.write_bytes(tampered)
    again = await compact(harness, value)
    assert again.receipt.exact_cache == "reused"  # the row was live; the file is new
    found = await rc.response_compaction_read_exact(harness, ref_of(value), Exact)
    assert found == rc.Found(value=value)


async def test_reads_work_whether_or_not_the_index_is_open(harness: rc.Harness) -> None:
    """A small read finds its value both inline (index open) and through a worker thread."""
    await compact(harness, A)
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)
    _indexes.close_all()  # nothing open: the read takes a worker thread and opens it
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)


async def test_an_oversized_small_entry_reads_broken(harness: rc.Harness) -> None:
    """A small entry padded on disk far beyond its row's size reads Broken, never Found."""
    await compact(harness, A)
    path = entry_path(store_root(harness.fs), hex_of(A))
    path.write_bytes(path.read_bytes() + b" " * (1 << 20))
    result = await rc.response_compaction_read_exact(harness, ref_of(A), Exact)
    assert isinstance(result, rc.Broken)


async def test_a_cancelled_worker_verification_is_replaced(tmp_path: Path) -> None:
    """Cancelling a compaction while a worker verifies it leaves a full, working pool."""
    _pool.POOL.start()
    cores = _pool.usable_cores()
    assert await anyio.to_thread.run_sync(_pool.POOL.wait_ready, lambda n: n >= cores, 60)
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path / "ws"), llm=None)
    options = {"fallback": Summary(overview="x", critical_facts=[]), "ladder": "cheap",
               "summarize_above_bytes": 1000}  # fmt: skip
    before = _pool.POOL.checkouts
    async with anyio.create_task_group() as tg:
        tg.start_soon(rc.response_compact, harness, big_exact(60_000), Exact, Summary, options)

        # Until a worker is checked out for this value's verification, then cancel it. (Not
        # "fewer idle": the ~30 ms checkout could be over before the waiting thread looked.)
        def checked_out(_: int) -> bool:
            return _pool.POOL.checkouts > before

        assert await anyio.to_thread.run_sync(_pool.POOL.wait_ready, checked_out, 60)
        tg.cancel_scope.cancel()
    # A worker killed by the cancellation is replaced.
    assert await anyio.to_thread.run_sync(_pool.POOL.wait_ready, lambda n: n >= cores, 60)
    before = _pool.POOL.calls
    out = await rc.response_compact(harness, big_exact(60_001), Exact, Summary, options)
    assert out.receipt.exact_cache == "stored"
    assert _pool.POOL.calls == before + 1


async def test_a_removed_root_is_made_again(harness: rc.Harness) -> None:
    """A store root deleted while the process runs is recreated by the next call, as before."""
    await compact(harness, A)
    shutil.rmtree(store_root(harness.fs))
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Missing()
    again = await compact(harness, A)  # a new store: a new key, so a new reference
    ref = again.receipt.exact_ref
    assert await rc.response_compaction_read_exact(harness, ref, Exact) == rc.Found(value=A)


async def test_a_renewal_is_not_synced_and_later_commits_are(harness: rc.Harness) -> None:
    """A reused entry's renewal commits with synchronous=NORMAL; the connection is FULL again."""
    await compact(harness, A)
    statements: list[str] = []
    with open_index(harness) as (_, index):
        with traced(index, statements.append):
            again = await compact(harness, A)
        assert again.receipt.exact_cache == "reused"
        normal = statements.index("PRAGMA synchronous=NORMAL")
        assert statements.index("COMMIT", normal) < statements.index("PRAGMA synchronous=FULL")
        with index._lock:  # not inside a helper's batch of uses, should one be under way
            assert index._conn.execute("PRAGMA synchronous").fetchone() == (2,)


async def test_a_store_directory_made_anew_is_written_into_not_the_old_one(
    harness: rc.Harness,
) -> None:
    """exact/ moved aside and made again: the next value lands in the new one (fds re-opened)."""
    await compact(harness, A)
    root = store_root(harness.fs)
    (root / "exact").rename(root / "old-exact")
    (root / "exact").mkdir(mode=0o700)
    b = Exact(rows=[Row(id=2, name="beta")], total=1)
    await compact(harness, b)
    assert entry_path(root, hex_of(b)).is_file()
    assert not list((root / "old-exact").glob(f"*/{hex_of(b)}"))
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Missing()
    assert await rc.response_compaction_read_exact(harness, ref_of(b), Exact) == rc.Found(value=b)


async def test_a_read_on_the_loop_never_commits_its_use_there(harness: rc.Harness) -> None:
    """Reads served on the event loop thread only note their use: no COMMIT (an fsync) there."""
    await compact(harness, A)
    with loop_statements(harness) as on_loop:
        for _ in range(3):  # the first is served inline; a batch then due goes to a thread
            found = await rc.response_compaction_read_exact(harness, ref_of(A), Exact)
            assert found == rc.Found(value=A)
    assert on_loop == []


@pytest.mark.parametrize("size", [0, 1, 99, 100, 101, 250])
def test_a_bounded_read_stops_at_the_end_or_one_byte_past_the_limit(
    tmp_path: Path, size: int
) -> None:
    """read_regular (ended by the fstat size, not an empty read) returns min(size, limit + 1)."""
    (tmp_path / "f").write_bytes(bytes(range(256))[:size])
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_regular("f", fd, 100) == bytes(range(256))[: min(size, 101)]
        assert read_regular("f", fd) == bytes(range(256))[:size]
    finally:
        os.close(fd)


async def test_a_large_value_read_back_wrong_is_refused_when_its_value_is_wanted(
    harness: rc.Harness,
) -> None:
    """Over 2 MB, a wanted value is hashed beside its decode in slices: bytes on disk that
    differ from those written (and still decode) are refused all the same, nothing kept."""
    value = big_exact(40_000)

    async def edit(inner: AsyncBinaryFile, data: bytes | memoryview) -> int:
        return await inner.write(bytes(data).replace(b'"id":1,', b'"id":7,', 1))

    faulty = with_backend(harness, FaultyBackend(write=edit))
    options = {"fallback": FALLBACK, "ladder": "cheap", "summarize_above_bytes": 50_000_000}
    with pytest.raises(ValueError, match="do not match their digest"):
        await rc.response_compact(faulty, value, Exact, Summary, options)
    root = store_root(harness.fs)
    assert entry_files(root) == set()
    assert temp_files(root) == []


TAMPERED_SEEN: list[int] = []


class Audited(msgspec.Struct, frozen=True):
    """A schema whose own code runs while it decodes (``__post_init__``)."""

    rows: list[Row]
    total: int

    def __post_init__(self) -> None:
        # (Also run when the encoder rebuilds it around placeholders for its list.)
        if isinstance(self.rows, list) and any(row.id == 7 for row in self.rows[:3]):
            TAMPERED_SEEN.append(1)
            raise RuntimeError("the schema's code saw bytes not yet checked")


@pytest.mark.parametrize("rows", [8_000, 40_000], ids=["in the hop", "in slices"])
async def test_a_schema_with_its_own_code_only_ever_sees_checked_bytes(
    harness: rc.Harness, rows: int
) -> None:
    """Decoding beside the hash is for msgspec's own code: a ``__post_init__`` runs after the
    check, so tampered bytes read Broken and never reach it (nor does what it raises)."""
    value = Audited(rows=big_exact(rows).rows, total=rows)
    compacted = await rc.response_compact(harness, value, Audited, Summary, OPTIONS)
    path = entry_path(store_root(harness.fs), compacted.receipt.exact_digest.split(":")[1])
    path.write_bytes(path.read_bytes().replace(b'"id":1,', b'"id":7,', 1))
    TAMPERED_SEEN.clear()
    found = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Audited)
    assert isinstance(found, rc.Broken)
    assert "do not hash to the reference" in found.detail
    assert TAMPERED_SEEN == []
