"""Work a put runs beside its fsyncs: the durable order kept, every failure still fatal.

A small put verifies its temp file's bytes in a helper thread while it fsyncs the file, and
fsyncs its directory in a helper beside the index's COMMIT (``_store._aside``); a small value
named by its digest has its row committed while a helper fsyncs the file. These tests pin
what that must not change: the file is synced before its name moves, every sync has returned
before the receipt, and a failing one fails the call, with no receipt and nothing that reads
as another value.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import secrets
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import response_compaction as rc
from response_compaction._store import _aside, _index, _indexes, open_store
from response_compaction._store._commit import Publication, publish_all
from tests._store_support import (
    FaultyBackend,
    canonical,
    compact,
    entry_files,
    entry_path,
    hex_of,
    index_rows,
    ref_of,
    store_root,
    temp_files,
    with_backend,
)
from tests.schemas import Exact, Row

pytestmark = pytest.mark.anyio

#: Bounds a wait that only a put holding the index's lock through its file's fsync makes long.
GUARD_SECONDS = 10

A = Exact(rows=[Row(id=1, name="alpha")], total=1)
B = Exact(rows=[Row(id=2, name="beta")], total=1)


def _is_dir(fd: int) -> bool:
    return stat.S_ISDIR(os.fstat(fd).st_mode)


class Journal:
    """Replaces ``os.fsync`` and ``os.rename`` with recording (and optionally failing) twins."""

    def __init__(self, fail: Callable[[int], bool] = lambda fd: False) -> None:
        self.events: list[tuple[str, Any]] = []
        self._fail = fail
        self._lock = threading.Lock()

    def _note(self, *event: Any) -> None:
        with self._lock:
            self.events.append(event)

    @contextlib.contextmanager
    def installed(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        real_fsync, real_rename = os.fsync, os.rename

        def fsync(fd: Any) -> None:
            fd = fd if isinstance(fd, int) else fd.fileno()
            what = "dir" if _is_dir(fd) else "file"
            self._note("fsync-start", what)
            if self._fail(fd):
                self._note("fsync-failed", what)
                raise OSError(errno.EIO, "injected fsync failure")
            real_fsync(fd)
            self._note("fsync-end", what)

        def rename(src: Any, dst: Any, **kwargs: Any) -> None:
            self._note("rename", str(dst))
            real_rename(src, dst, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(os, "fsync", fsync)
            patch.setattr(os, "rename", rename)
            yield


async def test_the_file_is_synced_before_its_rename_and_both_syncs_before_the_receipt(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One-hop put: the temp file's fsync ends before the rename; the directory's before return."""
    await compact(harness, B)  # the store and its directories exist: only the put is recorded
    journal = Journal()
    with journal.installed(monkeypatch):
        await compact(harness, A)
    events = journal.events
    rename = events.index(("rename", hex_of(A)))
    assert ("fsync-end", "file") in events[:rename]
    assert ("fsync-start", "dir") in events[rename:]
    # Every fsync started had returned when the receipt was handed.
    assert sum(e[0] == "fsync-start" for e in events) == sum(e[0] == "fsync-end" for e in events)
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)


async def test_a_failed_file_fsync_gives_no_receipt_and_publishes_no_file(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO from the temp file's fsync fails the put: no rename, no temp file left, nothing read.

    The row was committed beside that fsync (``publish_recorded``) and stays: it names no
    file, so it reads Missing, and the next put of the value writes the file (as a key that
    was live: ``reused``) and reads it back Found.
    """
    await compact(harness, B)
    root = store_root(harness.fs)
    journal = Journal(fail=lambda fd: not _is_dir(fd))
    with journal.installed(monkeypatch), pytest.raises(OSError, match="could not"):
        await compact(harness, A)
    assert ("fsync-failed", "file") in journal.events
    assert not any(e[0] == "rename" for e in journal.events)
    assert entry_files(root) == {hex_of(B)}
    assert index_rows(root) == {hex_of(A), hex_of(B)}  # committed before the fsync failed
    assert temp_files(root) == []
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Missing()
    # The write lock was given back: the next put goes through at once.
    with anyio.fail_after(30):  # under the 60 s a put waits for a held lock
        again = await compact(harness, A)
    assert again.receipt.exact_cache == "reused"
    assert entry_files(root) == {hex_of(A), hex_of(B)}
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)


async def test_a_put_failing_after_its_row_leaves_no_name_taken_as_synced(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its row (this process's writer) stays, naming a file it never renamed. When another
    writer's file lands there (renamed, its directory's fsync maybe still to come), compacting
    the value again renews it: that renewal must fsync the directory itself before its
    receipt, not take the name as synced by this process (it was renewed on the loop with no
    fsync before the failure was remembered)."""
    await compact(harness, B)
    root = store_root(harness.fs)
    failing = Journal(fail=lambda fd: not _is_dir(fd))
    with failing.installed(monkeypatch), pytest.raises(OSError, match="could not"):
        await compact(harness, A)
    assert index_rows(root) == {hex_of(A), hex_of(B)}
    entry_path(root, hex_of(A)).write_bytes(canonical(A))  # another writer's rename
    journal = Journal()
    with journal.installed(monkeypatch):
        again = await compact(harness, A)
    assert again.receipt.exact_cache == "reused"
    assert ("fsync-end", "dir") in journal.events
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)


async def test_a_failed_directory_fsync_beside_the_commit_gives_no_receipt(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO from the directory's fsync fails the put even though the row committed beside it."""
    await compact(harness, B)
    journal = Journal(fail=_is_dir)
    with journal.installed(monkeypatch), pytest.raises(OSError, match="could not"):
        await compact(harness, A)
    assert ("fsync-failed", "dir") in journal.events
    # Nothing was handed out; whatever the index kept never reads as a wrong value.
    read = await rc.response_compaction_read_exact(harness, ref_of(A), Exact)
    assert read in (rc.Found(value=A), rc.Missing())
    again = await compact(harness, A)
    assert again.receipt.exact_ref == ref_of(A)
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)


async def test_a_failed_directory_fsync_fails_the_stepwise_put_too(harness: rc.Harness) -> None:
    """Through an injected backend (the stepwise writer), a directory fsync error is raised."""
    failing = Journal(fail=_is_dir)

    @contextlib.contextmanager
    def in_thread(fn: Callable[..., Any]) -> Iterator[None]:
        if getattr(fn, "__name__", "") != "publish":
            yield
            return
        with pytest.MonkeyPatch.context() as patch, failing.installed(patch):
            yield

    faulty = with_backend(harness, FaultyBackend(in_thread=in_thread))
    with pytest.raises(OSError, match="could not"):
        await compact(faulty, A)
    assert ("fsync-failed", "dir") in failing.events
    assert (await compact(harness, A)).receipt.exact_ref == ref_of(A)
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)


async def test_a_row_whose_file_never_reached_its_directory_is_written_again(
    harness: rc.Harness,
) -> None:
    """A crash between COMMIT and the directory's fsync: the row reads Missing, then heals."""
    await compact(harness, A)
    root = store_root(harness.fs)
    entry_path(root, hex_of(A)).unlink()  # the row is durable, the name was not
    assert index_rows(root) == {hex_of(A)}
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Missing()
    await compact(harness, A)
    assert entry_files(root) == {hex_of(A)}
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)
    store = await open_store(harness.fs)
    assert await store.prune() == 0
    assert entry_files(root) == {hex_of(A)}


def test_work_aside_returns_its_result_and_raises_its_error() -> None:
    """Aside.wait gives what the helper's call returned, or raises what it raised."""
    assert _aside.Aside(sum, (1, 2, 3)).wait() == 6
    failing = _aside.Aside(_aside.fsync, 1 << 30)  # no such fd: fsync fails with EBADF
    failing.join()  # returns once done, raising nothing
    with pytest.raises(OSError, match="Bad file descriptor") as raised:
        failing.wait()
    assert raised.value.errno == errno.EBADF


def test_a_job_run_keeps_no_hold_on_its_arguments() -> None:
    """A helper between jobs (or a copy of the job left in its queue) held the job, and with
    it the arguments: a read's whole buffer stayed in memory until the helper's next job."""

    class Buffer:
        pass

    buffer = Buffer()
    held = weakref.ref(buffer)
    job = _aside.Aside(id, buffer, pool=f"test-{secrets.token_hex(4)}")
    assert job.wait() == id(buffer)
    del buffer
    assert held() is None


def test_a_job_run_keeps_no_hold_on_the_object_of_its_method() -> None:
    """A job whose function is a bound method of an object that holds the job (a landing
    read holds its reader): once run, the two are freed without waiting for the cyclic GC."""

    class Reader:
        def __init__(self) -> None:
            self.job = _aside.Aside(self.read, pool=f"test-{secrets.token_hex(4)}")

        def read(self) -> int:
            return 7

    gc.disable()
    try:
        reader = Reader()
        held = weakref.ref(reader)
        assert reader.job.wait() == 7
        del reader
        assert held() is None
    finally:
        gc.enable()


def _helper_threads(pool: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"response-compaction-{pool}"]


_STUCK_AT_EXIT = """
import os, threading
from response_compaction._store import _aside
os.fsync = lambda fd: threading.Event().wait()  # a disk that never answers (the fsync seam)
_aside.EXIT_WAIT_SECONDS = 0.2
_aside.Aside(_aside.fsync, 0)  # queued to a helper thread, never waited for
"""


def test_a_helper_stuck_in_a_disk_wait_does_not_hold_the_process_at_exit() -> None:
    """The exit handler joined every helper without a bound: a hung fsync hung the exit."""
    done = subprocess.run(
        [sys.executable, "-c", _STUCK_AT_EXIT],
        cwd=Path(__file__).resolve().parent.parent,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0


def test_aside_helpers_stay_within_their_bound_and_are_reused() -> None:
    """A pool runs at most MAX_THREADS jobs at once (the rest wait their turn), then reuses them."""
    pool = f"test-{secrets.token_hex(4)}"
    release = threading.Event()
    running: list[str] = []

    def job(i: int) -> int:
        running.append(threading.current_thread().name)
        release.wait(timeout=30)
        return i

    count = _aside.MAX_THREADS + 2
    jobs = [_aside.Aside(job, i, pool=pool) for i in range(count)]
    assert len(_helper_threads(pool)) == _aside.MAX_THREADS
    release.set()
    assert [j.wait() for j in jobs] == list(range(count))
    assert running == [f"response-compaction-{pool}"] * count
    for i in range(20):  # one after another: an idle helper takes each, none is started
        assert _aside.Aside(int, i, pool=pool).wait() == i
    assert len(_helper_threads(pool)) == _aside.MAX_THREADS


def test_an_aside_begun_is_under_way_when_made() -> None:
    """``begun`` returns once a helper runs the job; ``done`` says when it has returned."""
    pool = f"test-{secrets.token_hex(4)}"
    started, release = threading.Event(), threading.Event()

    def job() -> str:
        started.set()
        release.wait(timeout=30)
        return threading.current_thread().name

    aside = _aside.begun(pool, job)
    assert started.is_set()
    assert not aside.done()
    release.set()
    assert aside.wait() == f"response-compaction-{pool}"
    assert aside.done()


def test_helpers_end_at_exit_and_later_work_runs_in_its_caller() -> None:
    """At exit the helpers finish what was queued and end; an Aside made after runs inline."""
    script = textwrap.dedent(
        """
        import threading
        from response_compaction._store import _aside
        first = _aside.Aside(threading.current_thread)
        assert first.wait() is not threading.main_thread()
        _aside._stop_helpers()  # what the interpreter's exit runs
        assert threading.active_count() == 1, threading.enumerate()
        assert _aside.Aside(threading.current_thread).wait() is threading.main_thread()
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")


async def _temp_items(harness: rc.Harness, count: int) -> tuple[str, list[Publication]]:
    """``count`` temp files in the store's ``tmp/``, each ready to publish under its own key."""
    store = await open_store(harness.fs)
    items = []
    for i in range(count):
        value = Exact(rows=[Row(id=i, name=f"row {i}")], total=1)
        data, key = canonical(value), hex_of(value)
        name = f"{secrets.token_hex(12)}.tmp"
        (Path(store.root) / "tmp" / name).write_bytes(data)
        items.append(
            Publication(name, "exact", key, _index.Row(key, len(data), 1e12, None), 1.0, 100)
        )
    return store.root, items


@pytest.mark.parametrize("fail", [False, True], ids=["ok", "eio"])
async def test_a_group_commit_syncs_every_directory_beside_its_commit(
    harness: rc.Harness, monkeypatch: pytest.MonkeyPatch, fail: bool
) -> None:
    """publish_all fsyncs each renamed fan-out before it returns, and raises a failed fsync."""
    root, items = await _temp_items(harness, 3)
    fanouts = {item.key[:2] for item in items}
    journal = Journal(fail=lambda fd: fail and _is_dir(fd))
    index = _indexes.acquire(root)
    try:
        with journal.installed(monkeypatch):
            if fail:
                with pytest.raises(OSError, match="injected"):
                    publish_all(index, items)
            else:
                assert publish_all(index, items) == [False, False, False]
    finally:
        _indexes.release(index)
    outcome = "fsync-failed" if fail else "fsync-end"
    assert journal.events.count((outcome, "dir")) == len(fanouts)
    assert sum(e[0] == "rename" for e in journal.events) == len(items)


async def test_the_index_is_free_for_other_writers_while_the_file_is_fsynced(
    harness: rc.Harness, workspace: rc.LocalWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's writer can take the index's write lock during the temp file's fsync."""
    await compact(harness, B)
    path = store_root(workspace) / "index.sqlite3"
    taken: list[bool] = []
    real_fsync = os.fsync

    def fsync(fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        real_fsync(fd)
        if _is_dir(fd):
            return
        # The temp file's fsync has returned, but the put is still inside it: the checks run
        # beside it have had the whole fsync to finish, and must not hold the write lock.
        # Waiting as long as it takes: the put's own COMMIT may be under way beside this
        # fsync (``publish_recorded``), but nothing of the put holds the lock until the fsync
        # has returned (that would wait here for GUARD_SECONDS, then fail).
        other = sqlite3.connect(path, timeout=GUARD_SECONDS, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # as another process's writer would
            other.execute("ROLLBACK")
            taken.append(True)
        except sqlite3.OperationalError:
            taken.append(False)
        finally:
            other.close()

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", fsync)
        await compact(harness, A)
    assert taken
    assert all(taken)
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)


class _DuringFileFsync:
    """``os.fsync`` and ``os.unlink`` twins: ``during(conn)`` runs inside the temp file's
    fsync, once the put's transaction has evicted ``evicted`` (so is under way), on another
    connection holding the index's write lock (so after that transaction's COMMIT)."""

    def __init__(self, evicted: str, during: Callable[[sqlite3.Connection], object]) -> None:
        self.evicting = threading.Event()
        self.seen: list[object] = []
        self._evicted, self._during = evicted, during

    @contextlib.contextmanager
    def installed(self, monkeypatch: pytest.MonkeyPatch, path: Path) -> Iterator[None]:
        real_fsync, real_unlink = os.fsync, os.unlink

        def unlink(name: Any, *args: Any, **kwargs: Any) -> None:
            if name == self._evicted:
                self.evicting.set()
            real_unlink(name, *args, **kwargs)

        def fsync(fd: Any) -> None:
            fd = fd if isinstance(fd, int) else fd.fileno()
            if not _is_dir(fd) and self.evicting.wait(timeout=GUARD_SECONDS):
                other = sqlite3.connect(path, timeout=GUARD_SECONDS, isolation_level=None)
                try:
                    other.execute("BEGIN IMMEDIATE")  # waits for the put's COMMIT
                    self.seen.append(self._during(other))
                    other.execute("COMMIT")
                finally:
                    other.close()
            real_fsync(fd)

        with monkeypatch.context() as patch:
            patch.setattr(os, "fsync", fsync)
            patch.setattr(os, "unlink", unlink)
            yield


def _exact_keys(conn: sqlite3.Connection) -> set[str]:
    return {str(k) for (k,) in conn.execute("SELECT key FROM entries WHERE kind = 'exact'")}


async def test_the_row_is_committed_while_the_file_is_fsynced(
    harness: rc.Harness, workspace: rc.LocalWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small value's row is committed beside its temp file's fsync, not after it: the two
    disk waits before the rename overlap. (Before, the COMMIT waited for the fsync: this
    fsync then waited GUARD_SECONDS for the eviction and saw nothing.) The rename still waits
    for the fsync, and the value reads back Found."""
    await compact(harness, B)
    twin = _DuringFileFsync(hex_of(B), _exact_keys)  # max_entries=1: A's transaction evicts B
    with twin.installed(monkeypatch, store_root(workspace) / "index.sqlite3"):
        out = await compact(harness, A, max_entries=1)
    assert twin.seen == [{hex_of(A)}]
    assert out.receipt.exact_cache == "stored"
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)


async def test_a_row_evicted_before_its_rename_leaves_no_file(
    harness: rc.Harness, workspace: rc.LocalWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer evicts the row between its COMMIT and the rename: the put's receipt
    reads Missing (evicted, as it could be just after the call), never a wrong value, and the
    file then renamed into place, which no row names, is unlinked by the put itself. (Before,
    it stayed until a prune.)"""
    await compact(harness, B)
    root = store_root(workspace)

    def evict(conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM entries WHERE kind = 'exact' AND key = ?", (hex_of(A),))

    twin = _DuringFileFsync(hex_of(B), evict)
    with twin.installed(monkeypatch, root / "index.sqlite3"):
        out = await compact(harness, A, max_entries=1)
    assert twin.seen == [None]
    assert out.receipt.exact_ref == ref_of(A)
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Missing()
    assert entry_files(root) == set()
    store = await open_store(harness.fs)
    assert await store.prune() == 0


def _on_check(number: int, act: Callable[[], object]) -> FaultyBackend:
    """A backend that runs ``act()`` just before ``verify``'s ``number``-th entry check."""
    checks = 0

    async def before_run(fn: Callable[..., Any]) -> None:
        nonlocal checks
        if getattr(fn, "__name__", "") == "check_entry":
            checks += 1
            if checks == number:
                act()

    return FaultyBackend(before_run=before_run)


async def test_verify_finds_a_file_renamed_into_place_after_the_walk_checked_it(
    harness: rc.Harness,
) -> None:
    """A row whose file is not there yet (a small put between its COMMIT and its rename)
    is looked at again after the walk: the file renamed in meanwhile reads found, not
    missing. (Before, the one walk reported it missing.)"""
    await compact(harness, A)
    await compact(harness, B)
    path = entry_path(store_root(harness.fs), hex_of(A))
    away = path.with_name("in-flight.tmp")
    path.rename(away)
    landed = with_backend(harness, _on_check(3, lambda: away.rename(path)))  # A's second look
    store = await open_store(landed.fs)
    reports = {report.key: report.state for report in await store.verify()}
    assert reports == {hex_of(A): "found", hex_of(B): "found"}


async def test_verify_still_reports_a_file_that_never_lands_as_missing(
    harness: rc.Harness,
) -> None:
    """The second look changes nothing for a row whose file is gone for good: missing."""
    await compact(harness, A)
    entry_path(store_root(harness.fs), hex_of(A)).unlink()
    looked: list[int] = []
    store = await open_store(with_backend(harness, _on_check(2, lambda: looked.append(2))).fs)
    assert [report.state for report in await store.verify()] == ["missing"]
    assert looked == [2]  # it did look again


async def test_verify_leaves_out_an_entry_evicted_after_the_walk_read_the_rows(
    harness: rc.Harness,
) -> None:
    """Another writer deletes a row and its file once the walk has read the rows: the entry
    no longer exists, so it is not reported (before, it was reported missing)."""
    await compact(harness, A)
    await compact(harness, B)
    root = store_root(harness.fs)

    def evict_a() -> None:
        entry_path(root, hex_of(A)).unlink()
        with contextlib.closing(sqlite3.connect(root / "index.sqlite3")) as conn, conn:
            conn.execute("DELETE FROM entries WHERE kind = 'exact' AND key = ?", (hex_of(A),))

    store = await open_store(with_backend(harness, _on_check(1, evict_a)).fs)
    assert [(report.key, report.state) for report in await store.verify()] == [(hex_of(B), "found")]


async def test_a_row_stored_again_before_the_rename_keeps_its_file(
    harness: rc.Harness, workspace: rc.LocalWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evicted between the COMMIT and the rename, then recorded again (as a put of the same
    value by another writer would, its own rename to come; here the same row, put back): the
    file renamed into place holds the same bytes, so the put leaves it, and the value reads
    Found. Only the first look (the row read without the lock) runs here."""
    await compact(harness, B)
    root = store_root(workspace)

    def evict_and_store_again(conn: sqlite3.Connection) -> None:
        where = "FROM entries WHERE kind = 'exact' AND key = ?"
        row = conn.execute(f"SELECT * {where}", (hex_of(A),)).fetchone()
        conn.execute(f"DELETE {where}", (hex_of(A),))
        conn.execute(f"INSERT INTO entries VALUES ({', '.join('?' * len(row))})", row)  # noqa: S608

    twin = _DuringFileFsync(hex_of(B), evict_and_store_again)
    with twin.installed(monkeypatch, root / "index.sqlite3"):
        await compact(harness, A, max_entries=1)
    assert twin.seen == [None]
    assert entry_files(root) == {hex_of(A)}
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)


async def test_a_renewal_finding_no_file_at_the_name_writes_the_value_again(
    harness: rc.Harness, workspace: rc.LocalWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer's live row is renewed after its bytes were checked, but its file is
    gone by then (evicted and unlinked, the row now there a put's whose rename is to come):
    the renewal, looking at the name under the lock, vouches for nothing and rolls back, and
    the value is written again, so it reads Found. The file goes just as the renewal looks
    at its name; with the look's answer ignored the renewal's receipt reads Missing here, as
    it did before the look was added (b342ecb, 5d7ca91)."""
    await compact(harness, A)
    root = store_root(workspace)
    with contextlib.closing(sqlite3.connect(root / "index.sqlite3")) as conn, conn:
        conn.execute("UPDATE entries SET writer = 'another writer'")  # its name not ours to trust
    path = entry_path(root, hex_of(A))
    real_stat = os.stat
    unlinked: list[Path] = []

    def stat(name: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if name == hex_of(A) and kwargs.get("dir_fd") is not None and not unlinked:
            path.unlink()  # the renewal's look at the bare name, in its fan-out directory
            unlinked.append(path)
        return real_stat(name, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    out = await compact(harness, A)
    assert unlinked == [path]
    assert out.receipt.exact_cache == "reused"  # its row was live
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(value=A)


async def test_a_file_a_busy_index_left_is_unlinked_between_tries(
    harness: rc.Harness, workspace: rc.LocalWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row evicted before its rename, and another process holding the index's write lock
    when the put looks again: the put's thread gives up after the lock's wait, and the call
    unlinks the file between tries once the lock is free (the other process lets go as the
    retry checks the store's root). No file outlives its row."""
    await compact(harness, B)
    root = store_root(workspace)
    root_path = (await open_store(harness.fs)).root
    fanout = entry_path(root, hex_of(A)).parent

    def evict_a(conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM entries WHERE kind = 'exact' AND key = ?", (hex_of(A),))

    holder: list[sqlite3.Connection] = []
    released: list[str] = []
    twin = _DuringFileFsync(hex_of(B), evict_a)
    with twin.installed(monkeypatch, root / "index.sqlite3"), monkeypatch.context() as patch:
        twin_fsync, real_lstat = os.fsync, os.lstat

        def fsync(fd: Any) -> None:
            twin_fsync(fd)
            fd = fd if isinstance(fd, int) else fd.fileno()
            renamed = twin.seen and _is_dir(fd) and os.fstat(fd).st_ino == fanout.stat().st_ino
            if renamed and not holder:  # A's directory, after its rename: hold the lock
                other = sqlite3.connect(
                    root / "index.sqlite3", isolation_level=None, check_same_thread=False
                )
                other.execute("BEGIN IMMEDIATE")
                holder.append(other)

        def lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            if holder and not released and os.fspath(path) == root_path:
                holder[0].execute("COMMIT")  # the retry's check of the root: let go
                holder[0].close()
                released.append(root_path)
            return real_lstat(path, *args, **kwargs)

        patch.setattr(os, "fsync", fsync)
        patch.setattr(os, "lstat", lstat)
        out = await compact(harness, A, max_entries=1)
    assert twin.seen == [None]
    assert released == [root_path]
    assert out.receipt.exact_ref == ref_of(A)
    assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Missing()
    assert entry_files(root) == set()
