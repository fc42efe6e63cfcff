"""The owned root's directories, opened and checked once per process, re-checked cheaply per call.

Opening the root and its three subdirectories without following links, and checking each
one's owner and mode, took a dozen syscalls on every operation (a fifth of a small read).
Here they are opened once (as :func:`prepare_root` leaves them) and their fds kept; each
operation then re-checks them with one ``stat`` per name, without following links: the name
must still be the very directory held (same device and inode: an fd we hold pins its inode,
so its number cannot be reused), a directory of ours, not writable by group or others. A name
that is gone, replaced or a symlink makes the fds stale: they are set aside and the root is
opened again, which refuses a symlink or a shared directory as :func:`open_dir` always has.
A mode or owner changed in place is refused at once. So a store whose directory becomes a
symlink or shared is still refused on the next call, and one removed is made again.

Trees are shared by the threads of a process (``*at`` calls on a shared fd are safe); a tree
in use is never closed, so no thread can use an fd number that was closed and reused.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import stat
import threading
from collections.abc import Iterator

from .._errors import UnsafeStoreError
from .._forks import new_lock_in_child
from ._paths import (
    _DIR_FLAGS,
    _FANOUT,
    _HEX_KEY,
    _NOT_A_FILE,
    KINDS,
    PROCESS,
    Kind,
    check_stat,
    open_dir,
    prepare_root,
    valid_name,
)

__all__ = ["MAX_IDLE_TREES", "Dirs", "Tree", "close_trees", "tree", "tree_now"]

#: Trees of roots nobody uses right now kept open (four fds each).
MAX_IDLE_TREES = 8
_SUBS = ("tmp", *KINDS)
_SHARED = stat.S_IWGRP | stat.S_IWOTH


class Tree:
    """The fds of one root and its ``tmp``, ``exact`` and ``summary`` directories."""

    __slots__ = ("_subs", "euid", "fds", "ids", "root", "stale", "users")

    def __init__(self, root: str) -> None:
        self.root = root
        self.users = 0
        self.stale = False
        try:
            self.fds = _open_all(root)
        except FileNotFoundError:  # the root or a directory was removed: made again
            prepare_root(os.path.dirname(root))
            self.fds = _open_all(root)
        self.ids = {name: _ident(os.fstat(fd)) for name, fd in self.fds.items()}
        self.euid = os.geteuid()
        subs = [(sub, self.ids[sub], os.path.join(root, sub)) for sub in _SUBS]
        # What each operation re-checks, worked out once: a read of one kind skips the other
        # kind's directory (a filter in the loop cost every read 0.3 us).
        self._subs: dict[Kind | None, tuple[tuple[str, tuple[int, int], str], ...]] = {
            None: tuple(subs),
            **{kind: tuple(s for s in subs if s[0] not in KINDS or s[0] == kind) for kind in KINDS},
        }

    @property
    def root_fd(self) -> int:
        return self.fds[""]

    @property
    def tmp(self) -> int:
        return self.fds["tmp"]

    def kind_fd(self, kind: Kind) -> int:
        return self.fds[kind]

    def current(self, kind: Kind | None = None) -> bool:
        """Whether every name still is the directory held; raises if one became shared.

        With ``kind`` (a read), the other kind's directory is not looked at.
        """
        # Run on every operation, on the event loop too: kept to four stats and compares.
        euid, root_fd = self.euid, self.fds[""]
        try:
            st = os.lstat(self.root)
            if (st.st_dev, st.st_ino) != self.ids[""]:
                return False
            if st.st_uid != euid or st.st_mode & _SHARED:
                check_stat(st, self.root)
            for sub, ident, path in self._subs[kind]:
                st = os.stat(sub, dir_fd=root_fd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) != ident:
                    return False
                if st.st_uid != euid or st.st_mode & _SHARED:
                    check_stat(st, path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def fanout(self, kind: Kind, key: str, *, create: bool = False) -> int:
        """A new fd of ``key``'s fan-out directory (the caller closes it), checked."""
        if kind not in KINDS or not _FANOUT.fullmatch(key[:2]):
            raise UnsafeStoreError("not an entry name", kind)
        if create:
            return open_dir(key[:2], create=True, dir_fd=self.fds[kind])
        # open_dir's checks against the euid held: geteuid and two calls less per read.
        try:
            fd = os.open(key[:2], _DIR_FLAGS, dir_fd=self.fds[kind])
        except OSError:
            return open_dir(key[:2], create=False, dir_fd=self.fds[kind])  # its error, mapped
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if st.st_uid != self.euid or st.st_mode & _SHARED:
            os.close(fd)
            return open_dir(key[:2], create=False, dir_fd=self.fds[kind])  # raises, or the same
        return fd

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _open_all(root: str) -> dict[str, int]:
    fds = {"": open_dir(root, create=False)}
    try:
        for sub in _SUBS:
            fds[sub] = open_dir(sub, create=False, dir_fd=fds[""])
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


# One tree per process and root; insertion order is recency.
_trees: collections.OrderedDict[tuple[int, str], Tree] = collections.OrderedDict()
_lock = threading.Lock()
new_lock_in_child(globals(), "_lock")


@contextlib.contextmanager
def tree(root: str) -> Iterator[Tree]:
    """The checked tree of ``root`` for one blocking operation (made again if removed)."""
    held = _acquire(root, wait=True)
    assert held is not None  # noqa: S101 - wait=True never gives up
    try:
        yield held
    finally:
        _release(held)


def tree_now(root: str, kind: Kind) -> Tree | None:
    """For the event loop thread: the checked tree if that needs no wait, mkdir or fsync.

    For a read of ``kind``. None means "take a worker thread"; pair a tree with
    :func:`release_now`.
    """
    # Never opens a tree, so never remakes a removed root: a missing directory is "not
    # current" (Tree.current), which is None here.
    return _acquire(root, wait=False, kind=kind)


def release_now(held: Tree) -> None:
    """Let go of a tree from :func:`tree_now`."""
    _release(held)


def _acquire(root: str, *, wait: bool, kind: Kind | None = None) -> Tree | None:
    key = (PROCESS.pid, root)
    for _ in range(3):
        if not _lock.acquire(blocking=wait):
            return None
        try:
            held = _trees.get(key)
            if held is None:
                if not wait:
                    return None  # opening is a dozen syscalls and may remake: a worker's job
                held = _trees[key] = Tree(root)
            _trees.move_to_end(key)
            held.users += 1
        finally:
            _lock.release()
        try:
            if held.current(kind):
                return held
        except BaseException:
            _release(held)
            raise
        _retire(key, held)
        if not wait:
            return None
    raise UnsafeStoreError("the store's directories keep changing under it", root)


def _retire(key: tuple[int, str], held: Tree) -> None:
    with _lock:
        if _trees.get(key) is held:
            del _trees[key]
        held.stale = True
    _release(held)


def _release(held: Tree) -> None:
    with _lock:
        held.users -= 1
        if held.stale and held.users == 0:
            held.close()
        if len(_trees) <= MAX_IDLE_TREES:
            return
        idle = [key for key, t in _trees.items() if t.users == 0]
        for key in idle[: max(0, len(idle) - MAX_IDLE_TREES)]:
            _trees.pop(key).close()


def close_trees() -> None:
    """Close every idle tree of this process (tests, and hosts that want their fds back)."""
    with _lock:
        for key in [key for key, t in _trees.items() if t.users == 0]:
            _trees.pop(key).close()


class Dirs:
    """Directory fds for one blocking operation: the checked tree, plus fan-outs it opens.

    ``held``: the tree the operation already holds and checked (:func:`tree`), used as is:
    one check per operation, as for a read (a second one after a small put's fsync was a
    tenth of its thread's work). Otherwise one is acquired, checked, and let go on exit.
    """

    def __init__(self, root: str, held: Tree | None = None) -> None:
        self.root = root
        self._held = held

    def __enter__(self) -> Dirs:
        held = self._held or _acquire(self.root, wait=True)
        assert held is not None  # noqa: S101 - wait=True never gives up
        self._tree = held
        self.root_fd = held.root_fd
        self.tmp = self._tree.tmp
        self._fans: dict[tuple[Kind, str], int] = {}
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fans.values():
            os.close(fd)
        if self._held is None:
            _release(self._tree)

    def fanout(self, kind: Kind, key: str) -> int:
        """The fd of ``key``'s fan-out directory (created if missing), kept for this operation."""
        if kind not in KINDS or not _FANOUT.fullmatch(key[:2]):
            raise UnsafeStoreError("the store index names no entry", self.root)
        slot = (kind, key[:2])
        if slot not in self._fans:
            self._fans[slot] = self._tree.fanout(kind, key, create=True)
        return self._fans[slot]

    def publish(self, temp_name: str, kind: Kind, key: str, *, sync: bool = True) -> None:
        """Rename a verified temp file into place and make the rename durable.

        A directory where the entry belongs (which ``rename`` cannot replace) is moved aside
        first, so no planted object makes a value permanently uncompactable. ``sync=False``:
        the caller fsyncs ``fanout(kind, key)`` itself (once for several renames).
        """
        fan_fd = self.fanout(kind, key)
        try:
            os.rename(temp_name, key, src_dir_fd=self.tmp, dst_dir_fd=fan_fd)
        except OSError as exc:
            if exc.errno not in _NOT_A_FILE:
                raise
            self._displace(fan_fd, key)
            os.rename(temp_name, key, src_dir_fd=self.tmp, dst_dir_fd=fan_fd)
        if sync:
            os.fsync(fan_fd)

    def named(self, kind: Kind, key: str) -> bool:
        """Whether anything is at ``key``'s name (a link not followed)."""
        try:
            os.stat(key, dir_fd=self.fanout(kind, key), follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def unlink(self, kind: Kind, key: str) -> None:
        """Remove one entry (whatever sits at its name) if it is there."""
        if not valid_name(kind, key):
            return  # a corrupt row: it names no file, dropping the row is all there is to do
        fan_fd = self.fanout(kind, key)
        try:
            os.unlink(key, dir_fd=fan_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in _NOT_A_FILE:
                raise
            self._displace(fan_fd, key)

    def _displace(self, fan_fd: int, key: str) -> None:
        """Remove a directory at an entry's name: rmdir if empty, else move it into ``tmp/``."""
        try:
            os.rmdir(key, dir_fd=fan_fd)
        except OSError:
            aside = f"{secrets.token_hex(12)}.displaced"
            os.rename(key, aside, src_dir_fd=fan_fd, dst_dir_fd=self.tmp)

    def entry_files(self, kind: Kind) -> Iterator[str]:
        """Names of the entry files of ``kind``, whatever the index says."""
        # Its own fd: listdir rewinds, and a shared fd's offset is shared by every thread.
        kind_fd = open_dir(kind, False, self.root_fd)
        try:
            fans = [name for name in os.listdir(kind_fd) if _FANOUT.fullmatch(name)]
        finally:
            os.close(kind_fd)
        for fan in fans:
            for name in os.listdir(self.fanout(kind, fan)):
                if _HEX_KEY.fullmatch(name):
                    yield name
