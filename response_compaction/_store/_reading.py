"""Reading an entry's bytes into memory: bounded, and fast when large.

Every read of an entry asks for at most one byte more than its row says it holds: enough to
tell that the file grew (it then fails its digest check), never a planted sparse terabyte
read whole. A large file is read into fresh anonymous memory advised to use huge pages:
reading 90 MB into a new ``bytes`` took 50 ms here, most of it the kernel faulting in 22,000
fresh 4 KiB pages, and 14 ms into such a mapping (where the kernel has no huge pages to give,
it costs what ``bytes`` did). The mapping is private memory of this process, filled once by
``readv`` from the file: later writes to the file never show in it, as they would in a
mapping of the file itself, which a verified read must never use. What comes back is a
read-only view of it.

:func:`read_hashed` also hashes the bytes as they land: a helper reads piece after piece
while the caller hashes each one read (both let go of the GIL), so reading and hashing 90 MB
take about as long as hashing alone (54 against 50 + 53 ms here).
"""

from __future__ import annotations

import errno
import mmap
import os
import queue

from .._digest import new_hasher
from ._aside import Aside

__all__ = ["PAGED_BYTES", "Data", "read_hashed", "read_limited"]

#: The bytes of an entry as read: ``bytes``, or a read-only view of fresh memory when large.
Data = bytes | memoryview

#: Reads of at least this many bytes go into a fresh mapping (smaller ones: one ``os.read``).
PAGED_BYTES = 4 << 20
#: The most one read asks for beyond what the file's fstat said it holds.
_READ_CHUNK = 1 << 20
#: What :func:`read_hashed`'s helper reads at a time before the caller may hash it.
_PIECE = 2 << 20
_TOO_LARGE = "the entry is too large to read into memory"
#: Linux only; elsewhere the mapping is left to the kernel's defaults.
_HUGE = getattr(mmap, "MADV_HUGEPAGE", None)


def read_limited(fd: int, limit: int, st_size: int = -1) -> Data:
    """At most ``limit + 1`` bytes of the open regular file ``fd``, which stays open."""
    try:
        return _read_bounded(fd, os.fstat(fd).st_size if st_size < 0 else st_size, limit)
    except MemoryError:
        # A planted sparse file as large as a forged row claims: unreadable, not a crash.
        raise OSError(errno.ENOMEM, _TOO_LARGE) from None


def read_hashed(fd: int, limit: int, key: bytes, st_size: int = -1) -> tuple[Data, str]:
    """:func:`read_limited`, and the keyed digest of the bytes it returns.

    A large file is hashed piece by piece as a helper reads it, exactly the bytes returned:
    what a file longer than its fstat said (grown meanwhile) holds past it is read on and
    hashed after them, as :func:`read_limited` reads on.
    """
    st_size = os.fstat(fd).st_size if st_size < 0 else st_size
    want = min(limit, st_size) + 1
    if want < PAGED_BYTES:
        data = read_limited(fd, limit, st_size)
        return data, _digest(key, data)
    view = memoryview(_fresh(want))
    landed: queue.SimpleQueue[int] = queue.SimpleQueue()
    reading = Aside(_fill, fd, view, landed, pool="read")
    hasher, at = new_hasher(key), 0
    while (end := landed.get()) >= 0:
        hasher.update(view[at:end])
        at = end
    got = reading.wait()  # what the read raised, if it failed
    read: Data = view[:got].toreadonly()
    if got == want <= limit:
        rest = read_limited(fd, limit - got)
        hasher.update(rest)
        read = b"".join((read, rest))
    return read, hasher.hexdigest()


def _digest(key: bytes, data: Data) -> str:
    hasher = new_hasher(key)
    hasher.update(data)
    return hasher.hexdigest()


def _read_bounded(fd: int, st_size: int, limit: int) -> Data:
    # ``os.read`` allocates what it is asked for: it is asked for what the fstat says the
    # file holds (bounded by the row), not for what the row says (2**40: a MemoryError).
    want = min(limit, st_size or _READ_CHUNK) + 1
    # Small entries: one read (no file object to build); large ones into fresh huge pages.
    data = os.read(fd, want) if want < PAGED_BYTES else _read_paged(fd, want)
    # A regular file's read comes back short at its end, and the fstat said where that is:
    # no second read to learn it (a system call, 0.4 us of a 45 us small read).
    if len(data) < want and len(data) >= st_size > 0:
        return data
    # Cut short before it (a file that shrank), a size of 0 (some FUSE file systems say so
    # of any file) or a file longer than its fstat said: read on, in pieces joined once,
    # until a read comes back empty or there is a byte more than the limit.
    chunks, got = [data], len(data)
    while got <= limit:
        chunk = os.read(fd, min(limit + 1 - got, max(st_size, _READ_CHUNK)))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return data if len(chunks) == 1 else b"".join(chunks)


def _read_paged(fd: int, want: int) -> memoryview:
    """Up to ``want`` bytes of ``fd`` (fewer at its end) in fresh memory, read-only."""
    view = memoryview(_fresh(want))
    got = _fill(fd, view)
    return view[:got].toreadonly()


def _fresh(size: int) -> mmap.mmap:
    """``size`` bytes of fresh private memory, huge pages asked for."""
    try:
        memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as exc:
        if exc.errno == errno.ENOMEM:  # as read_limited says it of a failed ``os.read``
            raise OSError(errno.ENOMEM, _TOO_LARGE) from None
        raise
    if _HUGE is not None:
        memory.madvise(_HUGE)
    return memory


def _fill(fd: int, view: memoryview, landed: queue.SimpleQueue[int] | None = None) -> int:
    """Read ``fd`` into ``view`` until it is full or the file ends: how many bytes came.

    With ``landed``, the end of what has been read so far is put there after each piece,
    then -1 (also when a read fails).
    """
    got, size = 0, len(view)
    try:
        while got < size:
            step = _PIECE if landed is not None else size - got
            count = os.readv(fd, [view[got : min(got + step, size)]])
            if count <= 0:
                break
            got += count
            if landed is not None:
                landed.put(got)
    finally:
        if landed is not None:
            landed.put(-1)
    return got
