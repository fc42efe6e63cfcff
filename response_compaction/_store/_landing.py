"""A large entry decoded while it is read: each slice as soon as the bytes under it landed.

Reading 90 MB into memory takes 50 ms here (mostly the kernel faulting in fresh pages), and it
came before the decode, which took 0.5 s of short strings in slices with the hash beside it.
Here a helper reads the file in growing pieces into fresh private memory (as ``read_hashed``)
and then hashes it, while the caller decodes slice after slice of what has landed
(``_slices.decode_sliced`` with :meth:`Landing.landed`): the read and the hash both run beside
the decode. Both let go of the GIL; the decode holds it. Measured on 90 MB read back (six
reads each way, alternated in one process, both loops): 0.87-0.95x the time of the read
before the decode, for rows, nested and short strings alike. Only from 32 MiB (the hashed
read's ``HASHED_BYTES``): 10 MB read this way took 0.91-1.21x as long, worse in five of six
cases (min of twelve), the helper's GIL waits costing more than the 5 ms read it hid.

What is decoded is the bytes hashed: the memory is this process's own (an anonymous private
mapping, filled once by ``readv``; later writes to the file never show in it), the decode
looks at no byte before it landed, and no value is handed out before the read has ended and
its digest passed the caller's check. A read that ended short (a file cut meanwhile) makes the
decode stop and the digest decide; bytes past the row's size mean a file that grew, which the
digest refuses.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from .._digest import new_hasher
from .._errors import UnsafeStoreError
from .._perf import paused_gc
from .._slices import Span, decode_sliced
from ._aside import Aside
from ._fileio import FileBackend
from ._paths import Kind, open_regular, valid_name
from ._reading import Data, fill, fresh, read_limited
from ._tree import Tree
from ._turns import cpu_turn, next_turn

__all__ = ["Landing", "ShortReadError", "decoded_landing", "land_entry", "land_file"]

#: The largest piece read at once.
_MOST = 32 << 20

#: Checks the bytes read and their keyed digest: raises ``ValueError`` unless trusted.
Check = Callable[[Data, str], None]


class ShortReadError(ValueError):
    """The file ended before the bytes the decode needed (a file cut while it was read)."""


class Landing:
    """``size`` bytes of ``fd`` being read and hashed by a helper; ``fd`` is this object's."""

    __slots__ = ("_cond", "_got", "_over", "_reading", "_stop", "_whole", "size", "view")

    def __init__(self, fd: int, size: int, key: bytes) -> None:
        try:
            self.size = size
            self._whole = memoryview(fresh(size + 1))  # a byte more: a grown file reads longer
            #: What the caller decodes: the row's size, read-only.
            self.view = self._whole[:size].toreadonly()
            self._got = 0  # bytes landed so far; only the helper writes it
            self._over = False
            self._stop = False
            self._cond = threading.Condition()
        except BaseException:
            os.close(fd)
            raise
        self._reading = Aside(self._read, fd, key, pool="read")  # runs here if it must

    def _read(self, fd: int, key: bytes) -> str:
        """In the helper: fill the memory from ``fd`` (then closed), then hash it at once.

        Each return from a read or a hash waits for the GIL, which the decode holds for
        milliseconds at a time: 10-120 ms a wait here. So the pieces grow (small first, for
        the decode to start soon) and the hash is one call over them all: reading and hashing
        2 MiB pieces one after the other landed 90 MB only as its decode (0.6 s) ended.
        """
        whole = self._whole
        try:
            fill(fd, whole, self._landed, _MOST, lambda: self._stop)
        finally:
            os.close(fd)
            with self._cond:
                self._over = True
                self._cond.notify_all()
        if self._stop:
            return ""  # nobody checks it: no 90 MB hash for nothing
        hasher = new_hasher(key)
        hasher.update(whole[: self._got])
        return hasher.hexdigest()

    def _landed(self, end: int) -> None:
        with self._cond:
            self._got = end  # the decode may go on
            self._cond.notify_all()

    def holds(self, end: int) -> bool:
        """Whether the first ``end`` bytes have landed by now."""
        return self._got >= end

    async def landed(self, end: int, backend: FileBackend) -> None:
        """Return once the first ``end`` bytes have landed; :class:`ShortReadError` if never."""
        if self._got < end and not await backend.run(self._wait_for, end):
            raise ShortReadError("the entry file ended early")

    def _wait_for(self, end: int) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._got >= end or self._over) and self._got >= end

    async def read(self, backend: FileBackend) -> tuple[Data, str]:
        """:meth:`wait`, in a worker thread unless the read has ended already."""
        return self.wait() if self._reading.done() else await backend.run(self.wait)

    def wait(self) -> tuple[Data, str]:
        """Blocking: once the read ended, the bytes read and their digest ("" if stopped)."""
        hex_digest = self._reading.wait()
        return self._whole[: self._got].toreadonly(), hex_digest

    def stop(self) -> None:
        """Ask the helper to stop after its current piece (nobody wants the bytes any more)."""
        self._stop = True


def land_entry(dirs: Tree, kind: Kind, key: str, size: int, secret: bytes) -> bytes | Landing:
    """Blocking: :func:`land_file` of the entry file of ``key``."""
    if not valid_name(kind, key):
        raise UnsafeStoreError("not an entry name", kind)
    fan_fd = dirs.fanout(kind, key)
    try:
        return land_file(key, fan_fd, size, secret)
    finally:
        os.close(fan_fd)


def land_file(path: str, dir_fd: int | None, size: int, secret: bytes) -> bytes | Landing:
    """Blocking: the file's ``size`` bytes landing, or read here if it is not that long.

    Opened without following a link, and only if it is a regular file with one link. A file
    of another size than its row's is broken or being replaced: it is read as any entry is
    (at most a byte past ``size``), for its digest check to judge.
    """
    fd, st = open_regular(path, dir_fd)
    if st.st_size == size:
        return Landing(fd, size, secret)  # which owns ``fd`` from here
    try:
        return read_limited(fd, size, st.st_size)
    finally:
        os.close(fd)


async def decoded_landing(
    backend: FileBackend, landing: Landing, schema: Any, spans: tuple[Span, ...], check: Check
) -> Any:
    """The value of the bytes landing, decoded in slices as they land, once ``check`` passed.

    ``check``'s ``ValueError`` wins over whatever the decode raised, as in ``decoded_beside``.
    """

    async def landed(end: int) -> None:
        if landing.holds(end):
            return
        turn = cpu_turn()
        turn.release()  # others' CPU steps on this loop need not wait for these bytes
        try:
            await landing.landed(end, backend)
        finally:
            await turn.take_back()

    try:
        with paused_gc():
            async with cpu_turn():
                value = await decode_sliced(landing.view, schema, spans, next_turn, landed)
    except Exception:  # a short read among them: its bytes never check
        await _checked(backend, landing, check)
        raise
    except BaseException:
        landing.stop()  # cancelled: no bytes wanted any more; the helper closes the file
        raise
    await _checked(backend, landing, check)
    return value


async def _checked(backend: FileBackend, landing: Landing, check: Check) -> None:
    data, hex_digest = await landing.read(backend)
    check(data, hex_digest)
