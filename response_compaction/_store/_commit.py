"""Commits under the index's write lock: a verified temp file published, a live entry renewed.

Blocking; the store calls these through its file backend's worker threads, or from the
one-hop paths of ``_oneshot``.
"""

from __future__ import annotations

from ._index import Index, Row, Transaction
from ._paths import KINDS, Kind
from ._tree import Dirs

__all__ = ["prune_all", "publish", "remove_entry", "renew"]

#: Expired rows deleted per commit, so one write never pays for a long-idle store's backlog.
EXPIRED_PER_COMMIT = 64


def publish(
    index: Index, temp_name: str, kind: Kind, key: str, row: Row, now: float, max_entries: int
) -> bool:
    """Rename the verified temp file into place, record it and evict, under the write lock.

    Returns whether ``key`` was live before.
    """
    with index.transaction() as tx, Dirs(index.root) as dirs:
        tx.saw(now)
        reused = tx.is_live(kind, key, now)
        dirs.publish(temp_name, kind, key)
        tx.upsert(kind, key, row, now)
        _evict(tx, dirs, kind, key, now, max_entries)
    return reused


def renew(index: Index, kind: Kind, key: str, row: Row, now: float, max_entries: int) -> bool:
    """Give a live entry whose bytes were just verified ``row``'s expiry, as a use.

    False (nothing changed) when the row no longer holds that digest or expired meanwhile:
    another process evicted or replaced it after we read it, and the caller writes afresh.

    Not synced (``durable=False``): the bytes were fsynced, renamed, fsynced in their
    directory and recorded by a durable commit when they were stored, and a WAL commit that
    was visible to our lookup was already synced. A crash can only lose this transaction as a
    whole: the later expiry and the use (the entry keeps the expiry it had before this call,
    still verified on every read: a shorter TTL, never a wrong or torn value), and any
    eviction it made (a row whose file is gone reads Missing, as after a crash between unlink
    and commit before). The next durable commit makes it durable.
    """
    with index.transaction(durable=False) as tx:
        tx.saw(now)
        if not tx.renew(kind, key, row, now):
            return False
        with Dirs(index.root) as dirs:
            _evict(tx, dirs, kind, key, now, max_entries)
    return True


def _evict(tx: Transaction, dirs: Dirs, kind: Kind, key: str, now: float, bound: int) -> None:
    victims = tx.victims((kind,), now, bound, keep=key, expired_limit=EXPIRED_PER_COMMIT)
    for victim_kind, victim_key in victims:
        tx.delete(victim_kind, victim_key)
        dirs.unlink(victim_kind, victim_key)


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
        # transaction; we hold that lock, so a file without a row was left by a writer that
        # died between the two. Nobody will ever read it.
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
