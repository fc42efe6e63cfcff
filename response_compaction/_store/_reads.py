"""A read of one entry in one step: on the event loop thread when small, else in one hop.

The row is looked up (live by this clock and by the clocks already witnessed), the file read
without following links, and its bytes checked against what is trusted (the reference's
keyed digest, or a summary's sealed row) before any value decoded from them is handed out.
An entry of a medium size is decoded in the same hop, right after its hash and by the same
thread. Decoding it in a helper while this thread hashed (hashing lets go of the GIL) was
slower on two cores: the helper's wake-up and the GIL's hand-back cost more than the hash it
hid (1 MB, read in one process alternating both: 0.3-0.5 ms more at the minimum, up to 1 ms
at the median, for rows, nested and strings alike). Near the 2 MB limit it depends on the
shape: 1.9 MB of rows still read faster here, 1.9 MB of short strings 1-2 ms slower.

Up to 2 MB, an entry the page cache holds whole is read on the loop's thread instead, with
no hop (``_reading.read_cached``: Linux's ``RWF_NOWAIT`` asks only for what is in memory, and
a read that would wait goes to the worker thread as before). The hop itself cost 0.3-0.5 ms
here, most of it waking a worker thread on an idle core and then the loop: the thread's
read began 0.33-0.37 ms after the call did (1 MB, at the minimum). The decode held the GIL
either way, so the loop's longest freeze did not grow (1 MB reads: 2.5-9.0 ms, against
3.4-7.5 before); the read itself took 2.9-5.3 ms instead of 3.5-8.1 (two runs each of
``python -m benchmarks --only big --sizes 1``, alternating; rows, nested, strings). A read
the cache cannot serve costs the loop the start of the kernel's readahead before the hop
(about 0.5 ms for 2 MiB pushed out of the cache); a file system that refuses such reads is
not asked again.
"""

from __future__ import annotations

import errno
import functools
import sqlite3
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from .._errors import map_errors
from .._models import Broken, Found
from .._slices import decode_layout
from . import _indexes, _reading
from ._fileio import FileBackend
from ._index import CorruptRowError, IndexBusy, Row
from ._landing import Landing, decoded_landing, land_entry
from ._oneshot import INDEX_ERRORS, read_entry, read_entry_cached, read_entry_unwaited
from ._paths import Kind, NotRegularFileError
from ._reading import Data
from ._tree import Tree, release_now, tree, tree_now
from ._verify import (
    DECODE_BESIDE_BYTES,
    WHOLE_DECODE_BYTES,
    check_trusted,
    check_trusted_digest,
    decode_outcome,
    decoded_in_thread,
    decodes_plainly,
)

__all__ = [
    "INLINE_READ_BYTES",
    "NOT_INLINE",
    "Read",
    "check_landed",
    "check_read",
    "found_landing",
    "read_checked",
    "read_inline",
    "record_read",
]

T = TypeVar("T")

#: Entries up to this size are read on the event loop thread (see :func:`read_inline`).
INLINE_READ_BYTES = 64 << 10
#: Entries up to this size are read there too when the page cache holds them whole.
CACHED_READ_BYTES = WHOLE_DECODE_BYTES
#: What :func:`read_inline` returns when the read must take a worker thread.
NOT_INLINE: Any = object()


class Read(NamedTuple):
    """An entry read: its row, its bytes, and its value if decoded already."""

    row: Row
    data: Data
    #: ``(value,)`` or what the decode raised, when decoded in the read's hop; None: not.
    decoded: tuple[Any] | Exception | None = None
    #: False: the bytes are still to be checked, beside their decode in slices (the caller's).
    checked: bool = True
    #: The bytes still landing (``data`` empty meanwhile), for a decode as they land.
    landing: Landing | None = None


def read_checked(
    root: str, kind: Kind, key: str, now: float, secret: bytes, schema: Any
) -> Read | str | None:
    """Look ``key`` up, read its bytes and check them against what is trusted.

    None when there is no live row or the file is gone (a concurrent eviction); a string
    saying what is wrong when the bytes cannot be trusted. An entry of ``DECODE_BESIDE_BYTES``
    up to ``WHOLE_DECODE_BYTES`` comes back decoded against ``schema``, and a larger one
    unchecked (``checked=False``: the caller checks it beside its decode in slices, see
    ``_verify.decoded_beside``), or from ``_reading.HASHED_BYTES`` still landing (``landing``: the
    caller decodes it as it lands, see ``_landing``). The read is recorded as a use,
    best-effort (never waiting for the write lock).
    """
    with tree(root) as dirs:
        return _read_checked(dirs, root, kind, key, now, secret, schema)


def _read_checked(
    dirs: Tree, root: str, kind: Kind, key: str, now: float, secret: bytes, schema: Any
) -> Read | str | None:
    with map_errors(INDEX_ERRORS):
        index = _indexes.acquire(root)
    try:
        try:
            with map_errors(INDEX_ERRORS):
                row = index.lookup(kind, key, now)
        except CorruptRowError:
            return f"{kind} entry's index row is corrupt"
        # Expired by this clock, or by the time other clocks already witnessed (_clocks).
        if row is None or row.expires_at <= max(now, row.attested):
            return None
        # A large entry whose plain decode can go on as its bytes land (``_landing``).
        lands = row.size >= _reading.HASHED_BYTES and decodes_plainly(schema)
        if lands:
            data = _untrusted(land_entry, dirs, kind, key, row.size, secret)
        else:
            data = _read_untrusted(dirs, kind, key, row.size)
        if isinstance(data, Landing):
            return Read(row, b"", checked=False, landing=data)  # a use once checked
        if not isinstance(data, bytes):
            return data
        if len(data) > WHOLE_DECODE_BYTES:
            return Read(row, data, checked=False)  # a use once checked (record_read)
        problem = _problem(data, kind, key, row.digest, secret)
        if problem is not None:
            return problem
        decoded = None
        if len(data) >= DECODE_BESIDE_BYTES and decodes_plainly(schema):
            # Off the loop, GC paused. A schema with code of its own (validators, hooks) is
            # decoded by the caller, on the caller's thread, as it always was.
            decoded = decode_outcome(data, schema)
        _indexes.note_use(index, kind, key, now)  # a due batch is written off this read's path
    finally:
        _indexes.release(index)
    return Read(row, data, decoded)


def _read_untrusted(dirs: Tree, kind: Kind, key: str, limit: int) -> bytes | str | None:
    """At most ``limit + 1`` bytes of the entry; None if gone, a string if not a plain file."""
    return _untrusted(read_entry, dirs, kind, key, limit)  # a planted huge file: a byte more


def _untrusted(
    read: Callable[..., T], dirs: Tree, kind: Kind, key: str, *args: Any
) -> T | str | None:
    """``read(dirs, kind, key, *args)``; None if the entry is gone, a string if not a plain file."""
    try:
        return read(dirs, kind, key, *args)
    except FileNotFoundError:
        return None
    except NotRegularFileError as exc:
        return f"{kind} entry {exc.strerror}; refusing to read it"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{kind} entry is a symlink; refusing to follow it"
        raise


def record_read(root: str, kind: Kind, key: str, now: float) -> None:
    """On the event loop thread: the use of an entry read unchecked, once it checked.

    Best-effort, as every read's: never a wait or a commit here (see ``_indexes.note_use``).
    """
    index = _indexes.acquire_now(root)
    if index is None:
        return
    try:
        _indexes.note_use(index, kind, key, now)
    finally:
        _indexes.release(index, close_idle=False)


def check_read(read: Read, kind: Kind, key: str, secret: bytes) -> None:
    """Blocking: raise ``ValueError`` unless ``read``'s bytes are what is trusted."""
    check_trusted(read.data, kind, key, read.row.digest, secret)


def check_landed(
    read: Read, kind: Kind, key: str, secret: bytes, data: Data, hex_digest: str
) -> None:
    """:func:`check_read` of bytes that landed, whose keyed digest is ``hex_digest``.

    They must also be as many as the row says: the value was decoded from that many (a file
    cut to a row's forged size, then made whole again while it was read, would otherwise
    pass its digest with a value decoded from part of it).
    """
    if len(data) != read.row.size:
        raise ValueError("the entry file is not as long as its row says")
    check_trusted_digest(hex_digest, kind, key, read.row.digest, secret)


def _problem(data: Data, kind: Kind, key: str, recorded: str, secret: bytes) -> str | None:
    """What is wrong with ``data`` against what is trusted, or None.

    The reference (or, for a summary, the sealed row) is the only digest trusted.
    """
    try:
        check_trusted(data, kind, key, recorded, secret)
    except ValueError as exc:
        return f"{kind} entry does not verify: {exc}"
    return None


def read_inline(root: str, kind: Kind, key: str, now: float, secret: bytes) -> Any:
    """:func:`read_checked` run on the event loop thread, for small entries only.

    A hop to a worker thread costs more than reading, hashing and decoding a few KB from the
    page cache, so a small entry is read right here, provided nothing would make the loop
    wait: the index must already be open and its reader free this instant, the row must say
    at most ``INLINE_READ_BYTES`` (and no more than that plus one byte is ever read), or at
    most ``CACHED_READ_BYTES``, and the page cache must hold the file whole (``read_cached``;
    up to ``INLINE_READ_BYTES``, a plain read where the file system refuses to say:
    ``read_unwaited``). Otherwise ``NOT_INLINE``: take the worker thread. A batch of
    recorded uses that is due (a commit) is written by a helper thread.
    """
    index = _indexes.acquire_now(root)
    if index is None:
        return NOT_INLINE
    try:
        try:
            row = index.lookup(kind, key, now, wait=False)
        except IndexBusy:
            return NOT_INLINE
        except CorruptRowError:
            return f"{kind} entry's index row is corrupt"
        except (OSError, sqlite3.Error):
            with map_errors(INDEX_ERRORS):  # only built when needed: this runs on every read
                raise
        if row is None or row.expires_at <= max(now, row.attested):
            return None
        if row.size > (CACHED_READ_BYTES if _reading.CAN_READ_CACHED else INLINE_READ_BYTES):
            return NOT_INLINE
        dirs = tree_now(root, kind)
        if dirs is None:
            return NOT_INLINE  # not opened yet, changed, or removed (remaking writes)
        try:
            data: Data | str | None
            if row.size <= INLINE_READ_BYTES:
                data = _untrusted(read_entry_unwaited, dirs, kind, key, INLINE_READ_BYTES)
            else:
                data = _untrusted(read_entry_cached, dirs, kind, key, row.size)
        except BlockingIOError:  # not all in the page cache (or an open would block): hop
            return NOT_INLINE
        finally:
            release_now(dirs)
        if isinstance(data, bytes | memoryview):
            problem = _problem(data, kind, key, row.digest, secret)
            if problem is not None:
                return problem
            _indexes.note_use(index, kind, key, now)  # a due batch: by a helper, off the loop
    finally:
        _indexes.release(index, close_idle=False)
    return data if data is None or isinstance(data, str) else Read(row, data)


async def found_landing(
    backend: FileBackend, root: str, read: Read, kind: Kind, key: str, schema: Any, now: float,
    secret: bytes,
) -> Found[Any] | Broken:  # fmt: skip
    """The value of an entry read as it lands (``read.landing``), once its bytes checked."""
    landing = read.landing
    if landing is None:
        raise TypeError("not a read still landing")
    check = functools.partial(check_landed, read, kind, key, secret)
    try:
        spans = decode_layout(read.row.layout)
        value = await decoded_landing(backend, landing, schema, spans, check)
    except ValueError as exc:  # as ``get``'s: the bytes checked; maybe too deep for the stack
        return await decoded_in_thread(backend, kind, landing.view, schema, exc)
    record_read(root, kind, key, now)
    return Found(value=value)
