"""Checking bytes against their record: size and digest, schema, in a worker when large."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.lowlevel

from .. import _pool
from .._canonical import Span, decode_exact
from .._perf import paused_gc
from .._slices import decode_sliced
from ._fileio import FileBackend
from ._index import Entry
from ._paths import FILE_FLAGS, Kind, open_fanout, regular_opener

__all__ = [
    "EntryReport",
    "check_bytes",
    "check_entry",
    "checked_value",
    "decoded",
    "verify_file",
    "verify_path",
]

#: Verifying at least this many bytes (when nobody needs the value) runs in a worker process
#: when one is idle: msgspec holds the GIL while it decodes, so a thread would freeze the
#: caller's event loop for the whole decode, and concurrent verifications would share a core.
WORKER_VERIFY_BYTES = 512 << 10
#: Decoding more bytes than this in the caller's process pauses the cyclic GC meanwhile:
#: a full collection over a freshly decoded tree can cost more than the decode itself.
GC_PAUSE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class EntryReport:
    """One entry as ``verify`` saw it."""

    kind: Kind
    key: str
    state: Literal["found", "expired", "missing", "broken"]
    size: int
    detail: str = ""


def check_bytes(data: bytes, hex_digest: str, size: int) -> None:
    """Raise ``ValueError`` unless ``data`` is ``size`` bytes hashing to ``hex_digest``."""
    if len(data) != size:
        raise ValueError(f"truncated or padded: {len(data)} bytes on disk, {size} recorded")
    actual = hashlib.sha256(data).hexdigest()
    if actual != hex_digest:
        raise ValueError(f"bytes hash to sha256:{actual}, expected sha256:{hex_digest}")


async def read_all(backend: FileBackend, path: str, dir_fd: int | None = None) -> bytes:
    """The whole of a regular file, opened without following links."""
    file = await backend.open(path, "rb", regular_opener(dir_fd))
    try:
        return await file.read(-1)
    finally:
        with anyio.CancelScope(shield=True):
            await file.close()


async def checked_value(
    backend: FileBackend,
    data: bytes,
    hex_digest: str,
    size: int,
    schema: Any,
    spans: tuple[Span, ...],
) -> Any:
    """Digest-check ``data`` off the loop, then decode it, in slices when it is large."""
    await backend.run(check_bytes, data, hex_digest, size)
    return await decoded(data, schema, spans)


async def decoded(data: bytes, schema: Any, spans: tuple[Span, ...]) -> Any:
    """Decode checked bytes on the loop: whole when small, else in slices with the GC paused."""
    if len(data) < GC_PAUSE_BYTES:
        return decode_exact(data, schema)
    with paused_gc():
        return await decode_sliced(data, schema, spans, anyio.lowlevel.checkpoint)


async def verify_file(
    backend: FileBackend,
    path: str,
    hex_digest: str,
    size: int,
    schema: Any,
    spans: tuple[Span, ...],
    *,
    want_value: bool,
    use_worker: bool,
) -> Any:
    """Read a fresh temp file back and verify it; its value if ``want_value``, else None.

    Large files nobody needs the value of are verified in a worker process when
    ``use_worker``, one is idle and the schema can travel there; otherwise here, through
    ``backend``. Raises ``ValueError`` with what is wrong.
    """
    if use_worker and size >= WORKER_VERIFY_BYTES and not want_value:
        problem = await _pool.verify(path, hex_digest, size, schema)
        if problem is not _pool.NOT_DONE:
            if problem is not None:
                raise ValueError(problem)
            return None
    data = await read_all(backend, path)
    value = await checked_value(backend, data, hex_digest, size, schema, spans)
    return value if want_value else None


def verify_path(path: str, hex_digest: str, size: int, schema: Any) -> str | None:
    """In a worker process: read the file back and verify it; what is wrong, or None.

    ``OSError`` is left to the caller: "this worker could not do the job", not a verdict.
    """
    fd = os.open(path, os.O_RDONLY | FILE_FLAGS)
    with os.fdopen(fd, "rb", buffering=0) as file:
        data = file.readall()
    try:
        check_bytes(data, hex_digest, size)
        decode_exact(data, schema)
    except ValueError as exc:
        return str(exc)
    return None


def check_entry(root: str, entry: Entry, expired: bool) -> EntryReport:
    """Blocking: re-check one recorded entry's bytes against its digest (not its schema)."""
    kind, key, size = entry.kind, entry.key, entry.size
    try:
        fan_fd = open_fanout(root, kind, key)
        try:
            fd = regular_opener(fan_fd)(key, os.O_RDONLY)
        finally:
            os.close(fan_fd)
    except FileNotFoundError:
        return EntryReport(kind, key, "missing", size)
    except OSError as exc:
        return EntryReport(kind, key, "broken", size, f"cannot open: {exc.strerror or exc}")
    with os.fdopen(fd, "rb", buffering=0) as file:
        data = file.readall()
    try:
        check_bytes(data, entry.digest, size)
    except ValueError as exc:
        return EntryReport(kind, key, "broken", size, str(exc))
    return EntryReport(kind, key, "expired" if expired else "found", size)
