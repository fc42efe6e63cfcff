"""Small values in one worker-thread hop: every blocking step of a put in one call.

A hop to a worker thread costs about 50 us; the streaming algorithm of ``Store.put`` takes a
dozen of them (open, write, fsync, close, open, read, close, hash, index, publish...), which
for a 2 KB value cost four times the work itself. A small value is already whole in memory,
so here the same steps run with the same checks (write looping on short writes, fsync of the
file, read back, digest, schema, rename under the index's write lock, fsync of the directory,
COMMIT) inside one blocking call. What does not wait on a disk runs beside the waits, in a
helper thread (``_aside``): the read-back checks beside the file's fsync (but those of a few
KB, cheaper than the helper, before it), the directory's fsync beside the COMMIT. The index's
write lock is never held through the file's fsync (every other writer of the store would
wait for this disk). The file's fsync still ends before its rename, and every fsync before
the call returns. (Reads: ``_reads``.)

A value named by its digest (an exact value) of up to ``CHECK_HERE_BYTES``, checked first,
has its row committed by this thread while a helper fsyncs the file
(``_commit.publish_recorded``): the COMMIT's wait on the disk overlaps the file's, and the
rename and the directory's fsync follow both. 2 KB compactions on ext4 alternating with the
order above in one process (2000 a run, four runs): 130-160 us less at the tenth percentile
and the median, 90-150 us at the minimum. Staging only the row's statements in a helper
during the file's fsync, the COMMIT after it, had given 10-25 us at the minimum and nothing at
the median. A value under another key (a summary) is renamed under the lock before its row
is committed: a file another writer renamed to that name meanwhile could hold other bytes.

Only the library's own file backends take this path; an injected backend (the tests' fault
seam) gets the streaming algorithm, call by call.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from .._canonical import decode_exact
from .._errors import UnsafeStoreError, map_errors
from . import _indexes
from ._aside import Aside
from ._commit import Publication, publish, publish_recorded, renew, unlink_unrecorded
from ._index import CorruptRowError, Index, Row
from ._paths import (
    FILE_FLAGS,
    Kind,
    open_regular,
    unlink_quietly,
    valid_name,
)
from ._reading import Data, read_cached, read_limited, read_unwaited, refuse_if_refused
from ._tree import Dirs, Tree, tree
from ._verify import check_digest

__all__ = [
    "INDEX_ERRORS",
    "SMALL_BYTES",
    "Put",
    "put_small",
    "read_entry",
    "read_entry_cached",
    "read_entry_unwaited",
    "read_regular",
    "renew_intact",
    "renewable",
    "stored_as",
    "unlink_unrecorded_at",
    "write_fully",
]

INDEX_ERRORS = "could not use the store index"

#: Values up to this size are buffered on the loop and stored in one hop; decoding this much
#: holds the GIL for well under a millisecond.
SMALL_BYTES = 256 << 10
#: Values up to this size are checked by the put's own thread before its fsync, not by a
#: helper beside it: the helper's wake-up and its hand-back of the GIL cost more than the
#: 20-30 us the checks of 2 KB take (2 KB puts alternating both ways in one process: 50-100
#: us less at the minimum, the tenth percentile and the median; even at 16 KB; the helper
#: gains from 64 KB, where the checks take longer than its overhead).
CHECK_HERE_BYTES = 16 << 10


class Put(NamedTuple):
    """What :func:`put_small` did: whether the key was live before, and the verified value.

    ``unrecorded``: its row was evicted before its file's rename and the index was busy, so
    that file is still to be unlinked (:func:`unlink_unrecorded_at`, between tries).
    """

    reused: bool
    value: Any
    unrecorded: bool = False


def put_small(
    root: str,
    temp_name: str,
    kind: Kind,
    key: str,
    data: bytes,
    hex_digest: str,
    row: Row,
    schema: Any,
    now: float,
    store_key: bytes,
    max_entries: int,
    renew: bool = True,
) -> Put:
    """Store ``data`` (whose keyed digest is ``hex_digest``) as ``key``, verified, in one call.

    An entry already live under ``key`` with the same digest, whose bytes on disk are intact and
    validate, is not rewritten: its TTL is renewed. Anything else (absent, expired, tampered,
    evicted meanwhile) is written afresh. ``renew=False``: the caller just found nothing to
    renew (``_hit``), so it is written without looking again. Raises ``ValueError`` if the
    bytes do not validate.
    """
    with tree(root) as dirs:  # first: a removed root is made again before the index opens
        with map_errors(INDEX_ERRORS):
            index = _indexes.acquire(root)
        try:
            if renew:
                renewed = _renew_if_intact(index, dirs, kind, key, (data,), row, schema, now,
                                           max_entries)  # fmt: skip
                if renewed is not None:
                    return renewed
            return _write_new(
                index, dirs, temp_name, kind, key, data, (hex_digest, store_key), row,
                schema, now, max_entries,
            )  # fmt: skip
        finally:
            _indexes.release(index)


def unlink_unrecorded_at(root: str, kind: Kind, key: str) -> None:
    """Blocking: ``_commit.unlink_unrecorded`` in ``root`` (:class:`IndexBusy` to retry)."""
    with tree(root) as held, Dirs(root, held) as dirs:
        with map_errors(INDEX_ERRORS):
            index = _indexes.acquire(root)
        try:
            unlink_unrecorded(index, dirs, kind, key)
        finally:
            _indexes.release(index)


def renew_intact(
    root: str, kind: Kind, key: str, pieces: Sequence[bytes | memoryview], row: Row,
    schema: Any, now: float, max_entries: int,
) -> Put | None:  # fmt: skip
    """Blocking: renew ``key`` if live with ``data``'s digest and ``data`` on disk; else None.

    ``ValueError`` if those bytes do not validate against ``schema``.
    """
    with tree(root) as dirs:
        with map_errors(INDEX_ERRORS):
            index = _indexes.acquire(root)
        try:
            return _renew_if_intact(index, dirs, kind, key, pieces, row, schema, now, max_entries)
        finally:
            _indexes.release(index)


def _renew_if_intact(
    index: Index,
    dirs: Tree,
    kind: Kind,
    key: str,
    pieces: Sequence[bytes | memoryview],
    row: Row,
    schema: Any,
    now: float,
    max_entries: int,
) -> Put | None:
    try:
        with map_errors(INDEX_ERRORS):
            existing = index.lookup(kind, key, now, writer=True)
    except CorruptRowError:
        return None  # the fresh write's upsert replaces the row
    if not renewable(existing, row, now):
        return None
    on_disk = stored_as(dirs, kind, key, pieces, row.size)
    if on_disk is None:
        return None
    value = decode_exact(on_disk, schema)  # ValueError: the value does not validate
    with map_errors(f"could not renew the {kind} value in the store index"):
        renewed = renew(index, kind, key, row, now, max_entries, dirs)
    return Put(reused=True, value=value) if renewed else None


def renewable(existing: Row | None, row: Row, now: float) -> bool:
    """Whether ``existing`` is live (by every clock witnessed) with ``row``'s digest and size."""
    return (
        existing is not None
        and existing.expires_at > max(now, existing.attested)
        and existing.digest == row.digest
        and existing.size == row.size
    )


def stored_as(
    dirs: Tree,
    kind: Kind,
    key: str,
    pieces: Sequence[bytes | memoryview],
    size: int,
    *,
    on_loop: bool = False,
) -> bytes | None:
    """The entry's bytes if they are ``pieces``; None if they differ, are gone or not a file.

    Equal bytes hash to the digest computed from ``pieces``: the row's digest (the same seal
    as the new row's) only said where to look. ``on_loop``: read as :func:`read_unwaited`
    reads (``BlockingIOError`` if that would wait).
    """
    read = read_entry_unwaited if on_loop else read_entry
    try:
        on_disk = read(dirs, kind, key, size)  # a planted huge file: one byte more
    except BlockingIOError:
        if on_loop:
            raise  # not known yet: the caller's worker thread looks
        return None  # an open that would wait (a lease held elsewhere): written afresh
    except OSError:
        return None
    return on_disk if _same_bytes(on_disk, pieces) else None


def _same_bytes(data: bytes, pieces: Sequence[bytes | memoryview]) -> bool:
    """Whether ``data`` is ``pieces`` one after the other (compared in place, not joined).

    ``startswith`` compares with memcmp: a memoryview comparison goes byte by byte (1.09
    against 0.015 ms for 1 MiB).
    """
    at = 0
    for piece in pieces:
        if not data.startswith(piece, at):
            return False
        at += memoryview(piece).nbytes  # bytes, whatever the view's format
    return at == len(data)


def _write_new(
    index: Index,
    dirs: Tree,
    temp_name: str,
    kind: Kind,
    key: str,
    data: bytes,
    digest: tuple[str, bytes],
    row: Row,
    schema: Any,
    now: float,
    max_entries: int,
) -> Put:
    published = False
    tmp_fd = dirs.tmp
    try:
        fd = os.open(
            temp_name, os.O_RDWR | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=tmp_fd
        )
        try:
            write_fully(fd, data)
            if kind == "exact" and key == digest[0] and len(data) <= CHECK_HERE_BYTES:
                value = _checked(fd, data, digest, schema)  # ValueError: not valid
                with map_errors(f"could not publish the {kind} value in the store index"):
                    item = Publication(temp_name, kind, key, row, now, max_entries)
                    reused, left = publish_recorded(index, fd, item, dirs)
                published = True
                return Put(reused=reused, value=value, unrecorded=left)
            # The index's write lock is taken only after the fsync: held through it, every
            # other writer of the store (this process's and others') waited for this disk,
            # then retried whole puts.
            value = _checked_and_synced(fd, data, digest, schema)
        finally:
            os.close(fd)  # a failing close after fsync is still a failure to retain
        with map_errors(f"could not publish the {kind} value in the store index"):
            reused = publish(index, temp_name, kind, key, row, now, max_entries, dirs)
        published = True
    finally:
        if not published:
            unlink_quietly(temp_name, tmp_fd)
    return Put(reused=reused, value=value)


def _checked_and_synced(fd: int, data: bytes, digest: tuple[str, bytes], schema: Any) -> Any:
    """The bytes read back and checked (:func:`_checked`), and the file fsynced: the value.

    The checks see the bytes written, on disk or not. Up to ``CHECK_HERE_BYTES`` they run
    here before the fsync; larger ones in a helper while this thread waits for the disk.
    """
    if len(data) <= CHECK_HERE_BYTES:
        value = _checked(fd, data, digest, schema)  # ValueError: not valid
        os.fsync(fd)
        return value
    checked = Aside(_checked, fd, data, digest, schema)
    try:
        os.fsync(fd)
    except BaseException:
        checked.join()  # the fsync's error is the one to raise
        raise
    return checked.take()  # ValueError: the bytes do not validate


def _checked(fd: int, data: bytes, digest: tuple[str, bytes], schema: Any) -> Any:
    """The temp file read back, digest-checked and decoded: the value.

    Read through the fd that wrote it (the file this put created, ``O_EXCL``, in the store's
    own temp directory), from its start: a seek and a read rather than an open, an fstat, a
    read and a close. :func:`read_limited` reads on where a read comes back short before the
    end (FUSE with ``direct_io``, NFS), which would otherwise fail the length check as a value
    that does not validate; told the size written, it stops after one read in the usual case.
    """
    os.lseek(fd, 0, os.SEEK_SET)
    back = read_limited(fd, len(data), len(data))  # one byte more tells it is longer
    check_digest(back, digest[0], len(data), digest[1])
    return decode_exact(back, schema)


def read_entry(dirs: Tree, kind: Kind, key: str, limit: int = -1) -> bytes:
    fan_fd = _fanout(dirs, kind, key)
    try:
        return read_regular(key, fan_fd, limit)
    finally:
        os.close(fan_fd)


def read_entry_unwaited(dirs: Tree, kind: Kind, key: str, limit: int) -> bytes:
    """:func:`read_entry` for the event loop's thread (:func:`read_unwaited`)."""
    fd, st = _open_entry(dirs, kind, key)
    try:
        return read_unwaited(fd, limit, st)
    finally:
        os.close(fd)


def read_entry_cached(dirs: Tree, kind: Kind, key: str, limit: int) -> Data:
    """:func:`read_entry` from the page cache only (``BlockingIOError`` if it would wait)."""
    fd, st = _open_entry(dirs, kind, key, cached_only=True)
    try:
        return read_cached(fd, limit, st.st_size, st.st_dev)
    finally:
        os.close(fd)


def _open_entry(
    dirs: Tree, kind: Kind, key: str, *, cached_only: bool = False
) -> tuple[int, os.stat_result]:
    """The entry's file, opened as :func:`open_regular` opens it, and its ``fstat``.

    ``cached_only``: ``BlockingIOError`` before the open where the file system refused
    cached reads (not even an open where it is no use).
    """
    fan_fd = _fanout(dirs, kind, key)
    try:
        if cached_only:
            refuse_if_refused(os.fstat(fan_fd).st_dev)
        return open_regular(key, fan_fd)
    finally:
        os.close(fan_fd)


def _fanout(dirs: Tree, kind: Kind, key: str) -> int:
    if not valid_name(kind, key):
        raise UnsafeStoreError("not an entry name", kind)
    return dirs.fanout(kind, key)


def read_regular(name: str, dir_fd: int, limit: int = -1) -> bytes:
    """The file's bytes; with a ``limit``, at most ``limit + 1`` of them.

    One byte more is enough to tell that a file is longer than its row says (it then fails
    the digest check), and a planted huge file is never read whole on the loop.
    """
    fd, st = open_regular(name, dir_fd)
    if limit < 0:
        with os.fdopen(fd, "rb", buffering=0) as file:
            return file.readall()
    try:
        return read_limited(fd, limit, st.st_size)
    finally:
        os.close(fd)


def write_fully(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to ``fd`` (``write`` may be short); no progress is an error."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]
