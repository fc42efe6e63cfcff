"""Reading an entry's bytes into memory: bounded, and hashed as they land when large.

Every read of an entry asks for at most one byte more than its row says it holds: enough to
tell that the file grew (it then fails its digest check), never a planted sparse terabyte
read whole.

:func:`read_hashed` also hashes the bytes as they land: a helper reads piece after piece
into fresh memory while the caller hashes each piece read (both let go of the GIL), so
reading and hashing 90 MB took 58-68 ms here against 50 + 53 ms one after the other. The
memory is an anonymous private mapping, this process's own, filled once by ``readv`` from
the file: later writes to the file never show in it, as they would in a mapping of the file
itself, which a verified read must never use. (A ``bytearray`` would be zeroed whole before
the first piece could land.) What comes back is a read-only view of it.

Measured and dropped: advising the mapping to use huge pages (``MADV_HUGEPAGE``). Reading
90 MB then took 14 ms instead of 50 (45 faults instead of 22,000), but 90 MB compactions,
whose pool workers read the file back that way, took 1.1-1.5 s instead of 0.7-0.8 s in most
runs on this VM (no compaction stalls counted: the huge pages themselves came slowly).
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
from collections.abc import Callable

from .._digest import digest_hex, new_hasher
from ._aside import Aside

__all__ = [
    "CAN_READ_CACHED",
    "HASHED_BYTES",
    "Data",
    "fill",
    "fresh",
    "read_cached",
    "read_hashed",
    "read_limited",
    "read_unwaited",
    "refuse_if_refused",
]

#: The bytes of an entry as read: ``bytes``, or a read-only view of fresh memory when large.
Data = bytes | memoryview

#: :func:`read_hashed` reads at least this many bytes into a fresh mapping, hashed as read.
#: Below it, glibc's malloc hands a new ``bytes`` memory it kept (its mmap threshold grows to
#: 32 MiB as large blocks are freed): reading, then hashing, was as fast (read_part of 10 and
#: 30 MB: 10.3-11.6 and 24.4-25.7 ms, hashed as read 12.0-13.0 and 24.3-25.2). Above it, every
#: new ``bytes`` that size is fresh memory to fault in: at 50 MB, 65-68 ms against 37-38.
HASHED_BYTES = 32 << 20
#: The most one read asks for beyond what the file's fstat said it holds.
_READ_CHUNK = 1 << 20
#: What a reading helper reads at a time before the caller may use it.
PIECE = 2 << 20
_TOO_LARGE = "the entry is too large to read into memory"


def read_limited(fd: int, limit: int, st_size: int = -1) -> bytes:
    """At most ``limit + 1`` bytes of the open regular file ``fd``, which stays open."""
    try:
        return _read_bounded(fd, os.fstat(fd).st_size if st_size < 0 else st_size, limit)
    except MemoryError:
        # A planted sparse file as large as a forged row claims: unreadable, not a crash.
        raise OSError(errno.ENOMEM, _TOO_LARGE) from None


#: Whether a read can ask for only what the page cache holds (Linux's ``RWF_NOWAIT``).
CAN_READ_CACHED = hasattr(os, "preadv") and hasattr(os, "RWF_NOWAIT")
#: Devices whose file system refused such a read (tmpfs on Linux 6.18, FUSE, NFS): not asked
#: again, each refusal cost an open, a buffer of up to 2 MiB and a system call on the loop.
_REFUSED_ON: set[int] = set()
_NOT_CACHED = "not read from the page cache"
#: How a file system says it has no such reads.
_NO_SUCH_READS = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})


def refuse_if_refused(device: int) -> None:
    """``BlockingIOError`` where :func:`read_cached` cannot serve: no flag, or refused there."""
    if not CAN_READ_CACHED or device in _REFUSED_ON:
        raise BlockingIOError(errno.EAGAIN, _NOT_CACHED)


def read_cached(fd: int, limit: int, st_size: int, device: int = -1) -> Data:
    """:func:`read_limited` of a file the page cache holds whole, without waiting on a disk.

    Raises ``BlockingIOError`` when the read would wait (``RWF_NOWAIT``: some of the file is
    not in memory), the flag is refused (then never asked again on ``device``), or the file
    is not as long as its fstat said (empty, cut short, or grown but within ``limit``):
    :func:`read_limited` then reads it where waiting is fine. A refused read is not free: the
    kernel still starts reading the file ahead (0.44-0.51 ms of the caller's time for 2 MiB
    pushed out of the cache, measured here), about what the hop it tries to save costs. The
    bytes land in a ``bytearray`` returned as a read-only view: copying 1 MB into a ``bytes``
    cost 0.5-0.9 ms here, more than the read.
    """
    want = min(limit, st_size) + 1
    if st_size <= 0 or not CAN_READ_CACHED:  # a refused device: its caller asked before opening
        raise BlockingIOError(errno.EAGAIN, _NOT_CACHED)
    buffer = bytearray(want)
    try:
        got = os.preadv(fd, [buffer], 0, os.RWF_NOWAIT)
    except BlockingIOError as exc:  # EAGAIN: not all of it cached
        raise BlockingIOError(errno.EAGAIN, _NOT_CACHED) from exc
    except OSError as exc:
        if device >= 0 and exc.errno in _NO_SUCH_READS:  # not an EIO that may pass
            _REFUSED_ON.add(device)
        raise BlockingIOError(errno.EAGAIN, _NOT_CACHED) from exc
    if got not in (st_size, limit + 1):  # part cached, or the file changed since its fstat
        raise BlockingIOError(errno.EAGAIN, _NOT_CACHED)
    return memoryview(buffer)[:got].toreadonly()


def read_unwaited(fd: int, limit: int, st: os.stat_result) -> bytes:
    """:func:`read_limited` on the event loop's thread, without waiting for a disk to read.

    From the page cache alone (:func:`read_cached`) where the file system answers such reads:
    ``BlockingIOError`` when some of the file is not in memory, the flag was refused just
    now, or the file is empty or not as long as ``st`` says (a worker thread reads it then).
    A plain read where the file system refused the flag (tmpfs here: every file in memory)
    or there is none (not Linux). A small entry pushed out of the cache (memory pressure, a
    restart) was read from the disk on the loop, a wait no event-loop timeout can cut short.
    """
    if CAN_READ_CACHED and st.st_dev not in _REFUSED_ON:
        return bytes(read_cached(fd, limit, st.st_size, st.st_dev))
    return read_limited(fd, limit, st.st_size)


def read_hashed(fd: int, limit: int, key: bytes, st_size: int = -1) -> tuple[Data, str]:
    """:func:`read_limited`, and the keyed digest of the bytes it returns.

    A large file is hashed piece by piece as a helper reads it, exactly the bytes returned:
    what a file longer than its fstat said (grown meanwhile) holds past it is read on and
    hashed after them, as :func:`read_limited` reads on.
    """
    st_size = os.fstat(fd).st_size if st_size < 0 else st_size
    want = min(limit, st_size) + 1
    if want < HASHED_BYTES:
        data = read_limited(fd, limit, st_size)
        return data, digest_hex(key, data)
    view = memoryview(fresh(want))
    landed: queue.SimpleQueue[int] = queue.SimpleQueue()
    reading = Aside(_fill, fd, view, landed, pool="read")
    hasher, at = new_hasher(key), 0
    try:
        while (end := landed.get()) >= 0:
            hasher.update(view[at:end])
            at = end
    except BaseException:
        reading.join()  # the caller closes ``fd`` next: not while the helper still reads it
        raise
    got = reading.wait()  # what the read raised, if it failed
    read: Data = view[:got].toreadonly()
    if got == want <= limit:
        rest = read_limited(fd, limit - got)
        hasher.update(rest)
        read = b"".join((read, rest))
    return read, hasher.hexdigest()


def _read_bounded(fd: int, st_size: int, limit: int) -> bytes:
    # ``os.read`` allocates what it is asked for: it is asked for what the fstat says the
    # file holds (bounded by the row), not for what the row says (2**40: a MemoryError).
    want = min(limit, st_size or _READ_CHUNK) + 1
    data = os.read(fd, want)  # small entries: one read (no file object to build)
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


def fresh(size: int) -> mmap.mmap:
    """``size`` bytes of fresh private memory (zero pages until written)."""
    try:
        memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as exc:
        if exc.errno == errno.ENOMEM:  # as read_limited says it of a failed ``os.read``
            raise OSError(errno.ENOMEM, _TOO_LARGE) from None
        raise
    return memory


def fill(
    fd: int,
    view: memoryview,
    landed: Callable[[int], object],
    most: int = PIECE,
    stopped: Callable[[], bool] = lambda: False,
) -> int:
    """Read ``fd`` into ``view`` until it is full, the file ends or ``stopped()``: the count.

    ``landed(end)`` is called after each piece; pieces grow from ``PIECE`` up to ``most``.
    """
    got, size = 0, len(view)
    while got < size and not stopped():
        count = os.readv(fd, [view[got : got + min(most, max(PIECE, got))]])
        if count <= 0:
            break
        got += count
        landed(got)
    return got


def _fill(fd: int, view: memoryview, landed: queue.SimpleQueue[int]) -> int:
    """:func:`fill` in 2 MiB pieces, each end put in ``landed``, then -1 (also on failure)."""
    try:
        return fill(fd, view, landed.put)
    finally:
        landed.put(-1)
