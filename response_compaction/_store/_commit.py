"""Commits under the index's write lock: a verified temp file published, a live entry renewed.

Blocking; the store calls these through its file backend's worker threads, or from the
one-hop paths of ``_oneshot``.
"""

from __future__ import annotations

from ._index import Index, Row, Transaction
from ._paths import Dirs, Kind

__all__ = ["publish", "renew"]

#: Expired rows deleted per commit, so one write never pays for a long-idle store's backlog.
EXPIRED_PER_COMMIT = 64


def publish(
    index: Index, temp_name: str, kind: Kind, key: str, row: Row, now: float, max_entries: int
) -> bool:
    """Rename the verified temp file into place, record it and evict, under the write lock.

    Returns whether ``key`` was live before.
    """
    with index.transaction() as tx, Dirs(index.root) as dirs:
        reused = tx.is_live(kind, key, now)
        dirs.publish(temp_name, kind, key)
        tx.upsert(kind, key, row, now)
        _evict(tx, dirs, kind, key, now, max_entries)
    return reused


def renew(index: Index, kind: Kind, key: str, row: Row, now: float, max_entries: int) -> bool:
    """Give a live entry whose bytes were just verified ``row``'s expiry, as a use.

    False (nothing changed) when the row no longer holds that digest or expired meanwhile:
    another process evicted or replaced it after we read it, and the caller writes afresh.
    """
    with index.transaction() as tx:
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
