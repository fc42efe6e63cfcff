"""Removals a caller asks for (``prune``, ``remove``), under the index's write lock.

Blocking; the store calls these through its file backend's worker threads.
"""

from __future__ import annotations

from ._index import Index
from ._paths import KINDS, STALE_TEMP_SECONDS, Kind
from ._tree import Dirs

__all__ = ["prune_all", "remove_entry"]


def prune_all(index: Index, now: float, max_entries: int | None) -> int:
    """Evict expired and surplus entries, files no row names and idle rows no file backs.

    Returns how many entries went (a row and its file counted once).
    """
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
            files = set(dirs.entry_files(kind))
            for name in files - recorded:
                dirs.unlink(kind, name)
            # A row with no file: a put that died or failed between its COMMIT and its rename
            # (``publish_recorded``), or a file removed by hand; it reads Missing and counts
            # against the bound. A put in flight is one fsync from its rename, and its COMMIT
            # recorded its writer's clock: a row whose writer has recorded none for as long
            # as a temp file takes to go stale is none (nor is any of this writer's).
            unbacked = tx.idle(kind, recorded - files, tx.attested(now) - STALE_TEMP_SECONDS)
            for key in unbacked:
                tx.delete(kind, key)
            removed += len(files - recorded) + len(unbacked)
    return removed


def remove_entry(index: Index, kind: Kind, key: str) -> None:
    """Delete one entry, row and file."""
    with index.transaction() as tx, Dirs(index.root) as dirs:
        tx.delete(kind, key)
        dirs.unlink(kind, key)
