"""Durability and safety of what the store creates: parents fsynced, private modes."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import response_compaction as rc
from response_compaction._store import _indexes
from response_compaction._store._paths import open_dir
from tests._store_support import (
    FaultyBackend,
    compact,
    entry_path,
    open_index,
    ref_of,
    store_root,
    traced,
)
from tests.schemas import Exact, Row, big_exact

pytestmark = pytest.mark.anyio

A = Exact(rows=[Row(id=1, name="alpha")], total=1)


class FsyncRecorder:
    """Records the (dev, inode) of every fd fsynced inside the store's blocking calls."""

    def __init__(self) -> None:
        self.synced: set[tuple[int, int]] = set()
        self.calls: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def root_syncs(self, identity: tuple[int, int]) -> int:
        """How many times the directory ``identity`` was fsynced."""
        return self.calls.count(identity)

    @contextlib.contextmanager
    def __call__(self, fn: Callable[..., Any]) -> Iterator[None]:
        real = os.fsync

        def fsync(fd: Any) -> None:
            st = os.fstat(fd if isinstance(fd, int) else fd.fileno())
            with self._lock:
                self.synced.add((st.st_dev, st.st_ino))
                self.calls.append((st.st_dev, st.st_ino))
            real(fd)

        os.fsync = fsync
        try:
            yield
        finally:
            os.fsync = real


def _identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


async def test_every_directory_the_store_creates_is_made_durable_in_its_parent(
    tmp_path: Path,
) -> None:
    """A first compaction into a fresh workspace fsyncs the parent of every directory it made."""
    recorder = FsyncRecorder()
    ws = tmp_path / "a" / "b" / "ws"
    workspace = rc.LocalWorkspace(ws, file_backend=FaultyBackend(in_thread=recorder))
    compacted = await compact(rc.Harness(fs=workspace, llm=None), A)
    root = store_root(ws)
    entry = entry_path(root, compacted.receipt.exact_ref.removeprefix("rc1:"))
    parents = [tmp_path, tmp_path / "a", tmp_path / "a" / "b", ws, root, root / "exact"]
    parents.append(entry.parent)  # the rename of the entry itself
    missing = [str(p.relative_to(tmp_path)) for p in parents if _identity(p) not in recorder.synced]
    assert missing == []
    # And the root is synced after the index file is created in it (checked by count: the
    # root is fsynced once for each of tmp/, exact/, summary/, the key and the index).
    assert recorder.root_syncs(_identity(root)) >= 5


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


async def test_under_umask_zero_everything_the_store_creates_is_private(tmp_path: Path) -> None:
    """Umask 000: created workspace ancestors, the index and its -wal/-shm are owner-only."""
    ws = tmp_path / "a" / "b" / "ws"
    with _umask(0):
        await compact(rc.Harness(fs=rc.LocalWorkspace(ws), llm=None), A)
        root = store_root(ws)
        made = [tmp_path / "a", tmp_path / "a" / "b", ws, root, root / "tmp", root / "exact"]
        files = [
            root / name for name in ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm")
        ]
        assert all(path.exists() for path in files)
        modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in made + files}
    assert set(modes.values()) <= {"0o700", "0o600"}, modes


async def test_an_index_hard_linked_to_another_database_is_refused(tmp_path: Path) -> None:
    """index.sqlite3 sharing its inode with another file: UnsafeStoreError, the other untouched."""
    ws = tmp_path / "ws"
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    await compact(harness, A)
    _indexes.close_all()
    other = tmp_path / "other.sqlite3"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE mine (x)")
    conn.close()
    other.chmod(0o644)
    index = store_root(ws) / "index.sqlite3"
    _replace_with_link(index, other)
    before = other.read_bytes()
    with pytest.raises(rc.UnsafeStoreError, match="hard links"):
        await compact(harness, A)
    assert other.read_bytes() == before
    assert oct(other.stat().st_mode & 0o777) == "0o644"


def _replace_with_link(index: Path, other: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{index}{suffix}").unlink(missing_ok=True)
    index.hardlink_to(other)


def _foreign(path: Path) -> None:
    os.lchown(path, 4242, 4242)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
@pytest.mark.parametrize("kind", ["symlink", "directory"])
async def test_a_workspace_path_another_user_controls_is_refused(tmp_path: Path, kind: str) -> None:
    """A symlink or ancestor directory owned by another user: UnsafeStoreError, nothing created."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    if kind == "symlink":
        link = tmp_path / "link"
        link.symlink_to(real, target_is_directory=True)
        _foreign(link)
        ws = link / "ws"
    else:
        _foreign(real)
        ws = real / "ws"
    with pytest.raises(rc.UnsafeStoreError, match="another user"):
        await compact(rc.Harness(fs=rc.LocalWorkspace(ws), llm=None), A)
    assert not (real / "ws").exists()


@pytest.mark.parametrize(("mode", "refused"), [(0o777, True), (0o775, True), (0o1777, False)])
async def test_a_shared_ancestor_without_the_sticky_bit_is_refused(
    tmp_path: Path, mode: int, refused: bool
) -> None:
    """An ancestor writable by others is refused unless sticky (like /tmp), which is accepted."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    harness = rc.Harness(fs=rc.LocalWorkspace(shared / "me" / "ws"), llm=None)
    if refused:
        with pytest.raises(rc.UnsafeStoreError, match="sticky"):
            await compact(harness, A)
    else:
        await compact(harness, A)


async def test_a_symlinked_workspace_of_our_own_is_accepted(tmp_path: Path) -> None:
    """A symlink we own on the way (e.g. a home on another volume) is fine."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path / "link" / "ws"), llm=None)
    await compact(harness, A)
    assert (real / "ws" / "response-compaction-v1" / "index.sqlite3").exists()


def test_a_directory_is_opened_first_and_made_only_when_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """open_dir(create=True) calls mkdir (and fsyncs the parent) only for a missing directory."""
    made: list[str] = []
    real = os.mkdir

    def mkdir(path: str, *args: Any, **kwargs: Any) -> None:
        made.append(path)
        real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    recorder = FsyncRecorder()
    try:
        with recorder(open_dir):
            os.close(open_dir("ab", create=True, dir_fd=parent))
            os.close(open_dir("ab", create=True, dir_fd=parent))
    finally:
        os.close(parent)
    assert made == ["ab"]
    assert recorder.root_syncs(_identity(tmp_path)) == 1
    assert oct((tmp_path / "ab").stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("rows", [1, 2_000], ids=["on-the-loop", "in-a-worker"])
async def test_uses_written_by_a_read_do_not_sync_and_the_next_store_does(
    harness: rc.Harness, rows: int
) -> None:
    """A read (a small one on the loop, a larger one in a worker thread) has the batch of
    uses due written by a helper thread, off the read's path, in a commit that does not sync
    the WAL (an fsync a read more than a second after the last one paid); the store after it
    syncs as before."""
    value = Exact(rows=[Row(id=i, name=f"row {i:06d} " + "x" * 40) for i in range(rows)],
                  total=rows)  # fmt: skip
    await compact(harness, value)
    ref = (await compact(harness, value)).receipt.exact_ref
    statements: list[str] = []
    threads: set[str] = set()

    def trace(statement: str) -> None:
        statements.append(statement)
        if statement == "COMMIT":
            threads.add(threading.current_thread().name)

    with open_index(harness) as (_, index), traced(index, trace):
        for _ in range(3):  # the first batch is due at once
            assert await rc.response_compaction_read_exact(harness, ref, Exact) == rc.Found(
                value=value
            )
        _indexes.wait_for_closes()  # the helper's batch, written by now
        reads = len(statements)
        await compact(harness, Exact(rows=[Row(id=2, name="beta")], total=1))
    assert "COMMIT" in statements[:reads]
    assert _commit_modes(statements[:reads]) == {"NORMAL"}
    assert _commit_modes(statements[reads:]) == {"FULL"}
    assert "response-compaction-close" in threads  # the reads' batch: not a read's thread


def _commit_modes(statements: list[str]) -> set[str]:
    """The synchronous mode each COMMIT in ``statements`` ran under (FULL unless set)."""
    mode, modes = "FULL", set()
    for statement in statements:
        if statement.startswith("PRAGMA synchronous="):
            mode = statement.removeprefix("PRAGMA synchronous=")
        elif statement == "COMMIT":
            modes.add(mode)
    return modes


@pytest.mark.parametrize("rows", [1, 400], ids=["checked before its fsync", "checked beside it"])
async def test_a_read_back_that_comes_back_short_reads_on(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    """A read may return less than asked before a file's end (FUSE with ``direct_io``, NFS):
    a small put's read-back reads on from there rather than refusing its value."""
    real_read, real_pread, reads = os.read, os.pread, []

    def short_read(fd: int, length: int) -> bytes:
        reads.append(length)
        return real_read(fd, min(length, 16))

    def short_pread(fd: int, length: int, offset: int) -> bytes:
        return real_pread(fd, min(length, 16), offset)

    value = A if rows == 1 else big_exact(rows)
    with monkeypatch.context() as patch:  # not undo(): the autouse fixtures' patches stay
        patch.setattr(os, "read", short_read)
        patch.setattr(os, "pread", short_pread)
        compacted = await compact(harness, value)
    assert compacted.receipt.exact_cache == "stored"
    assert len(reads) > 1  # it did read on
    found = await rc.response_compaction_read_exact(harness, ref_of(value), Exact)
    assert found == rc.Found(value=value)
