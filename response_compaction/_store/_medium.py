"""Values of up to a few MB, whole in memory: the streaming algorithm in three hops.

The call-by-call algorithm (``_stepwise``) takes about ten worker-thread hops per value (open
the temp directory, open the file, a write per piece, fsync, open, read and close to read it
back, a hash, the index, the publish, the closes), and verifies a value over half a megabyte in
a worker process, a round trip of about 2 ms. For 1 MB that was a third of the time the work
itself takes. A value the encoder gave whole (up to ``MEDIUM_BYTES``) goes through the same
steps in the same order, with the same checks, in fewer calls:

1. one call creates the temp file, writes every piece (looping on short writes) and hashes it;
2. its fsync runs beside the verification (read back by name, keyed digest, schema), as in
   the streaming algorithm: the read-back sees the bytes written whether or not they are on
   disk yet, and nothing is published before both end;
3. the publish (rename, directory fsync, row), in a group commit with this loop's others.

The verification runs in a worker thread of this process when this loop stores no other
value meanwhile: decoding a few MB holds the GIL for a few milliseconds, which the caller's
loop can spare, and the value a receipt hands back is that decode's. When others are being
stored, it goes to the pool's worker processes (``_verifiers``), so that many values at once
use every core; the caller's thread does it when no worker of this loop is free.

Only the library's own file backends take this path; an injected backend (the tests' fault
seam) gets the streaming algorithm, call by call.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import functools
import os
import secrets
import threading
from collections.abc import Sequence
from typing import Any

import anyio

from .. import _pool, _verifiers
from .._canonical import Span, decode_exact
from .._digest import new_hasher
from .._errors import map_errors
from .._perf import paused_gc
from . import _index
from ._commit import Publication
from ._group import publish_grouped
from ._paths import FILE_FLAGS, Kind, open_dir, regular_opener, unlink_quietly
from ._stepwise import INDEX_ERRORS, Stepwise, Stored
from ._turns import others_storing
from ._verify import WORKER_VERIFY_BYTES, check_digest

__all__ = ["MEDIUM_BYTES", "Medium"]

#: Values up to this size are gathered whole on the loop and stored in three hops; decoding
#: this much holds the GIL for about 5-10 ms, reading it back from the page cache far less.
MEDIUM_BYTES = 2 << 20
#: Syncer threads: a few fsyncs at once keep a disk busy; more only queue in the kernel.
SYNCERS = 4


class _Temp:
    """A temporary file being written: its directory's fd, its own fd (until closed), name.

    Its fsync runs in one of this module's syncer threads, started as soon as it is written:
    a worker thread started later waits for the GIL while the verification decodes (msgspec
    holds it throughout), so an fsync asked for beside the decode began after it.
    """

    __slots__ = ("dir_fd", "fd", "name", "synced")

    def __init__(self, dir_fd: int, fd: int, name: str) -> None:
        self.dir_fd = dir_fd
        self.fd = fd
        self.name = name
        self.synced: concurrent.futures.Future[None] | None = None

    def start_sync(self) -> None:
        """Blocking: have a syncer thread fsync and close the file; return once it began."""
        began = threading.Event()

        def sync() -> None:
            began.set()
            self._sync_close()

        try:
            self.synced = _syncers().submit(sync)
        except RuntimeError:  # the interpreter is shutting down: no new threads
            return  # wait_synced then syncs in the caller's thread
        began.wait()

    def _sync_close(self) -> None:
        fd, self.fd = self.fd, -1
        try:
            os.fsync(fd)
        finally:
            os.close(fd)  # a failing close after fsync is still a failure to retain

    def wait_synced(self) -> None:
        """Blocking: wait for the fsync and close; raise ``OSError`` if either failed."""
        if self.synced is None:
            self._sync_close()
        else:
            self.synced.result()

    def discard(self, *, published: bool) -> None:
        """Blocking: close what is still open, and unlink the file unless it was published."""
        try:
            if self.synced is not None:
                with contextlib.suppress(OSError):
                    self.synced.result()  # the syncer owns the file's fd until it is done
            elif self.fd >= 0:
                fd, self.fd = self.fd, -1
                with contextlib.suppress(OSError):
                    os.close(fd)
            if not published:
                unlink_quietly(self.name, self.dir_fd)
        finally:
            os.close(self.dir_fd)


_syncers_lock = threading.Lock()
_syncers_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _syncers() -> concurrent.futures.ThreadPoolExecutor:
    """The syncer threads of this process: they only ever fsync and close, never wait on us."""
    global _syncers_pool
    with _syncers_lock:
        if _syncers_pool is None:
            _syncers_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=SYNCERS, thread_name_prefix="rc-fsync"
            )
        return _syncers_pool


def _after_fork() -> None:
    global _syncers_pool
    # The parent's threads do not exist in a forked child: a pool that believes they idle
    # would queue work that never runs.
    _syncers_pool = None


os.register_at_fork(after_in_child=_after_fork)


def _write_temp(
    tmp_path: str, name: str, pieces: Sequence[bytes | memoryview], key: bytes
) -> tuple[_Temp, str]:
    """Blocking: create ``name`` in ``tmp_path``, write and hash ``pieces``: (temp, digest)."""
    dir_fd = open_dir(tmp_path, False)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=dir_fd)
    except BaseException:
        os.close(dir_fd)
        raise
    temp = _Temp(dir_fd, fd, name)
    try:
        hasher = new_hasher(key)
        for piece in pieces:
            hasher.update(piece)  # lets go of the GIL for large pieces
            _write_all(fd, piece)
        temp.start_sync()
    except BaseException:
        temp.discard(published=False)
        raise
    return temp, hasher.hexdigest()


def _write_verified(
    tmp_path: str, name: str, pieces: Sequence[bytes | memoryview], size: int, schema: Any,
    key: bytes,
) -> tuple[_Temp, str, Any]:  # fmt: skip
    """Blocking: :func:`_write_temp`, then :func:`_verify_temp`: (temp, digest, value).

    The temp file is discarded if it does not verify (``ValueError``) or anything else fails.
    """
    temp, hex_digest = _write_temp(tmp_path, name, pieces, key)
    try:
        value = _verify_temp(temp, hex_digest, size, schema, key)
    except BaseException:
        temp.discard(published=False)
        raise
    return temp, hex_digest, value


def _write_all(fd: int, piece: bytes | memoryview) -> None:
    view = memoryview(piece).cast("B")
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]


def _verify_temp(temp: _Temp, hex_digest: str, size: int, schema: Any, key: bytes) -> Any:
    """Blocking: read the temp file back, check its keyed digest and decode it: the value.

    Raises ``ValueError`` saying what is wrong. At most one byte more than written is read:
    enough to tell that the file grew.
    """
    fd = regular_opener(temp.dir_fd)(temp.name, os.O_RDONLY)
    try:
        data = os.read(fd, size + 1)
        while len(data) <= size and (chunk := os.read(fd, size + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    check_digest(data, hex_digest, size, key)
    with paused_gc():  # a young collection over the fresh tree costs more than the decode
        value = decode_exact(data, schema)
    temp.wait_synced()
    return value


class Medium(Stepwise):
    """The put of a value whole in memory in two or three hops (see the module docstring)."""

    async def _put_medium(
        self,
        kind: Kind,
        key: str | None,
        pieces: Sequence[bytes | memoryview],
        size: int,
        layout: list[Span] | None,
        schema: Any,
        ttl_seconds: int,
        max_entries: int,
        want_value: bool,
    ) -> Stored:
        name = f"{secrets.token_hex(12)}.tmp"
        tmp_path = os.path.join(self.root, "tmp")
        backend = self._backend
        # A worker process verifies only a value nobody wants back (it would be decoded
        # twice), and only while others are being stored on this loop.
        elsewhere = not want_value and size >= WORKER_VERIFY_BYTES and others_storing()
        with map_errors(f"could not retain the {kind} value"):
            if elsewhere:
                temp, hex_digest = await backend.run(_write_temp, tmp_path, name, pieces, self._key)
                verified: list[Any] = []
            else:
                temp, hex_digest, value = await backend.run(
                    _write_verified, tmp_path, name, pieces, size, schema, self._key
                )
                verified = [value]
                del value  # ``verified`` holds the only reference (see below)
            published = False
            try:
                if elsewhere:
                    await self._verify_elsewhere(temp, hex_digest, size, schema)
                now = self.clock()
                entry = key or hex_digest
                row = self._new_row(kind, entry, hex_digest, size, now + ttl_seconds, layout)
                reused = await self._publish_item(
                    Publication(name, kind, entry, row, now, max_entries)
                )
                published = True
            finally:
                if published:
                    os.close(temp.dir_fd)  # a directory's fd: nothing to flush
                else:
                    with anyio.CancelScope(shield=True):
                        await backend.run(functools.partial(temp.discard, published=False))
        stored = Stored(hex_digest=hex_digest, size=size, reused=reused,
                        value=verified[0] if want_value else None)  # fmt: skip
        if verified and not want_value:
            # Freeing a decoded tree nobody asked for holds the GIL for about a millisecond a
            # megabyte: a syncer thread frees it once the entry is published and the caller
            # has its receipt, as a caller frees a value it was handed.
            with contextlib.suppress(RuntimeError):  # shutting down: freed here instead
                _syncers().submit(verified.clear)
        return stored

    async def _verify_elsewhere(self, temp: _Temp, hex_digest: str, size: int, schema: Any) -> None:
        """Verify in a pool worker, or in a thread here when none is free; ``ValueError``."""
        path = os.path.join(self.root, "tmp", temp.name)
        problem = await _verifiers.verify(path, hex_digest, size, schema, self._key)
        if problem is _pool.NOT_DONE:
            await self._backend.run(_verify_temp, temp, hex_digest, size, schema, self._key)
            return
        await self._backend.run(temp.wait_synced)
        if problem is not None:
            raise ValueError(problem)

    async def _publish_item(self, item: Publication) -> bool:
        """Publish ``item`` in a group commit; whether its key was live before."""
        with map_errors(INDEX_ERRORS):
            # Open already: no hop to take it (releasing on the loop leaves closing idle
            # indexes, a checkpoint, to a worker thread's next release).
            index = _index.acquire_now(self.root)
            if index is None:
                index = await self._patiently(_index.acquire, self.root)
        try:
            with map_errors(f"could not publish the {item.kind} value in the store index"):
                return await publish_grouped(self._patiently, index, item)
        finally:
            _index.release(index, close_idle=False)
