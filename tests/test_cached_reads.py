"""Entries the page cache holds whole are read on the loop's thread, and checked there.

``_reading.read_cached`` asks the kernel only for bytes already in memory (``RWF_NOWAIT``);
anything it cannot vouch it read whole goes to a worker thread as before. Which thread
opened an entry is seen through the ``open`` audit event (``os.open`` raises it), and an
entry is pushed out of the page cache with ``POSIX_FADV_DONTNEED``, so each path is taken
for real.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import response_compaction as rc
from response_compaction._store import _reading
from response_compaction._store._reading import read_cached
from tests._store_support import compact, entry_path, hex_of, ref_of, seed_key, store_root
from tests.schemas import Exact, big_exact

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not _reading.CAN_READ_CACHED, reason="no RWF_NOWAIT reads here"),
]


def _refuses_nowait(directory: Path) -> bool:
    """Whether the file system of ``directory`` refuses ``RWF_NOWAIT`` reads (tmpfs does)."""
    probe = directory / "nowait-probe"
    probe.write_bytes(b"x")
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(2)], 0, os.RWF_NOWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
        probe.unlink()
    return False


@pytest.fixture
def cacheable(tmp_path: Path) -> None:
    """Skip where the test's own directory cannot be read from the cache alone."""
    if _refuses_nowait(tmp_path):
        pytest.skip("this file system refuses RWF_NOWAIT reads")


#: About 600 KB: past the 64 KB read inline anyway, within the 2 MB read from the cache.
MEDIUM = big_exact(10_000)
#: A few hundred bytes: read (and renewed when compacted again) on the loop when it can be.
SMALL = big_exact(3)
#: Names of the entries being watched, and the threads that opened them, in order.
_WATCHED: dict[str, list[str]] = {}


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _WATCHED and isinstance(args[0], str) and args[0] in _WATCHED:
        _WATCHED[args[0]].append(threading.current_thread().name)


_HOOKED: list[bool] = []


@pytest.fixture
def opened_by() -> Iterator[list[str]]:
    """The threads that open :data:`MEDIUM`'s entry file while the test runs."""
    yield from _watching(MEDIUM)


@pytest.fixture
def small_opened_by() -> Iterator[list[str]]:
    """The threads that open :data:`SMALL`'s entry file while the test runs."""
    yield from _watching(SMALL)


def _watching(value: Exact) -> Iterator[list[str]]:
    if not _HOOKED:  # a hook cannot be removed: added once, when first needed; idle after
        sys.addaudithook(_audit)
        _HOOKED.append(True)
    seen: list[str] = []
    _WATCHED[hex_of(value)] = seen
    try:
        yield seen
    finally:
        _WATCHED.clear()


def _evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache (clean pages: the store fsynced them).

    Not checked by reading from the cache: a read refused for want of pages starts reading
    them in (readahead), which is just what the library's own refused read does too.
    """
    if _mount_type(path) in ("tmpfs", "ramfs"):
        pytest.skip("this file system keeps every file in memory")  # DONTNEED drops nothing
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _mount_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (longest mount point above it)."""
    best, kind = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        point = fields[1].replace("\\040", " ")
        if str(path.resolve()).startswith(point.rstrip("/") + "/") and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


async def _stored(harness: rc.Harness) -> Path:
    out = await compact(harness, MEDIUM, summarize_above_bytes=1000)
    assert out.receipt.exact_cache == "stored"
    path = entry_path(store_root(harness.fs), hex_of(MEDIUM))
    assert 64 << 10 < path.stat().st_size < 2 << 20
    return path


@pytest.mark.usefixtures("cacheable")
async def test_a_cached_medium_entry_is_read_on_the_loop(
    harness: rc.Harness, opened_by: list[str]
) -> None:
    await _stored(harness)
    opened_by.clear()
    found = await rc.response_compaction_read_exact(harness, ref_of(MEDIUM), Exact)
    assert found == rc.Found(value=MEDIUM)
    assert opened_by == [threading.current_thread().name]


@pytest.mark.usefixtures("cacheable")
async def test_an_entry_not_in_the_page_cache_is_read_in_a_worker_thread(
    harness: rc.Harness, opened_by: list[str]
) -> None:
    path = await _stored(harness)
    _evict(path)
    opened_by.clear()
    found = await rc.response_compaction_read_exact(harness, ref_of(MEDIUM), Exact)
    assert found == rc.Found(value=MEDIUM)
    _tried_on_the_loop_then_read_by_a_worker(opened_by)


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda b: b[:1000] + bytes([b[1000] ^ 1]) + b[1001:], id="a-byte-flipped"),
        pytest.param(lambda b: b + b" ", id="a-byte-longer"),
        pytest.param(lambda b: b + b" " * 5000, id="longer"),
        pytest.param(lambda b: b[:-1], id="a-byte-shorter"),
    ],
)
@pytest.mark.usefixtures("cacheable")
async def test_a_tampered_cached_entry_reads_broken_on_the_loop(
    harness: rc.Harness, opened_by: list[str], tamper: object
) -> None:
    path = await _stored(harness)
    assert callable(tamper)
    path.write_bytes(tamper(path.read_bytes()))  # written through the cache: all in memory
    opened_by.clear()
    result = await rc.response_compaction_read_exact(harness, ref_of(MEDIUM), Exact)
    assert isinstance(result, rc.Broken)
    assert opened_by == [threading.current_thread().name]  # refused on the loop, no hop
    assert "nnnn" not in result.detail  # the content (names of n's) never reaches the detail


@pytest.mark.usefixtures("cacheable")
def test_read_cached_gives_the_whole_file_or_refuses(tmp_path: Path) -> None:
    content = bytes(range(256)) * 4096  # 1 MiB
    path = tmp_path / "f"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        assert bytes(read_cached(fd, size, size)) == content
        assert bytes(read_cached(fd, size - 10, size)) == content[: size - 9]  # limit + 1
        with pytest.raises(BlockingIOError):  # longer than its fstat said, within the limit
            read_cached(fd, size + 10, size - 10)
        with pytest.raises(BlockingIOError):  # an empty fstat says nothing: read elsewhere
            read_cached(fd, size, 0)
        os.fsync(fd)
        if _mount_type(path) in ("tmpfs", "ramfs"):
            pytest.skip("this file system keeps every file in memory")
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        with pytest.raises(BlockingIOError):  # none of it in the cache: EAGAIN
            read_cached(fd, size, size)
    finally:
        os.close(fd)


@pytest.mark.usefixtures("cacheable")
def test_read_cached_refuses_a_file_partly_in_the_cache(tmp_path: Path) -> None:
    """Its head read back in (a plain read and its readahead), the rest not: a short read."""
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * (64 << 10))  # 16 MiB: more than a readahead brings
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        os.fsync(fd)
        if _mount_type(path) in ("tmpfs", "ramfs"):
            pytest.skip("this file system keeps every file in memory")
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert len(os.pread(fd, 4096, 0)) == 4096
        with pytest.raises(BlockingIOError):
            read_cached(fd, size, size)
    finally:
        os.close(fd)


@pytest.fixture
def refusing_dir() -> Iterator[str]:
    """A fresh directory on a file system that refuses ``RWF_NOWAIT`` reads (a tmpfs), with
    the tests' store key; removed after."""
    shm = Path("/dev/shm")  # noqa: S108 - a tmpfs on purpose: the file system under test
    if not shm.is_dir() or not os.access(shm, os.W_OK) or not _refuses_nowait(shm):
        pytest.skip("no writable file system here that refuses RWF_NOWAIT reads")
    with tempfile.TemporaryDirectory(dir=shm) as base:
        seed_key(base)  # entries named as the tests name them
        yield base


async def test_a_file_system_that_refuses_cached_reads_is_not_asked_again(
    opened_by: list[str], refusing_dir: str
) -> None:
    """On tmpfs (Linux 6.18 refuses ``RWF_NOWAIT`` there) reads take the worker thread, and
    once refused the loop stops trying: no open of the entry on the loop's thread."""
    harness = rc.Harness(fs=rc.LocalWorkspace(refusing_dir), llm=None)
    await _stored(harness)
    for _ in range(2):
        opened_by.clear()
        found = await rc.response_compaction_read_exact(harness, ref_of(MEDIUM), Exact)
        assert found == rc.Found(value=MEDIUM)
    assert len(opened_by) == 1
    assert opened_by[0] != threading.current_thread().name


def _tried_on_the_loop_then_read_by_a_worker(opened: list[str]) -> None:
    """Tried from the cache on the loop (it would have waited), then read by a worker."""
    assert len(opened) == 2
    assert opened[0] == threading.current_thread().name
    assert opened[1] != threading.current_thread().name


async def _stored_small(harness: rc.Harness) -> Path:
    out = await compact(harness, SMALL)
    assert out.receipt.exact_cache == "stored"
    path = entry_path(store_root(harness.fs), hex_of(SMALL))
    assert path.stat().st_size < 4096
    return path


@pytest.mark.usefixtures("cacheable")
async def test_a_small_entry_not_in_the_page_cache_is_read_in_a_worker_thread(
    harness: rc.Harness, small_opened_by: list[str]
) -> None:
    """Read on the loop, a small entry pushed out of the cache was a disk read there."""
    path = await _stored_small(harness)
    _evict(path)
    small_opened_by.clear()
    found = await rc.response_compaction_read_exact(harness, ref_of(SMALL), Exact)
    assert found == rc.Found(value=SMALL)
    _tried_on_the_loop_then_read_by_a_worker(small_opened_by)
    small_opened_by.clear()  # read back in: the loop's own again
    assert await rc.response_compaction_read_exact(harness, ref_of(SMALL), Exact) == found
    assert small_opened_by == [threading.current_thread().name]


@pytest.mark.usefixtures("cacheable")
async def test_a_cache_hit_not_in_the_page_cache_is_renewed_in_a_worker_thread(
    harness: rc.Harness, small_opened_by: list[str]
) -> None:
    """The renewal on the loop reads the stored bytes too: not from a disk, either."""
    path = await _stored_small(harness)
    _evict(path)
    small_opened_by.clear()
    again = await compact(harness, SMALL)
    assert again.receipt.exact_cache == "reused"
    _tried_on_the_loop_then_read_by_a_worker(small_opened_by)
    small_opened_by.clear()
    assert (await compact(harness, SMALL)).receipt.exact_cache == "reused"
    assert small_opened_by == [threading.current_thread().name]  # cached: renewed on the loop
    found = await rc.response_compaction_read_exact(harness, ref_of(SMALL), Exact)
    assert found == rc.Found(value=SMALL)


async def test_small_entries_on_a_refusing_file_system_are_still_read_on_the_loop(
    small_opened_by: list[str], refusing_dir: str
) -> None:
    """A tmpfs holds every file in memory: once it refused, plain reads on the loop, as before
    (passes on the parent too: it guards against sending every small read to a worker)."""
    harness = rc.Harness(fs=rc.LocalWorkspace(refusing_dir), llm=None)
    await _stored_small(harness)
    for _ in range(2):
        small_opened_by.clear()
        found = await rc.response_compaction_read_exact(harness, ref_of(SMALL), Exact)
        assert found == rc.Found(value=SMALL)
    assert small_opened_by == [threading.current_thread().name]
    for _ in range(2):  # the first may find the log due a sync (``_wal``): a worker's then
        small_opened_by.clear()
        assert (await compact(harness, SMALL)).receipt.exact_cache == "reused"
    assert small_opened_by == [threading.current_thread().name]
