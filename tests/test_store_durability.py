"""Durability and safety of what the store creates: parents fsynced, private modes."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import response_compaction as rc
from tests._store_support import FaultyBackend, compact, entry_path, hex_of, store_root
from tests.schemas import Exact, Row

pytestmark = pytest.mark.anyio

A = Exact(rows=[Row(id=1, name="alpha")], total=1)


class FsyncRecorder:
    """Records the (dev, inode) of every fd fsynced inside the store's blocking calls."""

    def __init__(self) -> None:
        self.synced: set[tuple[int, int]] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, fn: Callable[..., Any]) -> Iterator[None]:
        real = os.fsync

        def fsync(fd: Any) -> None:
            st = os.fstat(fd if isinstance(fd, int) else fd.fileno())
            with self._lock:
                self.synced.add((st.st_dev, st.st_ino))
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
    await compact(rc.Harness(fs=workspace, llm=None), A)
    root = store_root(ws)
    entry = entry_path(root, hex_of(A))
    parents = [tmp_path, tmp_path / "a", tmp_path / "a" / "b", ws, root, root / "exact"]
    parents.append(entry.parent)  # the rename of the entry itself
    missing = [str(p.relative_to(tmp_path)) for p in parents if _identity(p) not in recorder.synced]
    assert missing == []
