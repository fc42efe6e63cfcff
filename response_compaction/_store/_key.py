"""The store's secret key: created once, atomically, 0600, in the owned root.

Entries are named and checked by a keyed digest (``.._digest``), so a receipt or reference
tells nobody without the key what the value is. The key is 32 random bytes in ``key`` beside
the index. The first process to need it writes a temp file in ``tmp/`` (0600, fsynced) and
links it into place; ``link`` fails when another process got there first, and then that
process's key is read instead, so every process agrees on one key. A key that is a symlink,
not a regular file, owned by another user or open to group or others is refused like an
unsafe root; one of the wrong length is damaged. Losing the key makes every entry
unverifiable: they read ``Broken`` and ``prune --broken`` removes them.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat

from .._digest import KEY_BYTES
from .._errors import StoreError, UnsafeStoreError
from ._paths import FILE_FLAGS, open_dir, unlink_quietly
from ._reading import read_limited

__all__ = ["KEY_NAME", "load_key", "read_key"]

KEY_NAME = "key"


def load_key(root: str) -> bytes:
    """Blocking: the key of the store at ``root``, created on first use."""
    root_fd = open_dir(root, create=False)
    try:
        key = _read_key(root_fd, root)
        if key is None:
            _create_key(root_fd)
            key = _read_key(root_fd, root)
        if key is None:  # created and then removed at once by someone else
            raise StoreError(errno.ENOENT, "the store key vanished while it was created")
        return key
    finally:
        os.close(root_fd)


def read_key(root: str) -> bytes | None:
    """The existing key, checked as :func:`load_key` does, or None: a few syscalls, no write.

    Run on the event loop thread by every ``open_store`` after the first, so a key removed,
    replaced or opened up since is noticed at once without a hop to a worker thread.
    """
    root_fd = open_dir(root, create=False)
    try:
        return _read_key(root_fd, root)
    finally:
        os.close(root_fd)


def _read_key(root_fd: int, root: str) -> bytes | None:
    path = os.path.join(root, KEY_NAME)
    try:
        fd = os.open(KEY_NAME, os.O_RDONLY | os.O_NONBLOCK | FILE_FLAGS, dir_fd=root_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeStoreError("store key is a symlink", path) from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeStoreError("store key is not a regular file", path)
        if st.st_uid != os.geteuid():
            raise UnsafeStoreError("store key is owned by another user", path)
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UnsafeStoreError("store key is open to group or others", path)
        data = read_limited(fd, KEY_BYTES, st.st_size)  # reads on after a short read
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        raise StoreError(errno.EINVAL, f"the store key is damaged (not {KEY_BYTES} bytes)")
    return data


def _create_key(root_fd: int) -> None:
    tmp_fd = open_dir("tmp", create=False, dir_fd=root_fd)
    name = f"{secrets.token_hex(12)}.key.tmp"
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=tmp_fd)
        try:
            view = memoryview(secrets.token_bytes(KEY_BYTES))
            while view:
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(errno.EIO, "write made no progress")
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(name, KEY_NAME, src_dir_fd=tmp_fd, dst_dir_fd=root_fd, follow_symlinks=False)
        except FileExistsError:
            return  # another process's key is in place: everyone uses that one
        os.fsync(root_fd)
    finally:
        unlink_quietly(name, tmp_fd)
        os.close(tmp_fd)
