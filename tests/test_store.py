"""The store through real files: tampering, TTL and LRU, cancellation, hostile roots, faults."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import msgspec
import pytest

import response_compaction as rc
from response_compaction import _store
from response_compaction._store import _indexes
from response_compaction._store._fileio import AsyncBinaryFile
from tests._store_support import (
    ROOT_NAME,
    FaultyBackend,
    canonical,
    compact,
    entry_files,
    entry_path,
    hex_of,
    index_rows,
    ref_of,
    snapshot,
    store_root,
    temp_files,
    with_backend,
)
from tests.conftest import FakeClock
from tests.schemas import Exact, Row, Summary, big_exact

pytestmark = pytest.mark.anyio

A = Exact(rows=[Row(id=1, name="alpha")], total=1)
B = Exact(rows=[Row(id=2, name="bravo")], total=2)
C = Exact(rows=[Row(id=3, name="charlie")], total=3)


async def read(harness: rc.Harness, value: Any) -> rc.Found[Any] | rc.Missing | rc.Broken:
    return await rc.response_compaction_read_exact(harness, ref_of(value), Exact)


def values(n: int, tag: str = "v") -> list[Exact]:
    return [Exact(rows=[Row(id=i, name=f"{tag}{i}")], total=i) for i in range(n)]


# ----------------------------------------------------------------------------- tampering


def _flip(data: bytes, other: bytes) -> bytes:
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x01
    return bytes(flipped)


def _schema_valid_edit(data: bytes, other: bytes) -> bytes:
    edited = data.replace(b'"alpha"', b'"alphb"')
    assert len(edited) == len(data)
    assert msgspec.json.decode(edited, type=Exact) == Exact(rows=[Row(id=1, name="alphb")], total=1)
    return edited


def _reordered(data: bytes, other: bytes) -> bytes:
    # Same bytes count, valid, same data, keys in reverse order.
    obj = json.loads(data)
    edited = json.dumps(dict(reversed(obj.items())), separators=(",", ":")).encode()
    assert len(edited) == len(data)
    assert msgspec.json.decode(edited, type=Exact) == A
    return edited


def _with_spaces(data: bytes, other: bytes) -> bytes:
    edited = json.dumps(json.loads(data)).encode()
    assert b" " in edited
    assert msgspec.json.decode(edited, type=Exact) == A
    return edited


TAMPERS: dict[str, Callable[[bytes, bytes], bytes]] = {
    "flipped byte": _flip,
    "schema-valid edit": _schema_valid_edit,
    "truncated": lambda data, other: data[:-5],
    "zero-length": lambda data, other: b"",
    "trailing garbage": lambda data, other: data + b"garbage",
    "trailing newline": lambda data, other: data + b"\n",
    "valid entry under another digest": lambda data, other: other,
    "non-canonical json (spaces)": _with_spaces,
    "non-canonical json (key order)": _reordered,
}


def _tamper(root: Path, tamper: Callable[[bytes, bytes], bytes]) -> None:
    path = entry_path(root, hex_of(A))
    path.write_bytes(tamper(path.read_bytes(), entry_path(root, hex_of(B)).read_bytes()))


@pytest.mark.parametrize("tamper", list(TAMPERS.values()), ids=list(TAMPERS))
async def test_tampered_entry_reads_broken(harness: rc.Harness, tamper: Any) -> None:
    """Bytes that do not hash to the reference read Broken; other entries stay Found."""
    await compact(harness, A)
    await compact(harness, B)
    _tamper(store_root(harness.fs), tamper)
    result = await read(harness, A)
    assert isinstance(result, rc.Broken)
    assert "does not verify" in result.detail
    assert await read(harness, B) == rc.Found(value=B)


async def test_recompaction_repairs_a_tampered_entry(harness: rc.Harness) -> None:
    """Compacting the same value again replaces tampered bytes with the verified ones."""
    await compact(harness, A)
    await compact(harness, B)
    _tamper(store_root(harness.fs), _flip)
    await compact(harness, A)
    assert await read(harness, A) == rc.Found(value=A)


async def test_content_not_matching_the_read_schema_is_broken(harness: rc.Harness) -> None:
    """Intact bytes that do not validate against the schema given to read are Broken."""
    compacted = await compact(harness, A)
    result = await rc.response_compaction_read_exact(harness, compacted.receipt.exact_ref, Summary)
    assert isinstance(result, rc.Broken)
    assert "Object missing required field" in result.detail


def _delete_entry(root: Path) -> None:
    entry_path(root, hex_of(A)).unlink()


def _delete_fanout(root: Path) -> None:
    shutil.rmtree(entry_path(root, hex_of(A)).parent)


@pytest.mark.parametrize("delete", [_delete_entry, _delete_fanout], ids=["file", "fan-out dir"])
async def test_deleted_entry_with_row_reads_missing(harness: rc.Harness, delete: Any) -> None:
    """An entry whose file vanished while its index row stayed reads Missing, not an error."""
    await compact(harness, A)
    delete(store_root(harness.fs))
    assert index_rows(store_root(harness.fs)) == {hex_of(A)}
    assert await read(harness, A) == rc.Missing()


async def test_file_removed_between_lookup_and_open_reads_missing(harness: rc.Harness) -> None:
    """A concurrent cleanup that unlinks the file after the index lookup gives Missing."""
    await compact(harness, A)
    path = entry_path(store_root(harness.fs), hex_of(A))
    looked_up = False

    async def evict_after_lookup(fn: Callable[..., Any]) -> None:
        nonlocal looked_up
        if looked_up and path.exists():
            path.unlink()
        looked_up = looked_up or getattr(fn, "__name__", "") == "lookup"

    faulty = with_backend(harness, FaultyBackend(before_run=evict_after_lookup))
    assert await read(faulty, A) == rc.Missing()
    assert looked_up
    assert not path.exists()


def _replace_with_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


async def test_directory_in_place_of_an_entry_is_broken(harness: rc.Harness) -> None:
    """A directory where the entry file should be reads Broken rather than raising."""
    await compact(harness, A)
    _replace_with_dir(entry_path(store_root(harness.fs), hex_of(A)))
    result = await read(harness, A)
    assert isinstance(result, rc.Broken)
    assert "not a regular file" in result.detail


def _replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _release_fifo_reader(path: Path) -> None:
    # Opening the write end lets a reader blocked in open() go on (and see EOF).
    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


async def test_fifo_in_place_of_an_entry_is_broken_without_hanging(harness: rc.Harness) -> None:
    """A FIFO planted as an entry reads Broken at once; the read never blocks on it."""
    await compact(harness, A)
    path = entry_path(store_root(harness.fs), hex_of(A))
    _replace_with_fifo(path)
    hung = False

    async def watchdog() -> None:
        # Not a timing assertion: only frees a read that would otherwise block forever.
        nonlocal hung
        await anyio.sleep(20)
        hung = True
        _release_fifo_reader(path)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watchdog)
        result = await read(harness, A)
        tg.cancel_scope.cancel()
    assert not hung, "the read blocked opening a FIFO"
    assert isinstance(result, rc.Broken)


# ----------------------------------------------------------------------------- TTL and LRU


async def test_expired_entry_reads_missing(harness: rc.Harness, clock: FakeClock) -> None:
    """An entry is Found until its TTL has passed, then Missing (the expiry instant included)."""
    await compact(harness, A, ttl_seconds=10)
    clock.advance(9.5)
    assert await read(harness, A) == rc.Found(value=A)
    clock.advance(0.5)
    assert await read(harness, A) == rc.Missing()


async def test_expired_entries_are_deleted_by_the_next_write(
    harness: rc.Harness, clock: FakeClock
) -> None:
    """The next commit removes expired rows and their files."""
    await compact(harness, A, ttl_seconds=10)
    clock.advance(11)
    await compact(harness, B, ttl_seconds=10)
    root = store_root(harness.fs)
    assert entry_files(root) == {hex_of(B)}
    assert index_rows(root) == {hex_of(B)}


@pytest.mark.parametrize("read_a", [True, False])
async def test_reading_counts_as_a_use(harness: rc.Harness, clock: FakeClock, read_a: bool) -> None:
    """With max_entries=2, reading A before storing C evicts B instead of A."""
    await compact(harness, A, max_entries=2)
    clock.advance(1)
    await compact(harness, B, max_entries=2)
    clock.advance(1)
    if read_a:
        assert await read(harness, A) == rc.Found(value=A)
        clock.advance(1)
    await compact(harness, C, max_entries=2)
    kept, evicted = (A, B) if read_a else (B, A)
    root = store_root(harness.fs)
    assert entry_files(root) == {hex_of(kept), hex_of(C)}
    assert index_rows(root) == {hex_of(kept), hex_of(C)}
    assert await read(harness, evicted) == rc.Missing()
    assert await read(harness, kept) == rc.Found(value=kept)
    assert await read(harness, C) == rc.Found(value=C)


async def test_recompaction_refreshes_expiry(harness: rc.Harness, clock: FakeClock) -> None:
    """Compacting a live value again reports "reused" and restarts its TTL."""
    first = await compact(harness, A, ttl_seconds=100)
    assert first.receipt.exact_cache == "stored"
    clock.advance(60)
    again = await compact(harness, A, ttl_seconds=100)
    assert again.receipt.exact_cache == "reused"
    assert again.receipt.exact_ref == first.receipt.exact_ref
    clock.advance(60)  # past the first expiry (100), before the refreshed one (160)
    assert await read(harness, A) == rc.Found(value=A)
    clock.advance(40)
    assert await read(harness, A) == rc.Missing()
    after = await compact(harness, A, ttl_seconds=100)
    assert after.receipt.exact_cache == "stored"


async def test_max_entries_bound_holds(harness: rc.Harness, clock: FakeClock) -> None:
    """Storing many values with max_entries=3 keeps exactly the three most recent."""
    stored = values(12)
    for value in stored:
        await compact(harness, value, max_entries=3)
        clock.advance(1)
    root = store_root(harness.fs)
    newest = {hex_of(v) for v in stored[-3:]}
    assert entry_files(root) == newest
    assert index_rows(root) == newest
    for value in stored[:-3]:
        assert await read(harness, value) == rc.Missing()
    for value in stored[-3:]:
        assert await read(harness, value) == rc.Found(value=value)


def _plant_temps(root: Path, now: float) -> None:
    stale = root / "tmp" / "stale.tmp"
    fresh = root / "tmp" / "fresh.tmp"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (now - 4000, now - 4000))
    os.utime(fresh, (now, now))


async def test_prune_removes_expired_extra_and_stale_temps(
    workspace: rc.LocalWorkspace, harness: rc.Harness, clock: FakeClock
) -> None:
    """Store.prune drops expired entries, the least recently used beyond the bound, old temps."""
    await compact(harness, A, ttl_seconds=5)
    clock.advance(1)
    await compact(harness, B)
    clock.advance(1)
    await compact(harness, C)
    clock.advance(10)
    root = store_root(workspace)
    _plant_temps(root, time.time())  # temp files carry real file times
    store = await _store.open_store(workspace)
    assert await store.prune(max_entries=1) == 3  # A expired, B beyond the bound, one temp
    assert entry_files(root) == {hex_of(C)}
    assert index_rows(root) == {hex_of(C)}
    assert temp_files(root) == ["fresh.tmp"]
    assert await store.counts() == {"exact": 1}


async def test_prune_drops_a_row_whose_file_is_gone_unless_a_put_may_be_in_flight(
    workspace: rc.LocalWorkspace, harness: rc.Harness
) -> None:
    """A row with no file (a put that died between its row's commit and its rename, a file
    removed by hand) reads Missing and counts against the bound: prune drops it, but not
    while a temp file under an hour old says a put may be between those two steps."""
    await compact(harness, A)
    await compact(harness, B)
    root = store_root(workspace)
    entry_path(root, hex_of(A)).unlink()
    (root / "tmp" / "in-flight.tmp").write_bytes(b"half")
    store = await _store.open_store(workspace)
    assert await store.prune() == 0
    assert index_rows(root) == {hex_of(A), hex_of(B)}
    two_hours_ago = time.time() - 7200
    os.utime(root / "tmp" / "in-flight.tmp", (two_hours_ago, two_hours_ago))
    assert await store.prune() == 2  # the row, and the stale temp file
    assert index_rows(root) == entry_files(root) == {hex_of(B)}
    assert await store.counts() == {"exact": 1}
    assert await read(harness, A) == rc.Missing()
    assert await read(harness, B) == rc.Found(value=B)


async def test_a_row_with_no_file_does_not_count_against_prune_s_bound(
    workspace: rc.LocalWorkspace, harness: rc.Harness
) -> None:
    """Bounded to 2 with C's file gone, prune drops C's row and keeps A and B: the row was
    counted first, so A (the least recently used) was evicted in its place."""
    for value in (A, B, C):
        await compact(harness, value)
    root = store_root(workspace)
    entry_path(root, hex_of(C)).unlink()
    store = await _store.open_store(workspace)
    assert await store.prune(max_entries=2) == 1
    assert index_rows(root) == entry_files(root) == {hex_of(A), hex_of(B)}
    assert await read(harness, A) == rc.Found(value=A)


@pytest.mark.parametrize("stale", [False, True], ids=["fresh temp", "temp an hour old"])
async def test_a_prune_between_a_small_put_s_commit_and_rename_never_strands_a_receipt(
    workspace: rc.LocalWorkspace, harness: rc.Harness, monkeypatch: pytest.MonkeyPatch, stale: bool
) -> None:
    """A small put commits its row while its temp file's fsync runs, and renames after. A
    prune in between (that fsync held) keeps the row while the temp file is fresh. A temp file
    over an hour old (a writer paused that long) is swept under the same lock first: the put,
    let go the moment its row is gone, then fails at its rename (no receipt); swept after the
    lock, it had renamed and handed out a receipt that read Missing."""
    real_fsync = os.fsync
    held, release = threading.Event(), threading.Event()
    root = store_root(workspace)
    await compact(harness, B)  # the store made first: the one file fsynced next is A's temp

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if stat.S_ISREG(os.fstat(fd).st_mode) and not held.is_set():  # the temp file's
            # Held until the row, committed beside this fsync (no event says so), is there.
            _until(lambda: hex_of(A) in index_rows(root))
            held.set()
            if stale:
                _until(lambda: hex_of(A) not in index_rows(root))
            else:
                assert release.wait(60)

    monkeypatch.setattr(os, "fsync", fsync)
    outcome: list[object] = []

    async def put() -> None:
        try:
            outcome.append(await compact(harness, A))
        except rc.StoreError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(put)
        assert await anyio.to_thread.run_sync(held.wait, 60)
        if stale:
            (temp,) = temp_files(root)
            os.utime(root / "tmp" / temp, (time.time() - 7200,) * 2)
        store = await _store.open_store(workspace)
        assert await store.prune() == (2 if stale else 0)  # the temp file and the row
        release.set()
    if stale:
        assert isinstance(outcome[0], rc.StoreError)
        assert index_rows(root) == entry_files(root) == {hex_of(B)}
        assert await read(harness, A) == rc.Missing()
    else:
        assert index_rows(root) == entry_files(root) == {hex_of(A), hex_of(B)}
        assert await read(harness, A) == rc.Found(value=A)


def _until(condition: Callable[[], bool]) -> None:
    """Look every 5 ms until ``condition()``: for a state no event announces (60 s at most)."""
    for _ in range(12_000):
        if condition():
            return
        threading.Event().wait(0.005)
    raise AssertionError("the condition never held")


# ----------------------------------------------------------------------------- cancellation

CANCEL_POINTS = ["first write", "mid write", "fsync", "verify", "commit"]


@pytest.mark.parametrize("point", CANCEL_POINTS)
async def test_cancelled_write_leaves_whole_entry_or_nothing(
    harness: rc.Harness, point: str
) -> None:
    """Cancelling a multi-MB compaction leaves no temp file and either no entry or a whole one."""
    value = big_exact(60_000)
    scope = anyio.CancelScope()
    token = anyio.lowlevel.current_token()
    writes = 0
    reached = False
    commit_done = threading.Event()

    async def write(inner: AsyncBinaryFile, data: bytes | memoryview) -> int:
        nonlocal writes, reached
        writes += 1
        if (point, writes) in (("first write", 1), ("mid write", 4)):
            reached = True
            scope.cancel()  # lands while this write is in flight
        return await inner.write(data)

    async def before_run(fn: Callable[..., Any]) -> None:
        nonlocal reached
        if point == "fsync" and fn is os.fsync:
            reached = True
            scope.cancel()

    async def before_open(mode: str) -> None:
        nonlocal reached
        if point == "verify" and mode == "rb":  # reading the temp file back to verify it
            reached = True
            scope.cancel()

    @contextlib.contextmanager
    def in_thread(fn: Callable[..., Any]) -> Iterator[None]:
        nonlocal reached
        if point != "commit" or fn is not _store.publish:
            yield
            return
        reached = True
        try:
            anyio.from_thread.run_sync(scope.cancel, token=token)
            yield
        finally:
            commit_done.set()

    backend = FaultyBackend(
        write=write, before_open=before_open, before_run=before_run, in_thread=in_thread
    )
    with scope:
        await compact(with_backend(harness, backend), value)
    assert reached
    # Cancelled while committing, the compaction may finish (nothing awaits after the commit
    # of a value that needs no summary); before that point the cancellation must land.
    assert scope.cancelled_caught or point == "commit"
    if point == "commit":
        await anyio.to_thread.run_sync(commit_done.wait)

    root = store_root(harness.fs)
    assert temp_files(root) == []
    hex_digest = hex_of(value)
    if point == "commit":
        assert entry_files(root) == index_rows(root)
        assert entry_files(root) <= {hex_digest}
        if not scope.cancelled_caught:
            assert entry_files(root) == {hex_digest}
    else:
        assert entry_files(root) == set()
        assert index_rows(root) == set()
    result = await read(harness, value)
    assert result == rc.Missing() or result == rc.Found(value=value)
    # The store is not wedged: the same value is retained normally afterwards.
    await compact(harness, value)
    assert await read(harness, value) == rc.Found(value=value)


# ----------------------------------------------------------------------------- hostile roots


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "bait").write_bytes(b"do not touch")
    return path


def _unseeded(workspace: rc.LocalWorkspace) -> None:
    # These tests build the root themselves: drop the one the fixture made for its known key.
    shutil.rmtree(workspace.path)


def _symlink_root(workspace: rc.LocalWorkspace, outside: Path) -> None:
    _unseeded(workspace)
    Path(workspace.path).mkdir(mode=0o700)
    store_root(workspace).symlink_to(outside, target_is_directory=True)


async def test_symlinked_root_is_refused(
    workspace: rc.LocalWorkspace, harness: rc.Harness, outside: Path
) -> None:
    """A store root that is a symlink raises UnsafeStoreError and nothing lands behind it."""
    _symlink_root(workspace, outside)
    before = snapshot(outside)
    with pytest.raises(rc.UnsafeStoreError) as info:
        await compact(harness, A)
    assert isinstance(info.value, OSError)
    with pytest.raises(rc.UnsafeStoreError):
        await read(harness, A)
    assert snapshot(outside) == before


def _symlink_subdir(root: Path, name: str, outside: Path) -> None:
    shutil.rmtree(root / name)
    (root / name).symlink_to(outside, target_is_directory=True)


@pytest.mark.parametrize("name", ["tmp", "exact"])
async def test_symlinked_store_subdirectory_is_refused(
    harness: rc.Harness, outside: Path, name: str
) -> None:
    """tmp/ or exact/ replaced by a symlink makes compaction and reads raise UnsafeStoreError."""
    await compact(harness, A)
    _symlink_subdir(store_root(harness.fs), name, outside)
    before = snapshot(outside)
    with pytest.raises(rc.UnsafeStoreError):
        await compact(harness, B)
    with pytest.raises(rc.UnsafeStoreError):
        await read(harness, A)
    assert snapshot(outside) == before


def _symlink_fanout(root: Path, hex_digest: str, outside: Path) -> None:
    fan = entry_path(root, hex_digest).parent
    if fan.exists():
        shutil.move(fan, outside / "moved")
    fan.symlink_to(outside / "moved" if (outside / "moved").exists() else outside)


async def test_symlinked_fanout_is_refused_for_writes(harness: rc.Harness, outside: Path) -> None:
    """Writing into a fan-out directory that is a symlink raises and writes nothing outside."""
    assert hex_of(A)[:2] != hex_of(B)[:2]
    await compact(harness, A)
    root = store_root(harness.fs)
    _symlink_fanout(root, hex_of(B), outside)
    before = snapshot(outside)
    with pytest.raises(rc.UnsafeStoreError):
        await compact(harness, B)
    assert snapshot(outside) == before
    assert temp_files(root) == []
    assert index_rows(root) == {hex_of(A)}
    assert await read(harness, A) == rc.Found(value=A)


async def test_symlinked_fanout_is_never_followed_by_reads(
    harness: rc.Harness, outside: Path
) -> None:
    """A fan-out dir swapped for a symlink to a valid copy is refused, never read as Found."""
    await compact(harness, A)
    _symlink_fanout(store_root(harness.fs), hex_of(A), outside)
    before = snapshot(outside)
    with pytest.raises(rc.UnsafeStoreError):
        await read(harness, A)
    assert snapshot(outside) == before


async def test_a_value_compacted_again_behind_a_symlinked_fanout_is_never_reused(
    harness: rc.Harness, outside: Path
) -> None:
    """A stored value compacted again (a hit, renewed on the loop when it can be) after its
    fan-out dir was swapped for a symlink to a valid copy raises, never says "reused"."""
    await compact(harness, A)
    assert (await compact(harness, A)).receipt.exact_cache == "reused"  # a hit, as a rule
    _symlink_fanout(store_root(harness.fs), hex_of(A), outside)
    before = snapshot(outside)
    with pytest.raises(rc.UnsafeStoreError):
        await compact(harness, A)
    assert snapshot(outside) == before


def _symlink_entry(root: Path, hex_digest: str, outside: Path) -> None:
    path = entry_path(root, hex_digest)
    copy = outside / "copy"
    copy.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(copy)


async def test_symlinked_entry_is_not_followed(harness: rc.Harness, outside: Path) -> None:
    """An entry file that is a symlink (even to the right bytes) reads Broken; the target stays."""
    await compact(harness, A)
    root = store_root(harness.fs)
    _symlink_entry(root, hex_of(A), outside)
    before = snapshot(outside)
    result = await read(harness, A)
    assert isinstance(result, rc.Broken)
    assert "symlink" in result.detail
    await compact(harness, A)  # the rename replaces the link itself, not its target
    assert not entry_path(root, hex_of(A)).is_symlink()
    assert await read(harness, A) == rc.Found(value=A)
    assert snapshot(outside) == before


def _make_root_with_index_link(workspace: rc.LocalWorkspace, outside: Path) -> None:
    _unseeded(workspace)
    root = store_root(workspace)
    root.mkdir(parents=True, mode=0o700)
    for sub in ("tmp", "exact", "summary"):
        (root / sub).mkdir(mode=0o700)
    (root / "index.sqlite3").symlink_to(outside / "bait")


async def test_symlinked_index_is_refused(
    workspace: rc.LocalWorkspace, harness: rc.Harness, outside: Path
) -> None:
    """An index file that is a symlink raises UnsafeStoreError and the target is untouched."""
    _make_root_with_index_link(workspace, outside)
    before = snapshot(outside)
    with pytest.raises(rc.UnsafeStoreError):
        await compact(harness, A)
    assert snapshot(outside) == before
    assert temp_files(store_root(workspace)) == []


def _make_root_with_garbage_index(workspace: rc.LocalWorkspace) -> None:
    _unseeded(workspace)
    root = store_root(workspace)
    root.mkdir(parents=True, mode=0o700)
    for sub in ("tmp", "exact", "summary"):
        (root / sub).mkdir(mode=0o700)
    (root / "index.sqlite3").write_bytes(b"not a database " * 512)


async def test_corrupt_index_raises_store_error(
    workspace: rc.LocalWorkspace, harness: rc.Harness
) -> None:
    """An index that is not a database makes writes and reads raise StoreError, not sqlite's."""
    _make_root_with_garbage_index(workspace)
    with pytest.raises(rc.StoreError, match="index"):
        await compact(harness, A)
    with pytest.raises(rc.StoreError, match="index"):
        await read(harness, A)
    root = store_root(workspace)
    assert temp_files(root) == []
    assert entry_files(root) == set()


def _dir_named(root: Path, which: str) -> Path:
    return entry_path(root, hex_of(A)).parent if which == "fan-out" else root / which


@pytest.mark.parametrize("which", [".", "tmp", "exact", "fan-out"])
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702], ids=oct)
async def test_shared_mode_is_refused(harness: rc.Harness, which: str, mode: int) -> None:
    """A store directory writable by group or others raises UnsafeStoreError on write and read."""
    await compact(harness, A)
    root = store_root(harness.fs)
    _dir_named(root, which).chmod(mode)
    with pytest.raises(rc.UnsafeStoreError, match="writable by group or others"):
        await compact(harness, A)
    with pytest.raises(rc.UnsafeStoreError, match="writable by group or others"):
        await read(harness, A)
    assert temp_files(root) == []
    assert entry_path(root, hex_of(A)).read_bytes() == canonical(A)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("which", [".", "exact", "fan-out"])
async def test_root_owned_by_another_user_is_refused(harness: rc.Harness, which: str) -> None:
    """A store directory owned by another uid raises UnsafeStoreError on write and read."""
    await compact(harness, A)
    root = store_root(harness.fs)
    os.chown(_dir_named(root, which), 65534, 65534)
    with pytest.raises(rc.UnsafeStoreError, match="owned by another user"):
        await compact(harness, A)
    with pytest.raises(rc.UnsafeStoreError, match="owned by another user"):
        await read(harness, A)
    assert entry_files(root) == {hex_of(A)}


def _make_fresh_root(workspace: rc.LocalWorkspace, mode: int) -> None:
    _unseeded(workspace)
    Path(workspace.path).mkdir(mode=0o700)
    store_root(workspace).mkdir()
    store_root(workspace).chmod(mode)


async def test_fresh_root_with_shared_mode_is_refused(
    workspace: rc.LocalWorkspace, harness: rc.Harness
) -> None:
    """A pre-made root dir with mode 0o777 is refused before anything is created in it."""
    _make_fresh_root(workspace, 0o777)
    with pytest.raises(rc.UnsafeStoreError):
        await compact(harness, A)
    assert snapshot(store_root(workspace)) == {}


# ----------------------------------------------------------------------------- write failures


async def test_short_writes_still_produce_a_correct_entry(harness: rc.Harness) -> None:
    """A file whose writes go out a few bytes at a time still yields the exact entry."""
    short = 0

    async def dribble(inner: AsyncBinaryFile, data: bytes | memoryview) -> int:
        nonlocal short
        view = memoryview(data)
        limit = 7 if len(view) < 4096 else max(1, len(view) // 3)
        written = await inner.write(view[:limit])
        short += written < len(view)
        return written

    faulty = with_backend(harness, FaultyBackend(write=dribble))
    small = Exact(rows=[Row(id=i, name="x" * 50) for i in range(20)], total=20)
    medium = big_exact(3000)
    for value in (small, medium):
        compacted = await compact(faulty, value)
        assert compacted.receipt.exact_bytes == len(canonical(value))
        path = entry_path(store_root(harness.fs), hex_of(value))
        assert path.read_bytes() == canonical(value)
        assert await read(harness, value) == rc.Found(value=value)
    assert short > 100


async def test_write_making_no_progress_is_an_error(harness: rc.Harness) -> None:
    """A write that returns 0 raises StoreError (EIO) instead of spinning, and leaves nothing."""

    async def stuck(inner: AsyncBinaryFile, data: bytes | memoryview) -> int:
        return 0

    with pytest.raises(rc.StoreError) as info:
        await compact(with_backend(harness, FaultyBackend(write=stuck)), A)
    assert info.value.errno == errno.EIO
    root = store_root(harness.fs)
    assert temp_files(root) == []
    assert entry_files(root) == set()


async def test_disk_full_surfaces_as_oserror_and_keeps_old_entries(harness: rc.Harness) -> None:
    """ENOSPC part-way through a write raises StoreError(ENOSPC); old entries stay Found."""
    await compact(harness, A)
    written = 0

    async def fill_up(inner: AsyncBinaryFile, data: bytes | memoryview) -> int:
        nonlocal written
        if written >= 1 << 20:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = await inner.write(data)
        written += n
        return n

    value = big_exact(40_000)
    with pytest.raises(OSError, match="No space left") as info:
        await compact(with_backend(harness, FaultyBackend(write=fill_up)), value)
    assert isinstance(info.value, rc.StoreError)
    assert info.value.errno == errno.ENOSPC
    assert written >= 1 << 20
    root = store_root(harness.fs)
    assert temp_files(root) == []
    assert entry_files(root) == {hex_of(A)}
    assert index_rows(root) == {hex_of(A)}
    assert await read(harness, A) == rc.Found(value=A)
    assert await read(harness, value) == rc.Missing()


async def test_fsync_failure_surfaces_as_oserror(harness: rc.Harness) -> None:
    """An fsync that fails (EIO) raises StoreError and publishes nothing."""
    await compact(harness, A)

    async def failing_fsync(fn: Callable[..., Any]) -> None:
        if fn is os.fsync:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    with pytest.raises(rc.StoreError) as info:
        await compact(with_backend(harness, FaultyBackend(before_run=failing_fsync)), B)
    assert info.value.errno == errno.EIO
    root = store_root(harness.fs)
    assert temp_files(root) == []
    assert entry_files(root) == {hex_of(A)}
    assert await read(harness, B) == rc.Missing()
    assert await read(harness, A) == rc.Found(value=A)


def test_root_name_matches_the_library() -> None:
    """The helpers look where the library writes."""
    assert ROOT_NAME == _store.ROOT_NAME


# ----------------------------------------------------------------------------- many stores


async def test_more_stores_than_open_indexes_work_concurrently(tmp_path: Path) -> None:
    """Many workspaces used at once in one process (more than the index cache) all work."""
    count = _indexes.MAX_IDLE_INDEXES + 4
    failures: list[str] = []

    async def agent(n: int) -> None:
        harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path / f"ws{n}"), llm=None)
        for value in values(8, tag=f"agent{n}-"):
            try:
                compacted = await compact(harness, value)
                result = await rc.response_compaction_read_exact(
                    harness, compacted.receipt.exact_ref, Exact
                )
            except Exception as exc:
                failures.append(repr(exc))
            else:
                if result != rc.Found(value=value):
                    failures.append(repr(result))

    async with anyio.create_task_group() as tg:
        for n in range(count):
            tg.start_soon(agent, n)
    assert failures == []
