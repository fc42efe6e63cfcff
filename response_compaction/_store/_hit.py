"""A cache hit of a small value, renewed on the event loop thread: no worker-thread hop.

Compacting a value already stored renews the live entry instead of writing it again. For a
small value that renewal is a lookup, a read of a few KB, a comparison, a decode and a
commit that is not synced, about 100 us of work; the hop to a worker thread and back cost
two to three times that (on a 2-core VM the loop waited 60% of a hit's time for it). So here
it runs on the loop, with every check of :func:`_oneshot.put_small`'s renewal, provided
nothing makes the loop wait: the index and tree already open, the index's locks free this
instant, the file's bytes in the page cache where the file system can tell
(``_reading.read_unwaited``), a commit that neither syncs nor checkpoints (``_wal``), no
name left to fsync and no row to evict (``_commit.renew_on_loop``). Otherwise the worker
thread does it all. A value with no file where its entry would be is a miss known from one
``stat``, without the index: the worker writes it.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from .._canonical import decode_exact
from . import _indexes
from ._commit import renew_on_loop
from ._index import CorruptRowError, IndexBusy, Row
from ._oneshot import Put, renewable, stored_as
from ._paths import Kind, valid_name
from ._reads import INLINE_READ_BYTES, NOT_INLINE
from ._tree import Tree, release_now, tree_now

__all__ = ["renew_inline"]


def renew_inline(
    root: str, kind: Kind, key: str, data: bytes, row: Row, schema: Any, now: float, bound: int
) -> Any:
    """Renew ``key`` if live with ``data`` intact on disk: a :class:`Put`, None or NOT_INLINE.

    None: nothing to renew (absent, expired, other bytes, or changed meanwhile), so the
    worker writes ``data`` afresh without looking again. ``NOT_INLINE``: the worker does the
    whole put. Raises ``ValueError`` if the stored bytes (``data``'s) do not validate.
    """
    if len(data) > INLINE_READ_BYTES or not valid_name(kind, key):
        return NOT_INLINE  # an invalid name: the worker's checked path refuses it
    dirs = tree_now(root, kind)
    if dirs is None:
        return NOT_INLINE
    try:
        if not _may_be_on_disk(dirs, kind, key):
            return None  # a renewal needs the bytes on disk: the worker writes them
        return _renew_if_live(dirs, kind, key, data, row, schema, now, bound)
    finally:
        release_now(dirs)


def _renew_if_live(
    dirs: Tree, kind: Kind, key: str, data: bytes, row: Row, schema: Any, now: float, bound: int
) -> Any:
    """:func:`renew_inline` past its checks of the tree: the index's part and the bytes'."""
    index = _indexes.acquire_now(dirs.root)
    if index is None:
        return NOT_INLINE
    try:
        try:
            existing = index.lookup(kind, key, now, wait=False, writer=True)
        except CorruptRowError:
            return None  # the fresh write's upsert replaces the row
        except (IndexBusy, OSError, sqlite3.Error):
            return NOT_INLINE  # the worker retries, or reports it
        if not renewable(existing, row, now):
            return None
        try:
            on_disk = stored_as(dirs, kind, key, (data,), row.size, on_loop=True)
        except BlockingIOError:  # not all of it in memory: the worker reads it
            return NOT_INLINE
        if on_disk is None:
            return None
        value = decode_exact(on_disk, schema)  # ValueError: the value does not validate
        try:
            renewed = renew_on_loop(index, kind, key, row, now, bound)
        except (OSError, sqlite3.Error):  # StoreError (a replaced index) is an OSError
            return NOT_INLINE  # rolled back: the worker retries, or reports it
    finally:
        _indexes.release(index, close_idle=False)
    if renewed is None:
        return NOT_INLINE
    return Put(reused=True, value=value) if renewed else None


def _may_be_on_disk(dirs: Tree, kind: Kind, key: str) -> bool:
    """False only if no file is where ``key``'s entry would be: then nothing can be renewed.

    One unchecked ``stat`` rather than the index lookup: most compactions store a value not
    seen before, and this check of a new 2 KB value took 22 us on the loop between two puts
    (tmpfs), 9 us with a ``stat`` of the whole path. Relative to the kind's directory of the
    tree just checked current, so only the fan-out directory and the entry's name are looked
    up (the name not followed if a link), and only once the tree is open. (That check itself
    ``lstat``s the root by its whole path, on the loop: a hung network mount still holds the
    loop there, as it did every inline read and renewal before.) Only a hint:
    False sends the put to the worker, which writes afresh through every check (and records
    the key as reused if a row was live after all); anything else takes the checked path.
    """
    try:
        os.stat(f"{key[:2]}/{key}", dir_fd=dirs.kind_fd(kind), follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True
