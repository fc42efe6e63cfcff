"""Whether a commit would fsync, read from SQLite's wal-index (``index.sqlite3-shm``).

In WAL mode with ``synchronous=NORMAL`` a commit appends its frames to the log without an
fsync, with two exceptions: the first frame written after the log was started or restarted
(once every frame was copied into the database) syncs the log's header, and a commit that
takes the log past ``wal_autocheckpoint`` frames checkpoints it (two fsyncs). A renewal on the
event loop thread (``_commit.renew_on_loop``) must be neither. The wal-index, the shared
memory every connection maps from the ``-shm`` file, says which: its header's ``mxFrame``
(the last valid frame) and its checkpoint record's ``nBackfill`` (the frames already copied).
The format is documented (https://sqlite.org/walformat.html), in host byte order; the header
is kept twice, so a torn read shows as two copies that differ (SQLite's readers check so).

Read under the write lock, after ``BEGIN IMMEDIATE``: no other writer can append or restart
the log meanwhile, a checkpoint elsewhere only raises ``nBackfill``, and SQLite restarts the
log only when the transaction's snapshot (taken at BEGIN) found every frame copied. So
``nBackfill < mxFrame`` now means the commit appends. A wrong reading (the file replaced
under us) costs a hop, or one header fsync on the loop: never a wrong value. (SQLite can
still make any access wait briefly in two cases no setting turns off: a read snapshot retried
while a checkpoint moves it, and the recovery of a log left by a process that crashed; the
reads served on the loop, ``_reads.read_inline``, accept the same.)
"""

from __future__ import annotations

import functools
import os
import stat
import sys

from ._sqlite import BUSY_MS, CHECKPOINT_FRAMES

__all__ = [
    "CHECKPOINT_FRAMES",
    "SETTLED",
    "WalIndex",
    "appends_unsynced",
    "open_wal_index",
    "settings",
]

# What a transaction may change (set before it, set back after): durable or not, waiting for
# SQLite's lock or not, checkpointing at its COMMIT or not.
_CHANGES = (
    ("PRAGMA synchronous=NORMAL", "PRAGMA synchronous=FULL"),
    ("PRAGMA busy_timeout = 0", f"PRAGMA busy_timeout = {BUSY_MS}"),
    ("PRAGMA wal_autocheckpoint = 0", f"PRAGMA wal_autocheckpoint = {CHECKPOINT_FRAMES}"),
)
#: Every setting as ``_sqlite.connect`` made it.
SETTLED = tuple(back for _, back in _CHANGES)


@functools.cache  # eight combinations, asked for by every transaction
def settings(*, durable: bool, wait: bool, checkpoint: bool) -> tuple[tuple[str, ...], ...]:
    """The statements to run before a transaction, and after it."""
    changed = [
        pair for pair, kept in zip(_CHANGES, (durable, wait, checkpoint), strict=True) if not kept
    ]
    return tuple(before for before, _ in changed), tuple(after for _, after in changed)


_HEADER = 48  # one copy of WalIndexHdr; the checkpoint record's nBackfill follows the two
_READ = 2 * _HEADER + 4


class WalIndex:
    """One index's ``-shm`` file, opened when first asked (it exists once the log is used)."""

    def __init__(self, root: str) -> None:
        self._path = os.path.join(root, "index.sqlite3-shm")
        self._fd: int | None = None

    def appends_unsynced(self) -> bool:
        """:func:`appends_unsynced` of this file."""
        if self._fd is None:
            self._fd = open_wal_index(self._path)
        return appends_unsynced(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_wal_index(path: str) -> int | None:
    """An fd to read ``path`` (an index's ``-shm`` file), or None if not a regular file of ours.

    Non-blocking, so a FIFO planted under that name cannot hang a read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def appends_unsynced(fd: int | None) -> bool:
    """Whether the holder of the write lock would commit without an fsync (see above)."""
    if fd is None:
        return False
    try:
        raw = os.pread(fd, _READ, 0)
    except OSError:
        return False
    if len(raw) < _READ or raw[:_HEADER] != raw[_HEADER : 2 * _HEADER] or not raw[12]:
        return False  # short, torn, or not initialised (isInit, byte 12)
    last_frame = int.from_bytes(raw[16:20], sys.byteorder)  # mxFrame
    copied = int.from_bytes(raw[2 * _HEADER : _READ], sys.byteorder)  # nBackfill
    return copied < last_frame < CHECKPOINT_FRAMES
