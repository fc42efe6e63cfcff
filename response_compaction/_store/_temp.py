"""A medium value's temporary file: its name, its write, its fsync in a syncer thread."""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
from collections.abc import Sequence

from .._digest import new_hasher
from ._aside import Aside, begun
from ._oneshot import write_fully
from ._paths import FILE_FLAGS, open_dir, unlink_quietly

__all__ = ["Temp", "create_temp", "digest_pieces", "temp_name", "write_temp"]


_names = itertools.count()
_prefix = [secrets.token_hex(6)]
# A forked child must not make its parent's names.
os.register_at_fork(after_in_child=lambda: _prefix.__setitem__(0, secrets.token_hex(6)))


def temp_name() -> str:
    """A temp name unique to this process and call.

    No ``os.urandom`` per value: 32 at once spent 0.6 ms each getting the GIL back after it.
    """
    return f"{_prefix[0]}{next(_names):012x}.tmp"


class Temp:
    """A temporary file being written: its directory's fd, its own fd (until closed), name.

    Its fsync runs in a syncer thread, asked for as soon as it is written. Before a decode in
    this thread (:meth:`start_sync`) the caller waits until the syncer has begun: a thread
    started later waits for the GIL while msgspec decodes, so the fsync began after it. From
    the loop (:meth:`hash_and_sync`) it does not wait: the syncer hashes, then fsyncs, while
    a pool worker decodes in its own process.
    """

    __slots__ = ("dir_fd", "fd", "name", "synced", "written")

    def __init__(self, dir_fd: int, fd: int, name: str) -> None:
        self.dir_fd = dir_fd
        self.fd = fd
        self.name = name
        self.synced: Aside[str | None] | None = None
        #: (key, pieces) when the syncer is to hash what was written before its fsync.
        self.written: tuple[bytes, Sequence[bytes | memoryview]] | None = None

    def start_sync(self) -> None:
        """Blocking: have a syncer thread fsync and close the file; return once it began."""
        self.synced = begun("sync", self._sync_close)  # run here if no thread can be had

    def hash_and_sync(self, key: bytes, pieces: Sequence[bytes | memoryview]) -> None:
        """On the loop, returning at once: a syncer thread hashes ``pieces``, then fsyncs."""
        self.written = (key, pieces)
        self.synced = Aside(self._sync_close, pool="sync")

    def _sync_close(self) -> str | None:
        fd, self.fd = self.fd, -1
        try:
            written, self.written = self.written, None
            hex_digest = None if written is None else digest_pieces(*written)
            os.fsync(fd)
        finally:
            os.close(fd)  # a failing close after fsync is still a failure to retain
        return hex_digest

    def synced_already(self) -> bool:
        """Whether the syncer has fsynced and closed the file (or failed to) by now."""
        return self.synced is not None and self.synced.done()

    def wait_synced(self) -> str | None:
        """Blocking: wait for the fsync and close; raise ``OSError`` if either failed.

        The digest of what was written if :meth:`hash_and_sync` asked for it, else None.
        """
        if self.synced is None:
            return self._sync_close()
        return self.synced.wait()

    def discard(self, *, published: bool) -> None:
        """Blocking: close what is still open, and unlink the file unless it was published."""
        try:
            if self.synced is not None:
                with contextlib.suppress(OSError):
                    self.synced.wait()  # the syncer owns the file's fd until it is done
            elif self.fd >= 0:
                fd, self.fd = self.fd, -1
                with contextlib.suppress(OSError):
                    os.close(fd)
            if not published:
                unlink_quietly(self.name, self.dir_fd)
        finally:
            os.close(self.dir_fd)


def write_temp(tmp_path: str, name: str, pieces: Sequence[bytes | memoryview]) -> Temp:
    """Blocking: create ``name`` in ``tmp_path`` and write ``pieces``.

    The caller then starts its fsync (:meth:`Temp.start_sync`) or discards it unsynced.
    """
    temp = create_temp(tmp_path, name)
    try:
        for piece in pieces:
            write_fully(temp.fd, piece)
    except BaseException:
        temp.discard(published=False)
        raise
    return temp


def create_temp(tmp_path: str, name: str) -> Temp:
    """Blocking: create ``name`` in ``tmp_path`` (never an existing file), open for writing."""
    dir_fd = open_dir(tmp_path, False)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=dir_fd)
    except BaseException:
        os.close(dir_fd)
        raise
    return Temp(dir_fd, fd, name)


def digest_pieces(key: bytes, pieces: Sequence[bytes | memoryview]) -> str:
    """The keyed digest of ``pieces`` one after the other (lets go of the GIL when large)."""
    hasher = new_hasher(key)
    for piece in pieces:
        hasher.update(piece)
    return hasher.hexdigest()
