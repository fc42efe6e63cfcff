"""Removals a caller asks for (``prune``, ``remove``), under the index's write lock.

Blocking; the store calls these through its file backend's worker threads.
"""

from __future__ import annotations

from ._index import Index
from ._paths import KINDS, Kind
from ._tree import Dirs

__all__ = ["prune_all", "remove_entry"]


def prune_all(index: Index, now: float, max_entries: int | None) -> int:
    """Evict expired and surplus entries, and files no row names; how many files went."""
    with index.transaction() as tx, Dirs(index.root) as dirs:
        tx.saw(now)
        victims = tx.victims(KINDS, now, max_entries)
        for kind, key in victims:
            tx.delete(kind, key)
            dirs.unlink(kind, key)
        removed = len(victims)
        # A writer renames its file into place and records the row inside one write
        # transaction, or (``publish_recorded``) commits the row before it renames; we hold
        # the lock, so a file without a row was left by a writer that died between the two,
        # or renamed after its row was evicted. Nobody will ever read it.
        for kind in KINDS:
            recorded = tx.keys(kind)
            for name in list(dirs.entry_files(kind)):
                if name not in recorded:
                    dirs.unlink(kind, name)
                    removed += 1
    return removed


def remove_entry(index: Index, kind: Kind, key: str) -> None:
    """Delete one entry, row and file."""
    with index.transaction() as tx, Dirs(index.root) as dirs:
        tx.delete(kind, key)
        dirs.unlink(kind, key)
