"""The owned root on disk: fd-safe opens, renames and unlinks, and the temp-file sweep.

Every component from the root down is opened with ``O_NOFOLLOW`` through directory fds, so a
symlink planted anywhere below the workspace cannot redirect a read, a rename or an unlink.
All functions here block; the store calls them through its file backend's worker threads.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import Literal

from .._errors import UnsafeStoreError

__all__ = [
    "FILE_FLAGS",
    "KINDS",
    "ROOT_NAME",
    "STALE_TEMP_SECONDS",
    "Dirs",
    "Kind",
    "NotRegularFileError",
    "check_root",
    "open_dir",
    "open_fanout",
    "opener",
    "prepare_root",
    "regular_opener",
    "sweep_temps",
    "unlink_quietly",
]

ROOT_NAME = "response-compaction-v1"
Kind = Literal["exact", "summary"]
KINDS: tuple[Kind, ...] = ("exact", "summary")
#: Temporary files older than this were left by a process that died mid-write.
STALE_TEMP_SECONDS = 3600.0
_FANOUT = re.compile(r"[0-9a-f]{2}")
_HEX_KEY = re.compile(r"[0-9a-f]{64}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


def _check_dir(fd: int, path: str) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise UnsafeStoreError("store directory is owned by another user", path)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeStoreError("store directory is writable by group or others", path)


def open_dir(path: str, create: bool, dir_fd: int | None = None) -> int:
    """Open (creating 0700 if asked) a directory we own, refusing symlinks and shared modes."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700, dir_fd=dir_fd)
    try:
        fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeStoreError("store path is a symlink or not a directory", path) from exc
        raise
    try:
        _check_dir(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


_swept: set[tuple[int, str]] = set()
_swept_lock = threading.Lock()


def prepare_root(base: str) -> str:
    """Create and check the owned root below ``base``; sweep stale temps once per process."""
    os.makedirs(base, mode=0o700, exist_ok=True)
    root = os.path.join(os.path.abspath(base), ROOT_NAME)
    root_fd = open_dir(root, create=True)
    try:
        for sub in ("tmp", *KINDS):
            os.close(open_dir(sub, create=True, dir_fd=root_fd))
    finally:
        os.close(root_fd)
    with _swept_lock:
        first = (os.getpid(), root) not in _swept
        _swept.add((os.getpid(), root))
    if first:
        sweep_temps(root, time.time() - STALE_TEMP_SECONDS)
    return root


def check_root(root: str) -> None:
    """Check the root and its subdirectories as :func:`prepare_root` does, without sweeping.

    Run at the start of every one-hop operation (a few syscalls), so a root checked once per
    process is still refused the moment a directory becomes a symlink or shared. A root
    removed meanwhile is made again.
    """
    try:
        root_fd = open_dir(root, create=False)
    except FileNotFoundError:
        prepare_root(os.path.dirname(root))
        return
    try:
        for sub in ("tmp", *KINDS):
            os.close(open_dir(sub, create=True, dir_fd=root_fd))
    finally:
        os.close(root_fd)


def sweep_temps(root: str, older_than: float) -> int:
    """Remove temporary files left by writers that died; return how many."""
    removed = 0
    tmp_fd = open_dir(os.path.join(root, "tmp"), create=False)
    try:
        for name in os.listdir(tmp_fd):
            try:
                st = os.stat(name, dir_fd=tmp_fd, follow_symlinks=False)
                if st.st_mtime < older_than:
                    os.unlink(name, dir_fd=tmp_fd)
                    removed += 1
            except FileNotFoundError:
                continue
    finally:
        os.close(tmp_fd)
    return removed


class Dirs:
    """Directory fds for one blocking operation; every component opened without following links."""

    def __init__(self, root: str) -> None:
        self.root = root

    def __enter__(self) -> Dirs:
        self.root_fd = open_dir(self.root, create=False)
        self.tmp = open_dir("tmp", create=False, dir_fd=self.root_fd)
        self._fans: dict[tuple[Kind, str], int] = {}
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fans.values():
            os.close(fd)
        os.close(self.tmp)
        os.close(self.root_fd)

    def fanout(self, kind: Kind, key: str) -> int:
        """The fd of ``key``'s fan-out directory (created if missing), kept for this operation."""
        slot = (kind, key[:2])
        if slot not in self._fans:
            kind_fd = open_dir(kind, create=True, dir_fd=self.root_fd)
            try:
                self._fans[slot] = open_dir(key[:2], create=True, dir_fd=kind_fd)
            finally:
                os.close(kind_fd)
        return self._fans[slot]

    def publish(self, temp_name: str, kind: Kind, key: str) -> None:
        """Rename a verified temp file into place and make the rename durable."""
        fan_fd = self.fanout(kind, key)
        os.rename(temp_name, key, src_dir_fd=self.tmp, dst_dir_fd=fan_fd)
        os.fsync(fan_fd)

    def unlink(self, kind: Kind, key: str) -> None:
        """Remove one entry's file if it is there."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(key, dir_fd=self.fanout(kind, key))

    def entry_files(self, kind: Kind) -> Iterator[str]:
        """Names of the entry files of ``kind``, whatever the index says."""
        kind_fd = open_dir(kind, False, self.root_fd)
        try:
            fans = [name for name in os.listdir(kind_fd) if _FANOUT.fullmatch(name)]
        finally:
            os.close(kind_fd)
        for fan in fans:
            for name in os.listdir(self.fanout(kind, fan)):
                if _HEX_KEY.fullmatch(name):
                    yield name


def opener(dir_fd: int | None, mode: int) -> Callable[[str, int], int]:
    """An ``open`` opener relative to ``dir_fd`` that never follows a final symlink."""

    def open_(path: str, flags: int) -> int:
        return os.open(path, flags | FILE_FLAGS, mode, dir_fd=dir_fd)

    return open_


class NotRegularFileError(OSError):
    """Something other than a regular file sits where an entry should be."""


def regular_opener(dir_fd: int | None) -> Callable[[str, int], int]:
    """Like :func:`opener`, and refuses anything but a regular file."""

    # O_NONBLOCK so a FIFO planted in the store cannot hang the open; it changes nothing for
    # the regular files we then insist on.
    def open_(path: str, flags: int) -> int:
        fd = os.open(path, flags | FILE_FLAGS | os.O_NONBLOCK, dir_fd=dir_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotRegularFileError(errno.EINVAL, "not a regular file", path)
        return fd

    return open_


def open_fanout(root: str, kind: Kind, key: str) -> int:
    """The fan-out directory of ``key``, every component checked and opened without links."""
    root_fd = open_dir(root, create=False)
    try:
        kind_fd = open_dir(kind, create=False, dir_fd=root_fd)
        try:
            return open_dir(key[:2], create=False, dir_fd=kind_fd)
        finally:
            os.close(kind_fd)
    finally:
        os.close(root_fd)


def unlink_quietly(name: str, dir_fd: int) -> None:
    """Unlink ``name`` below ``dir_fd`` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
