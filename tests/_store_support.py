"""Helpers for the store tests: the on-disk layout seen from outside, snapshots, fault seams."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import settings

import response_compaction as rc
from response_compaction import _fileio
from tests.schemas import FALLBACK, Exact, Summary

ROOT_NAME = "response-compaction-v1"

#: Hypothesis for these tests: modest example counts, and no deadline because event-loop
#: startup (trio or asyncio, a worker thread per file call) varies from run to run.
settings.register_profile("response_compaction_store", max_examples=100, deadline=None)
HYPOTHESIS = settings.get_profile("response_compaction_store")


def options(**overrides: Any) -> dict[str, Any]:
    """Compaction options with no model: fallback and ladder, plus ``overrides``."""
    return {"fallback": FALLBACK, "ladder": "cheap", **overrides}


async def compact(harness: Any, value: Any, **overrides: Any) -> rc.Compacted[Any, Any]:
    """``response_compact`` of an ``Exact`` value with :func:`options`."""
    return await rc.response_compact(harness, value, Exact, Summary, options(**overrides))


def canonical(value: Any) -> bytes:
    """The canonical form computed straight from msgspec, independently of the library."""
    return msgspec.json.encode(value, order="sorted")


def hex_of(value: Any) -> str:
    """The sha256 hex of ``value``'s canonical bytes (what its entry is named)."""
    return hashlib.sha256(canonical(value)).hexdigest()


def ref_of(value: Any) -> str:
    """The exact reference ``value`` gets."""
    return "rc1:" + hex_of(value)


def store_root(workspace: rc.Workspace | str | Path) -> Path:
    """The library's directory below a workspace."""
    base = workspace if isinstance(workspace, str | Path) else workspace.workspace_temp_dir()
    return Path(base) / ROOT_NAME


def entry_path(root: Path, hex_digest: str, kind: str = "exact") -> Path:
    """Where the entry for ``hex_digest`` lives."""
    return root / kind / hex_digest[:2] / hex_digest


def entry_files(root: Path, kind: str = "exact") -> set[str]:
    """Names of every non-directory below ``root/kind`` (entries, or anything else left)."""
    found: set[str] = set()
    base = root / kind
    if not base.exists():
        return found
    for dirpath, dirnames, filenames in os.walk(base):
        found.update(filenames)
        found.update(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))
    return found


def temp_files(root: Path) -> list[str]:
    """Whatever is in ``tmp/``."""
    tmp = root / "tmp"
    return sorted(os.listdir(tmp)) if tmp.exists() else []


def index_rows(root: Path, kind: str = "exact") -> set[str]:
    """Keys recorded in the index for ``kind`` (expired rows included)."""
    path = root / "index.sqlite3"
    if not path.exists():
        return set()
    conn = sqlite3.connect(path)
    try:
        return {
            str(key) for (key,) in conn.execute("SELECT key FROM entries WHERE kind = ?", (kind,))
        }
    finally:
        conn.close()


Snapshot = dict[str, tuple[int, int, int, int, str]]


def snapshot(top: Path) -> Snapshot:
    """Every path below ``top`` with its mode, size, mtime, inode and link target."""
    seen: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            target = os.readlink(path) if os.path.islink(path) else ""
            seen[os.path.relpath(path, top)] = (
                st.st_mode,
                st.st_size,
                st.st_mtime_ns,
                st.st_ino,
                target,
            )
    return seen


# ----------------------------------------------------------------------------- fault seams

WriteFn = Callable[[_fileio.AsyncBinaryFile, bytes | memoryview], Awaitable[int]]


class WrappedFile:
    """A temp file whose ``write`` goes through a test-chosen function."""

    def __init__(self, inner: _fileio.AsyncBinaryFile, write: WriteFn) -> None:
        self._inner = inner
        self._write = write

    async def write(self, data: bytes | memoryview, /) -> int:
        return await self._write(self._inner, data)

    async def read(self, size: int = -1, /) -> bytes:
        return await self._inner.read(size)

    async def close(self) -> None:
        await self._inner.close()

    def fileno(self) -> int:
        return self._inner.fileno()


def patch_temp_writes(monkeypatch: pytest.MonkeyPatch, write: WriteFn) -> None:
    """Route every write to a store temp file, on both backends, through ``write``."""
    for cls in (_fileio.AiofilesBackend, _fileio.AnyioBackend):
        original = cls.open

        async def open_(
            self: Any,
            path: str,
            mode: _fileio.Mode,
            opener: _fileio.Opener,
            _original: Any = original,
        ) -> _fileio.AsyncBinaryFile:
            file: _fileio.AsyncBinaryFile = await _original(self, path, mode, opener)
            return WrappedFile(file, write) if mode == "xb" else file

        monkeypatch.setattr(cls, "open", open_)


RunHook = Callable[[Callable[..., Any]], Awaitable[None]]


def patch_backend_run(monkeypatch: pytest.MonkeyPatch, before: RunHook) -> None:
    """Await ``before(fn)`` ahead of every blocking call the store makes through the seam."""
    for cls in (_fileio.AiofilesBackend, _fileio.AnyioBackend):
        original = cls.run

        async def run(
            self: Any, fn: Callable[..., Any], *args: Any, _original: Any = original
        ) -> Any:
            await before(fn)
            return await _original(self, fn, *args)

        monkeypatch.setattr(cls, "run", run)
