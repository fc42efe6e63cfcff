"""The store's root below a workspace, made and checked once per process, and its key.

Every call opens the store; making and checking the root is a dozen syscalls, so it is done
once per process and workspace (in a worker thread) and remembered with the key and a stamp
of the key file: later calls compare one ``lstat`` of that file with the stamp, and read the
key again only if it changed. On a file system that may stall a call (``_mounts``) even
that ``lstat`` goes to a worker thread, never the event loop's.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from .. import _pool
from ._fileio import FileBackend
from ._key import KEY_NAME, load_key, read_key
from ._mounts import may_hang
from ._paths import PROCESS, prepare_root

__all__ = ["Root", "key_stamp", "prepared_root"]

Stamp = tuple[int, ...]


class Root(NamedTuple):
    """A prepared root: path, key, the key file's stamp (None: not taken), and its kind.

    ``may_hang``: whether its file system may stall a call (``_mounts``).
    """

    path: str
    key: bytes
    stamp: Stamp | None
    may_hang: bool


# Roots created and checked by this process, by workspace directory.
_prepared: dict[tuple[int, str], Root] = {}
_key_paths: dict[str, str] = {}  # the key file's path by root: joined once, looked at per call


async def prepared_root(backend: FileBackend, base: str) -> Root:
    """The root below ``base``, made and checked on its first use in this process."""
    known = _prepared.get((PROCESS.pid, base))
    if known is not None and known.stamp is not None:
        args = (known.path, known.key, known.stamp)
        # On the loop: a few syscalls and no hop, unless that file system may stall.
        found = await backend.run(_known_key, *args) if known.may_hang else _known_key(*args)
        if found == (known.key, known.stamp):
            return known
        if found is not None:
            root = known._replace(key=found[0], stamp=found[1])
            _prepared[(PROCESS.pid, base)] = root
            return root
    _pool.POOL.start()  # warm before the first large value needs it
    root = await backend.run(_prepare, base)
    _prepared[(PROCESS.pid, base)] = root
    return root


def key_stamp(root: str) -> Stamp:
    """How the key file looks: device, inode, mode, owner, links, size and times."""
    path = _key_paths.get(root)
    if path is None:
        if len(_key_paths) >= 64:
            _key_paths.clear()
        path = _key_paths[root] = os.path.join(root, KEY_NAME)
    st = os.lstat(path)
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_nlink, st.st_size,
            st.st_mtime_ns, st.st_ctime_ns)  # fmt: skip


def _known_key(root: str, key: bytes, seen: Stamp) -> tuple[bytes, Stamp] | None:
    """The key of a root prepared before, and its key file's stamp; None: prepare it again.

    The key file as it was when last read (same device, inode, size, owner, mode, times) is
    the same key; anything else is read and checked again.
    """
    try:
        now = key_stamp(root)
        if now == seen:
            return key, now
        if now[0] != seen[0]:  # another device (a mount over the root?): classified again
            return None
        fresh = read_key(root)
    except FileNotFoundError:
        return None  # the key or the root was removed: made again
    return None if fresh is None else (fresh, now)


def _prepare(base: str) -> Root:
    """Blocking: the root made and checked, its key, and how its file system behaves."""
    path = prepare_root(base)
    key = load_key(path)
    try:
        stamp: Stamp | None = key_stamp(path)
    except OSError:
        stamp = None  # taken again on the next call
    return Root(path, key, stamp, may_hang(path))
