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
from collections.abc import Callable
from typing import Literal

from .._errors import UnsafeStoreError
from .._forks import new_lock_in_child

__all__ = [
    "FILE_FLAGS",
    "KINDS",
    "PROCESS",
    "ROOT_NAME",
    "STALE_TEMP_SECONDS",
    "Kind",
    "NotRegularFileError",
    "check_ancestors",
    "check_stat",
    "fsync_parent",
    "open_dir",
    "open_fanout",
    "open_regular",
    "opener",
    "prepare_root",
    "regular_opener",
    "sweep_temps",
    "unlink_quietly",
    "valid_name",
]

ROOT_NAME = "response-compaction-v1"
Kind = Literal["exact", "summary"]
KINDS: tuple[Kind, ...] = ("exact", "summary")
#: Temporary files older than this were left by a process that died mid-write.
STALE_TEMP_SECONDS = 3600.0


class _Process:
    """The id of this process, kept current by a fork hook.

    ``os.getpid()`` is a system call (0.1 us here, in a VM), and a small read asked for it
    five times (the store, index and tree registries, the writer id) of about 45 us.
    """

    __slots__ = ("pid",)

    def __init__(self) -> None:
        self.pid = os.getpid()

    def forked(self) -> None:
        self.pid = os.getpid()


PROCESS = _Process()
os.register_at_fork(after_in_child=PROCESS.forked)

# What unlink/rename report when a directory sits at the target name.
_NOT_A_FILE = frozenset({errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.EPERM})
_FANOUT = re.compile(r"[0-9a-f]{2}")
_HEX_KEY = re.compile(r"[0-9a-f]{64}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC
_REGULAR_FLAGS = FILE_FLAGS | os.O_NONBLOCK


def valid_name(kind: str, key: str) -> bool:
    """Whether ``(kind, key)`` (e.g. read back from the index) names an entry.

    Every path below the root is built from these two; a row rewritten to hold ``..`` or a
    slash must never steer an unlink or a read outside the store.
    """
    return kind in KINDS and _HEX_KEY.fullmatch(key) is not None


def _check_dir(fd: int, path: str) -> None:
    check_stat(os.fstat(fd), path)


def check_stat(st: os.stat_result, path: str) -> None:
    """Raise :class:`UnsafeStoreError` unless ``st`` is ours and not writable by others."""
    if st.st_uid != os.geteuid():
        raise UnsafeStoreError("store directory is owned by another user", path)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeStoreError("store directory is writable by group or others", path)


def fsync_parent(path: str, dir_fd: int | None = None) -> None:
    """Make a new name in ``path``'s parent durable (after mkdir, rename, link)."""
    if dir_fd is not None and os.sep not in path:
        os.fsync(dir_fd)
        return
    # A workspace ancestor may be a symlink of ours (check_ancestors vetted it): follow it.
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    parent = os.open(os.path.dirname(os.path.abspath(path)), flags, dir_fd=dir_fd)
    try:
        os.fsync(parent)
    finally:
        os.close(parent)


def open_dir(path: str, create: bool, dir_fd: int | None = None) -> int:
    """Open (creating 0700 if asked) a directory we own, refusing symlinks and shared modes.

    A directory it creates is made durable in its parent at once: a fan-out directory lost in
    a crash would take the fsynced entries below it along.
    """
    try:
        # Opened first, made only if absent: every put opens its fan-out directory, which
        # nearly always exists, and a mkdir failing with EEXIST was a system call per put.
        try:
            fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.mkdir(path, 0o700, dir_fd=dir_fd)
            except FileExistsError:
                pass
            else:
                fsync_parent(path, dir_fd)
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


def make_dirs(path: str) -> None:
    """``os.makedirs`` with every directory it creates 0700 and durable in its parent.

    (``os.makedirs`` gives intermediate directories 0777 less the umask: 0777 under umask 0.)
    """
    path = os.path.abspath(path)
    missing: list[str] = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue
        fsync_parent(directory)


_swept: set[tuple[int, str]] = set()
_swept_lock = threading.Lock()
new_lock_in_child(globals(), "_swept_lock")


def check_ancestors(base: str) -> None:
    """Refuse a workspace another user could redirect (raise :class:`UnsafeStoreError`).

    The rule (like OpenSSH's StrictModes): every existing directory on the way to ``base``,
    both as written and after resolving links, must be owned by us or root and not writable
    by group or others unless it has the sticky bit (``/tmp``); every symlink on the way must
    be owned by us or root. Anyone else could rename or replace a component and so move the
    store, or plant one where it is about to be created.
    """
    trusted = {0, os.geteuid()}
    for path in (os.path.abspath(base), os.path.realpath(base)):
        prefix = os.sep
        for part in path.split(os.sep):
            prefix = os.path.join(prefix, part)
            try:
                st = os.lstat(prefix)
            except FileNotFoundError:
                break  # the rest is created by us, 0700
            if st.st_uid not in trusted:
                raise UnsafeStoreError("a workspace ancestor is owned by another user", prefix)
            shared = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            if stat.S_ISDIR(st.st_mode) and shared and not st.st_mode & stat.S_ISVTX:
                raise UnsafeStoreError(
                    "a workspace ancestor is writable by group or others without the sticky bit",
                    prefix,
                )


def prepare_root(base: str) -> str:
    """Create and check the owned root below ``base``; sweep stale temps once per process."""
    check_ancestors(base)
    make_dirs(base)
    root = os.path.join(os.path.abspath(base), ROOT_NAME)
    root_fd = open_dir(root, create=True)
    try:
        for sub in ("tmp", *KINDS):
            os.close(open_dir(sub, create=True, dir_fd=root_fd))
        for kind in KINDS:
            _make_fanouts(root_fd, kind)
    finally:
        os.close(root_fd)
    with _swept_lock:
        first = (os.getpid(), root) not in _swept
        _swept.add((os.getpid(), root))
    if first:
        sweep_temps(root, time.time() - STALE_TEMP_SECONDS)
    return root


def _make_fanouts(root_fd: int, kind: Kind) -> None:
    """All 256 fan-out directories of ``kind``, made once with the store (one fsync).

    Otherwise each of the first values to land in a fan-out pays for its mkdir and the fsync
    of the kind directory, an fsync more than the value's own.
    """
    kind_fd = open_dir(kind, create=False, dir_fd=root_fd)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.stat("ff", dir_fd=kind_fd, follow_symlinks=False)
            return  # made by an earlier process (a planted "ff" is checked when opened)
        made = False
        for n in range(256):
            try:
                os.mkdir(f"{n:02x}", 0o700, dir_fd=kind_fd)
            except FileExistsError:
                continue
            made = True
        if made:
            os.fsync(kind_fd)
    finally:
        os.close(kind_fd)


def sweep_temps(root: str, older_than: float) -> tuple[int, bool]:
    """Remove temporary files left by writers that died: (how many, whether a fresh one is left).

    Fresh: modified at or after ``older_than``; a put may be writing it, or be between its
    row's COMMIT and its rename (``_commit.publish_recorded``).

    Only regular files and symlinks are removed. Anything else (a directory, a socket) was not
    made by a writer; it is left alone and never stops the sweep or the process.
    """
    removed, fresh = 0, False
    tmp_fd = open_dir(os.path.join(root, "tmp"), create=False)
    try:
        for name in os.listdir(tmp_fd):
            try:
                st = os.stat(name, dir_fd=tmp_fd, follow_symlinks=False)
                if st.st_mtime >= older_than:
                    fresh = True
                    continue
                if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                    os.unlink(name, dir_fd=tmp_fd)
                    removed += 1
                elif stat.S_ISDIR(st.st_mode):
                    with contextlib.suppress(OSError):  # only an empty one
                        os.rmdir(name, dir_fd=tmp_fd)
                        removed += 1
            except (FileNotFoundError, IsADirectoryError, PermissionError):
                continue
    finally:
        os.close(tmp_fd)
    return removed, fresh


def opener(dir_fd: int | None, mode: int) -> Callable[[str, int], int]:
    """An ``open`` opener relative to ``dir_fd`` that never follows a final symlink."""

    def open_(path: str, flags: int) -> int:
        return os.open(path, flags | FILE_FLAGS, mode, dir_fd=dir_fd)

    return open_


class NotRegularFileError(OSError):
    """Something other than a regular file of its own sits where an entry should be."""


def regular_opener(dir_fd: int | None) -> Callable[[str, int], int]:
    """Like :func:`opener`, and refuses anything but a regular file with a single link.

    A second link means the inode is shared with a file outside the store's control (or
    another entry): reading it would report facts about a foreign file, so it is not read.
    """

    def open_(path: str, flags: int) -> int:
        return open_regular(path, dir_fd, flags)[0]

    return open_


def open_regular(
    path: str, dir_fd: int | None, flags: int = os.O_RDONLY
) -> tuple[int, os.stat_result]:
    """``path`` opened without following a link, if it is a regular file with one link.

    Returns the fd and its ``fstat``: a reader that knows the size needs no read past the end
    to find it (a system call less per small read).
    """
    # O_NONBLOCK so a FIFO planted in the store cannot hang the open; it changes nothing for
    # the regular files we then insist on.
    try:
        fd = os.open(path, flags | _REGULAR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP, errno.ENODEV):  # a socket, a device
            raise NotRegularFileError(errno.EINVAL, "is not a regular file", path) from exc
        raise
    st = os.fstat(fd)
    if st.st_nlink == 0 and stat.S_ISREG(st.st_mode):
        # Removed since the open (another process evicted it): gone, as if the open had
        # come a moment later, never "other hard links" (a valid entry read Broken).
        os.close(fd)
        raise FileNotFoundError(errno.ENOENT, "was removed while it was opened", path)
    if st.st_nlink != 1 or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        regular = stat.S_ISREG(st.st_mode)
        problem = "has other hard links" if regular else "is not a regular file"
        raise NotRegularFileError(errno.EINVAL, problem, path)
    return fd, st


def open_entry(root: str, kind: Kind, key: str) -> int:
    """The entry file of ``key`` opened for reading, no link followed on the way (blocking)."""
    fan_fd = open_fanout(root, kind, key)
    try:
        return regular_opener(fan_fd)(key, os.O_RDONLY)
    finally:
        os.close(fan_fd)


def open_fanout(root: str, kind: Kind, key: str) -> int:
    """The fan-out directory of ``key``, every component checked and opened without links."""
    if not valid_name(kind, key):
        raise UnsafeStoreError("not an entry name", root)
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
