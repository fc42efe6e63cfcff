"""An entry removed (evicted by another process) between a reader's open and its ``fstat``."""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import response_compaction as rc
from response_compaction._store import _paths
from tests._store_support import compact, entry_path, hex_of, ref_of, store_root
from tests.schemas import Exact, Row

A = Exact(rows=[Row(id=1, name="alpha")], total=1)


@contextmanager
def removed_before_fstat(path: Path) -> Iterator[list[str]]:
    """Unlink ``path`` when ``open_regular`` (in any thread) has opened it and is about to
    ``fstat`` it: what another process's eviction does in that instant. Yields the threads
    in which it happened."""
    done: list[str] = []
    real_fstat = os.fstat

    def fstat(fd: int) -> os.stat_result:
        # Replaced for every thread at once: a profile hook (threading.setprofile) reaches
        # only threads started after it, not a worker thread that already exists.
        opening = sys._getframe(1).f_code is _paths.open_regular.__code__
        if opening and not done and path.exists():
            done.append(threading.current_thread().name)
            path.unlink()
        return real_fstat(fd)

    os.fstat = fstat
    try:
        yield done
    finally:
        os.fstat = real_fstat


def test_a_file_removed_while_it_is_opened_is_gone_not_foreign(tmp_path: Path) -> None:
    """A link count of 0 after the open is a removal, not a hard link to refuse."""
    path = tmp_path / "entry"
    path.write_bytes(b"{}")
    dir_fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with removed_before_fstat(path) as done, pytest.raises(FileNotFoundError) as gone:
            _paths.open_regular("entry", dir_fd)
    finally:
        os.close(dir_fd)
    assert done
    assert gone.value.errno == errno.ENOENT


@pytest.mark.anyio
async def test_an_entry_evicted_while_it_is_read_reads_missing(harness: rc.Harness) -> None:
    """Processes sharing a small store under eviction read Missing, never Broken, when the
    entry goes between their open and its check (seen once in a slow CI run)."""
    await compact(harness, A)
    path = entry_path(store_root(harness.fs), hex_of(A))
    with removed_before_fstat(path) as done:
        read = await rc.response_compaction_read_exact(harness, ref_of(A), Exact)
    assert done
    assert read == rc.Missing()
