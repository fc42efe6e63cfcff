"""Removals a caller asks for (``prune``, ``remove``), under the index's write lock.

Blocking; the store calls these through its file backend's worker threads.
"""

from __future__ import annotations

from ._index import Index
from ._paths import KINDS, Kind, sweep_temps
from ._tree import Dirs

__all__ = ["prune_all", "remove_entry"]


def prune_all(index: Index, now: float, max_entries: int | None, temps_since: float) -> int:
    """Evict expired and surplus entries, stale temp files, and the files and rows left over.

    Temp files modified before ``temps_since`` are stale; rows no file backs go only while no
    temp file is modified at or after it; files no row names go.
    Returns how many entries and temp files went (a row and its file counted once).
    """
    with index.transaction() as tx, Dirs(index.root) as dirs:
        tx.saw(now)
        # tmp/ first, before anything is unlinked: a failure there rolls back a transaction
        # that has changed nothing on disk yet. Stale temp files go under the lock: a put
        # whose temp file is swept fails at its rename (no receipt), never hands out one whose
        # row this prune then drops.
        removed, keep_unbacked = sweep_temps(index.root, temps_since)  # a fresh temp left?
        # A row with no file: a small put that died or failed between its COMMIT and its
        # rename (``publish_recorded``), or a file removed by hand; it reads Missing and
        # counts against the bound. One such put may be in flight: its temp file is then in
        # tmp/ until its rename, so tmp/ is looked at before the entries (a rename between
        # the two looks is seen by the second). No row is committed while we hold the lock.
        # By file times, as the temp sweep: judged by the writers' recorded clocks, one
        # skewed clock, or a writer trimmed from the clocks table, made a put in flight look
        # idle (its receipt then read Missing).
        for kind in KINDS:
            recorded = tx.keys(kind)
            files = set(dirs.entry_files(kind))
            # A file without a row was left by a writer that died between rename and
            # commit, or renamed after its row was evicted: nobody will ever read it.
            for name in files - recorded:
                dirs.unlink(kind, name)
            unbacked = set() if keep_unbacked else recorded - files
            for key in unbacked:
                tx.delete(kind, key)
            removed += len(files - recorded) + len(unbacked)
        # Last: rows with no file no longer count against the bound (one such row counted
        # made the least recently used live entry go in its place).
        victims = tx.victims(KINDS, now, max_entries)
        for kind, key in victims:
            tx.delete(kind, key)
            dirs.unlink(kind, key)
        removed += len(victims)
    return removed


def remove_entry(index: Index, kind: Kind, key: str) -> None:
    """Delete one entry, row and file."""
    with index.transaction() as tx, Dirs(index.root) as dirs:
        tx.delete(kind, key)
        dirs.unlink(kind, key)
