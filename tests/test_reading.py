"""Reading entries into memory: bounded, hashed as read, and never a view of the file itself.

Parts of large entries are read into fresh private memory and hashed piece by piece as
they land (``_store._reading``). These tests hold that read to what a plain ``os.read`` of
the same file gives, at and around the size where it takes over, and the reads through the
public API to "found means the value stored".
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import response_compaction as rc
from response_compaction import _store
from response_compaction._store import _reading
from response_compaction._store._reading import read_hashed, read_limited
from tests._store_support import LARGE, TEST_KEY, read_helpers_around
from tests.schemas import Exact

pytestmark = pytest.mark.anyio
PIECE = 2 << 20
#: The size from which entries are hashed as read, lowered from 32 MiB for these tests: the
#: same code at a tenth of the bytes (the threshold is where it pays, not where it works).
PAGED_BYTES = 4 << 20


@pytest.fixture(autouse=True)
def _hashed_from_4_mib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        _reading, "HASHED_BYTES", PAGED_BYTES
    )  # _reading's piece: a size of a few pieces and a remainder crosses them all


def _content(size: int) -> bytes:
    return (bytes(range(256)) * (size // 256 + 1))[:size]


def _keyed(data: bytes) -> str:
    return hmac.new(TEST_KEY, data, hashlib.sha256).hexdigest()


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[Any]:
    """``opened(content)``: a file holding ``content``, open for reading (closed after)."""
    fds: list[int] = []

    def make(content: bytes) -> int:
        path = tmp_path / f"f{len(fds)}"
        path.write_bytes(content)
        fds.append(os.open(path, os.O_RDONLY))
        return fds[-1]

    yield make
    for fd in fds:
        os.close(fd)


@pytest.mark.parametrize(
    "size", [PAGED_BYTES - 2, PAGED_BYTES - 1, PAGED_BYTES, PAGED_BYTES + 1, 3 * PIECE + 7]
)
@pytest.mark.parametrize("limit_over_size", [0, -1, -(PIECE + 3), 5])
def test_reads_are_a_plain_reads_bytes_and_their_digest(
    opened: Any, size: int, limit_over_size: int
) -> None:
    """At most ``limit + 1`` bytes, whatever the size; the digest is of exactly those."""
    content = _content(size)
    limit = size + limit_over_size
    expected = content[: limit + 1]
    assert bytes(read_limited(opened(content), limit)) == expected
    data, digest = read_hashed(opened(content), limit, TEST_KEY)
    assert bytes(data) == expected
    assert digest == _keyed(expected)
    if len(expected) >= PAGED_BYTES:  # a view of fresh memory, which nobody may write
        assert isinstance(data, memoryview)
        assert data.readonly


@pytest.mark.parametrize("real", [PAGED_BYTES + 5000, 3 * PIECE + 7])
@pytest.mark.parametrize("said", [0, PAGED_BYTES + 100, PAGED_BYTES + 9000, 4 * PIECE])
@pytest.mark.parametrize("limit_over_real", [10, -2000])
def test_a_file_grown_or_shrunk_since_its_fstat_is_read_to_its_end(
    opened: Any, real: int, said: int, limit_over_real: int
) -> None:
    """The fstat's size (``said``) only sizes the first read: a longer file is read on and
    hashed after it, a shorter one ends where it ends, as a plain read would. (Some FUSE file
    systems say 0 of any file.)"""
    content = _content(real)
    limit = real + limit_over_real
    expected = content[: limit + 1]
    assert bytes(read_limited(opened(content), limit, said)) == expected
    data, digest = read_hashed(opened(content), limit, TEST_KEY, said)
    assert bytes(data) == expected
    assert digest == _keyed(expected)


@pytest.mark.parametrize("size", [PAGED_BYTES - 1, 3 * PIECE + 7])
def test_later_writes_to_the_file_never_show_in_what_was_read(tmp_path: Path, size: int) -> None:
    """What was read is this process's copy: a file rewritten in place afterwards (same inode)
    does not change it, as it would a mapping of the file."""
    path = tmp_path / "entry"
    content = _content(size)
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    try:
        plain = read_limited(fd, size)
        os.lseek(fd, 0, os.SEEK_SET)
        hashed, digest = read_hashed(fd, size, TEST_KEY)
    finally:
        os.close(fd)
    with path.open("r+b") as file:
        file.write(b"\xff" * size)
    assert bytes(plain) == content
    assert bytes(hashed) == content
    assert digest == _keyed(content)


def test_a_read_failing_midway_raises_and_nothing_waits_for_it(tmp_path: Path) -> None:
    """The helper's failed ``readv`` (here on a file open for writing only) ends the hashing
    and is raised by the caller: no hang, no bytes."""
    path = tmp_path / "entry"
    path.write_bytes(_content(3 * PIECE + 7))
    fd = os.open(path, os.O_WRONLY)
    try:
        with pytest.raises(OSError, match=os.strerror(errno.EBADF)):
            read_hashed(fd, 3 * PIECE + 7, TEST_KEY)
    finally:
        os.close(fd)


def test_a_sparse_terabyte_read_whole_is_an_oserror_not_a_crash(tmp_path: Path) -> None:
    """Asked for more than memory can hold (a forged row over a planted sparse file): OSError."""
    if Path("/proc/sys/vm/overcommit_memory").read_text().strip() != "0":
        pytest.skip("only the kernel's heuristic overcommit refuses a terabyte at once")
    path = tmp_path / "sparse"
    path.touch()
    os.truncate(path, 1 << 40)  # no disk used
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="too large to read into memory"):
            read_limited(fd, 1 << 41)
        with pytest.raises(OSError, match="too large to read into memory"):
            read_hashed(fd, 1 << 41, TEST_KEY)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- through the API


async def test_parts_and_values_of_a_large_entry_read_back_exactly(
    harness: rc.Harness, large: tuple[str, Path]
) -> None:
    ref, _ = large
    part = await rc.response_compaction_read_part(harness, ref, pointer="/rows/99999")
    assert isinstance(part, rc.Found)
    assert part.value.value == msgspec.to_builtins(LARGE.rows[99999])
    window = await rc.response_compaction_read_part(harness, ref, pointer="/rows", start=50_000)
    assert isinstance(window, rc.Found)
    assert window.value.value[0]["id"] == 50_000
    assert await rc.response_compaction_read_exact(harness, ref, Exact) == rc.Found(value=LARGE)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[data.rindex(b"nnnn")] = ord("m")  # still valid JSON, still valid Exact
    path.write_bytes(bytes(data))


def _grow(path: Path) -> None:
    with path.open("ab") as file:
        file.write(b" ")


def _symlink(path: Path) -> None:
    moved = path.with_name("elsewhere")
    path.rename(moved)
    path.symlink_to(moved)


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [(_flip, "does not verify"), (_grow, "does not verify"), (_symlink, "symlink")],
    ids=["flipped", "grown", "symlink"],
)
async def test_a_tampered_large_entry_reads_broken(
    harness: rc.Harness, large: tuple[str, Path], tamper: Any, expected: str
) -> None:
    """Parts are cut only from bytes whose digest, taken as they were read, is the
    reference's; the whole value likewise."""
    ref, path = large
    tamper(path)
    for result in (
        await rc.response_compaction_read_part(harness, ref, pointer="/rows/99999"),
        await rc.response_compaction_read_exact(harness, ref, Exact),
    ):
        assert isinstance(result, rc.Broken)
        assert expected in result.detail
        assert "mnnn" not in result.detail


async def test_a_removed_large_entry_reads_missing(
    harness: rc.Harness, large: tuple[str, Path]
) -> None:
    ref, path = large
    path.unlink()
    assert await rc.response_compaction_read_part(harness, ref, pointer="/rows/0") == rc.Missing()


async def test_verify_reads_a_grown_entry_no_further_than_a_byte_past_its_row(
    harness: rc.Harness, large: tuple[str, Path]
) -> None:
    """``verify`` read every entry whole: one grown to a sparse terabyte was a MemoryError."""
    _, path = large
    os.truncate(path, 1 << 40)  # sparse: no disk used
    store = await _store.open_store(harness.fs)
    (report,) = await store.verify()
    assert report.state == "broken"
    assert "hash" in report.detail


@pytest.mark.parametrize(("rows", "expected"), [(1_000, "0 0"), (100_000, "0 1")])
def test_only_a_large_entry_is_read_by_a_helper_and_hashed_as_it_lands(
    tmp_path: Path, rows: int, expected: str
) -> None:
    """A fresh process: no read helper before ``read_part``; one after it for a large entry
    (the piecewise read, hashed as it lands), none for a small one (one read, one hash)."""
    call = "rc.response_compaction_read_part(harness, ref, pointer='/rows/0')"
    assert read_helpers_around(tmp_path / "ws", rows, call) == expected.split()
