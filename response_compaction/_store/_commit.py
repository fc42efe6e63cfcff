"""Commits under the index's write lock: a verified temp file published, a live entry renewed.

Blocking; the store calls these through its file backend's worker threads, or from the
one-hop paths of ``_oneshot``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

from ._aside import Aside, fsync
from ._clocks import writer_id
from ._hop import HOP_THREADS
from ._index import Index, IndexBusy, Row, Transaction
from ._paths import Kind
from ._tree import Dirs, Tree

__all__ = [
    "Publication",
    "publish",
    "publish_all",
    "publish_recorded",
    "renew",
    "renew_on_loop",
    "unlink_unrecorded",
]

#: Expired rows deleted per commit, so one write never pays for a long-idle store's backlog.
EXPIRED_PER_COMMIT = 64
#: Rows short of its own bound past which a small put does not look for its row after the
#: rename (``_unlink_if_evicted``): a heuristic, at the default bound (256) it always looks.
EVICTION_HEADROOM = 1024

# This process's publishes and renewals between the moment their row was visible and the end
# of their directory's fsync (see renew); True once one of them failed after its row may have
# become visible (a directory fsync, or a small put's COMMIT, file fsync or rename): from then
# on none of this process's names is known to be on disk by this count.
_naming = [0]
_naming_failed = [False]
_naming_lock = threading.Lock()


def _forget_naming_in_child() -> None:
    global _naming_lock
    _naming_lock = threading.Lock()  # it may have been held by a thread that does not exist here
    _naming[0] = 0  # a child has a writer id of its own: none of its rows is "ours" yet
    _naming_failed[0] = False  # so none of the parent's failures is either


os.register_at_fork(after_in_child=_forget_naming_in_child)


@contextlib.contextmanager
def _naming_entries() -> Iterator[None]:
    with _naming_lock:
        _naming[0] += 1
    try:
        yield
    finally:
        with _naming_lock:
            _naming[0] -= 1


def _names_on_disk(previous_writer: object) -> bool:
    """Whether the name a row vouches for is on disk already (called inside ``_naming``).

    True when this process's writer stored or renewed the row last and none of its other
    publishes or renewals is between a visible row and its directory's fsync: each of them
    ended with that fsync, and none failed after its row may have become visible.
    """
    with _naming_lock:
        return previous_writer == writer_id() and _naming[0] == 1 and not _naming_failed[0]


def _synced(wait: Callable[[], object]) -> None:
    """``wait()`` for a directory fsync; a failure is remembered (see ``_naming``)."""
    try:
        wait()
    except BaseException:
        _naming_failed[0] = True
        raise


def publish(
    index: Index,
    temp_name: str,
    kind: Kind,
    key: str,
    row: Row,
    now: float,
    max_entries: int,
    held: Tree | None = None,
) -> bool:
    """Rename the verified temp file into place, record it and evict, under the write lock.

    The fan-out directory is fsynced in a helper beside the COMMIT (the index's own fsync);
    both have returned when this does, and a failure of either is raised. A row made durable
    before its directory entry is harmless: nobody is handed a receipt until both are (a
    renewal from another writer syncs the directory itself), and a row whose file is absent
    reads Missing (and is written afresh by the next put of its value). Evicted rows are
    deleted before the rename and their files unlinked after it, so a failed rename rolls
    every row back. Returns whether ``key`` was live before. ``held``: see :class:`Dirs`.
    """
    dir_sync: Aside[None] | None = None
    with Dirs(index.root, held) as dirs, _naming_entries():
        try:
            fan_fd = dirs.fanout(kind, key)  # made now if missing
            with index.transaction() as tx:
                tx.saw(now)
                reused = tx.is_live(kind, key, now)
                tx.upsert(kind, key, row, now)
                victims = _victims(tx, kind, key, now, max_entries)
                dirs.publish(temp_name, kind, key, sync=False)
                dir_sync = Aside(fsync, fan_fd)
                for victim_kind, victim_key in victims:
                    dirs.unlink(victim_kind, victim_key)
        finally:
            if dir_sync is not None:
                _synced(dir_sync.wait)  # before the fan-out fd it syncs is closed
    return reused


def publish_recorded(index: Index, fd: int, item: Publication, held: Tree) -> tuple[bool, bool]:
    """:func:`publish` of a content-addressed entry, its row committed beside the file's fsync.

    The temp file ``fd`` (``item``'s, its bytes checked) is fsynced in a helper while this
    thread commits the row and evicts for it; then the file is renamed into place and its
    directory fsynced, outside the write lock. The two disk waits before the rename (the file's
    fsync and the COMMIT's) overlap instead of following each other, and the lock is never
    held for the file's sake. Only for a key that is the keyed digest of the bytes, so a file
    any other writer renames to that name meanwhile holds the same bytes. A row durable before
    its name is harmless (see :func:`publish`): it reads Missing until the rename, and for
    good if the fsync or the rename fails (no receipt is handed then; the next put of the
    value writes it again, as a key that was live). A row evicted between the COMMIT and the
    rename would leave a file no row names: the put unlinks it (:func:`_unlink_if_evicted`).
    Returns whether the key was live, and whether such a file is still to be unlinked (the
    index was busy: the caller retries :func:`unlink_unrecorded` between tries).
    """
    temp_name, kind, key, row, now, max_entries = item
    with Dirs(index.root, held) as dirs:
        synced = Aside(fsync, fd, pool="file-sync", limit=HOP_THREADS)  # one per put thread
        try:
            fan_fd = dirs.fanout(kind, key)  # made now if missing; a planted link refused first
            # The row is visible from its COMMIT until the directory's fsync (``_naming``).
            with _naming_entries():
                reused, room = _record(index, dirs, kind, key, row, now, max_entries)
                _name_after_record(synced, dirs, temp_name, kind, key, fan_fd)
            # Others' puts could evict this row before its rename:
            left = room < EVICTION_HEADROOM and not _unlink_if_evicted(index, dirs, kind, key)
        finally:
            synced.join()  # before the caller closes the fd it syncs
    return reused, left


def _name_after_record(
    synced: Aside[None], dirs: Dirs, temp_name: str, kind: Kind, key: str, fan_fd: int
) -> None:
    """Once the file's fsync has returned, rename it into place and fsync its directory.

    A failure here leaves a committed row of this process's writer whose name may not be on
    disk (another writer's file renamed meanwhile, its directory not yet synced): from then
    on no name of this process is taken to be on disk (``_names_on_disk``), as after a
    failed directory fsync.
    """
    try:
        synced.wait()  # its failure fails the put: the file is synced before its rename
        dirs.publish(temp_name, kind, key, sync=False)
        fsync(fan_fd)
    except BaseException:
        _naming_failed[0] = True
        raise


def _unlink_if_evicted(index: Index, dirs: Dirs, kind: Kind, key: str) -> bool:
    """Unlink the file just renamed into place if its row was evicted before the rename.

    Another writer that evicted the row between its COMMIT and the rename found no file to
    unlink: this one would be left with no row naming it until a prune, a file outside every
    bound (4 processes storing 180 values at 8 entries left one). Looked at only when the
    kind was within ``EVICTION_HEADROOM`` rows of this put's bound at the COMMIT: with more
    room, evicting the row first takes more inserts than that during the rename's wait, a
    writer with a smaller bound, a prune, or clocks past a TTL of at least a second, and
    the file is then left for a prune as before. The row is read first (through the
    writer's connection when it is free), the lock taken only if it is gone
    (:func:`unlink_unrecorded`). False when the index was busy (to be tried again); a failing
    one leaves the file for a prune: the value is stored either way (and reads Missing).
    """
    try:
        if not index.has_row(kind, key):
            unlink_unrecorded(index, dirs, kind, key)
    except IndexBusy:
        return False
    except (OSError, sqlite3.Error):
        pass
    return True


def unlink_unrecorded(index: Index, dirs: Dirs, kind: Kind, key: str) -> None:
    """Unlink ``key``'s file if no row names it, under the write lock (:class:`IndexBusy`).

    Under it, a put of the same value has either committed its row (the file stays: the same
    bytes) or renames its own file after this.
    """
    with index.transaction(durable=False) as tx:  # nothing written: nothing to sync
        if not tx.has_row(kind, key):
            dirs.unlink(kind, key)


def _record(
    index: Index, dirs: Dirs, kind: Kind, key: str, row: Row, now: float, max_entries: int
) -> tuple[bool, int]:
    """Commit ``key``'s row and evict for it (files unlinked under the lock).

    Returns whether the key was live, and how many rows short of ``max_entries`` its kind
    was (0 if over, or not known). A failure once the statements have run (at or around the
    COMMIT, whose fsync may fail after the frames reached the log) is remembered as a failed
    naming (see :func:`_name_after_record`); one before them rolled everything back.
    """
    stated = False
    try:
        with index.transaction() as tx:
            tx.saw(now)
            reused = tx.is_live(kind, key, now)
            tx.upsert(kind, key, row, now)
            _evict(tx, dirs, kind, key, now, max_entries)  # the caller's fds: one Dirs a put
            room = max(0, max_entries - tx.counted.get(kind, max_entries))
            stated = True
    except BaseException:
        if stated:
            _naming_failed[0] = True
        raise
    return reused, room


class Publication(NamedTuple):
    """One verified temp file to publish: :func:`publish`'s arguments after the index."""

    temp_name: str
    kind: Kind
    key: str
    row: Row
    now: float
    max_entries: int


def publish_all(index: Index, items: list[Publication]) -> list[bool | OSError]:
    """Several :func:`publish` calls in one transaction (group commit), in order.

    Each item is renamed, recorded and evicts exactly as it would alone; then every fan-out
    directory that got a rename is fsynced once and the transaction commits once: one
    journal commit and one WAL fsync for the lot, instead of two fsyncs per item. An item
    whose rename fails gets its ``OSError`` (no row) and the others go on; anything else
    fails them all, before the commit, so no receipt can name an unrecorded entry.
    """
    results: list[bool | OSError] = []
    renamed: set[int] = set()
    syncs: list[Aside[None]] = []
    with Dirs(index.root) as dirs, _naming_entries():
        try:
            with index.transaction() as tx:
                for item in items:
                    tx.saw(item.now)
                    reused = tx.is_live(item.kind, item.key, item.now)
                    try:
                        dirs.publish(item.temp_name, item.kind, item.key, sync=False)
                    except OSError as exc:
                        results.append(exc)
                        continue
                    renamed.add(dirs.fanout(item.kind, item.key))
                    tx.upsert(item.kind, item.key, item.row, item.now)
                    _evict(tx, dirs, item.kind, item.key, item.now, item.max_entries)
                    results.append(reused)
                # Beside the COMMIT, as in :func:`publish`; all have returned before any result.
                syncs = [Aside(fsync, fd) for fd in renamed]
        finally:
            _synced(lambda: _wait_all(syncs))
    return results


def _wait_all(syncs: list[Aside[None]]) -> None:
    """Wait for every one (their fds close next), then raise the first failure."""
    failure: BaseException | None = None
    for sync in syncs:
        try:
            sync.wait()
        except BaseException as exc:  # re-raised below, once the others returned
            failure = failure or exc
    if failure is not None:
        raise failure


def renew(
    index: Index, kind: Kind, key: str, row: Row, now: float, bound: int, held: Tree | None = None
) -> bool:
    """Give a live entry whose bytes were just verified ``row``'s expiry, as a use.

    False (nothing changed) when the row no longer holds that digest or expired meanwhile:
    another process evicted or replaced it after we read it, and the caller writes afresh.
    False too when another writer's row has no file at its name under the lock: the file
    checked was evicted meanwhile, and the row now there is a put's whose rename is still to
    come (``publish_recorded``), or never comes if that put fails. (Files are unlinked only
    under the lock, and renamed outside it only with the same bytes: a name seen there is
    still there for the directory's fsync after the COMMIT.)

    The name is on disk when this returns True: the writer that published it fsyncs its
    directory beside its COMMIT, so a renewal that reads the row meanwhile syncs the
    directory itself, unless this process's writer stored or renewed the row last and none
    of this process's other namings is still under way (``_names_on_disk``).

    Not synced (``durable=False``): the bytes were fsynced before their rename, and a WAL
    commit that was visible to our lookup was already synced. A crash can only lose this
    transaction as a whole: the later expiry and the use (the entry keeps the expiry it had
    before this call, still verified on every read: a shorter TTL, never a wrong or torn
    value), and any eviction it made (a row whose file is gone reads Missing, as after a
    crash between unlink and commit before). The next durable commit makes it durable.
    """
    with _naming_entries(), Dirs(index.root, held) as dirs:
        try:
            with index.transaction(durable=False) as tx:
                on_disk = _renewed(tx, dirs, kind, key, row, now, bound)
        except _Declined:  # rolled back
            return False
        if not on_disk:
            _synced(lambda: fsync(dirs.fanout(kind, key)))
    return True


def _renewed(
    tx: Transaction, dirs: Dirs, kind: Kind, key: str, row: Row, now: float, bound: int
) -> bool:
    """:func:`renew`'s statements: whether the name is known to be on disk (``_Declined``)."""
    tx.saw(now)
    on_disk = _names_on_disk(tx.writer_of(kind, key))
    if not tx.renew(kind, key, row, now) or not (on_disk or dirs.named(kind, key)):
        raise _Declined
    _evict(tx, dirs, kind, key, now, bound)
    return on_disk


class _Declined(Exception):  # noqa: N818 - rolls a renewal back, not an error
    pass


def renew_on_loop(
    index: Index, kind: Kind, key: str, row: Row, now: float, bound: int
) -> bool | None:
    """:func:`renew` on the event loop thread, or None (nothing done) when that would block.

    It would when the lock is busy or the commit would fsync (``Index.transaction``), when
    the name must be synced first (another writer's, one of ours still being synced, or any
    once one of ours failed: ``_naming_failed``), or
    when rows are to be evicted (their files unlinked): the worker thread's :func:`renew`
    does all of that.
    """
    try:
        with _naming_entries(), index.transaction(on_loop=True) as tx:
            return _renew_here(tx, kind, key, row, now, bound)
    except (_Declined, IndexBusy):
        return None


def _renew_here(tx: Transaction, kind: Kind, key: str, row: Row, now: float, bound: int) -> bool:
    tx.saw(now)
    if not _names_on_disk(tx.writer_of(kind, key)):
        raise _Declined
    if not tx.renew(kind, key, row, now):
        return False
    if tx.victims((kind,), now, bound, keep=key, expired_limit=EXPIRED_PER_COMMIT):
        raise _Declined
    return True


def _evict(tx: Transaction, dirs: Dirs, kind: Kind, key: str, now: float, bound: int) -> None:
    for victim_kind, victim_key in _victims(tx, kind, key, now, bound):
        dirs.unlink(victim_kind, victim_key)


def _victims(
    tx: Transaction, kind: Kind, key: str, now: float, bound: int
) -> list[tuple[Kind, str]]:
    """Delete the rows to evict for ``key``'s sake; their files are the caller's to unlink."""
    victims = tx.victims((kind,), now, bound, keep=key, expired_limit=EXPIRED_PER_COMMIT)
    for victim_kind, victim_key in victims:
        tx.delete(victim_kind, victim_key)
    return victims
