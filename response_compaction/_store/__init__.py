"""The trusted store: atomic, verified, bounded.

Layout below ``workspace_temp_dir()``::

    response-compaction-v1/        0700, owned by us, never a symlink
        index.sqlite3              one row per entry: digest, size, expiry, last use
        tmp/                       temporary files, renamed into place when verified
        key                        the store's secret digest key, 0600 (see _key)
        exact/ab/abcdef...         canonical bytes, named by their keyed digest
        summary/cd/cdef01...       canonical summary bytes, named by their cache identity

Entries are immutable files written by one algorithm (:meth:`Store.put`): a temporary file
in ``tmp/`` (written in a loop, since ``write`` may be short), fsync, read back and verified
(digest and schema), then, holding the index's write lock, the row upserted, the file renamed
into place, and the directory fsynced beside the COMMIT (all before any receipt); a small
exact value, named by its digest, commits its row beside the file's fsync and is renamed
after it, outside the lock (``_commit.publish_recorded``). TTL and LRU live in the index, not
in file times (relatime and noatime make atime useless, and a read must count as a use).
Eviction deletes the row and the file under one lock, so a writer never has its fresh file
unlinked while its row stays; fan-out directories are never removed. A row without its file
(evicted, or not yet renamed) reads ``Missing``; bytes that do not hash to the reference (or
a summary not sealed to its key) ``Broken``: the index is a hint, never trusted for data.

Rooms: ``_paths`` (the owned root, fd-safe file operations), ``_tree`` (the root's
directories held open and re-checked per call), ``_index`` (the connection registry and
reads), ``_tx`` (rows and write statements), ``_sqlite`` (opening the file safely),
``_clocks`` (expiry rules across skewed clocks), ``_key`` (the store's digest and sealing
key), ``_verify`` (digest, seal and schema checks), ``_fileio`` (the per-event-loop file
seam), ``_aside`` (work beside an fsync, in a helper thread), ``_oneshot`` and ``_medium`` (a
put in one hop), ``_reads`` (a get in one step), put together here (nothing below imports it).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import anyio.lowlevel

from .._canonical import Span, decode_exact
from .._digest import digest_hex, digest_of
from .._errors import map_errors
from .._harness import LocalWorkspace
from .._models import Broken, Found, Missing
from .._slices import decode_layout
from . import _verify
from ._aside import let_go
from ._clocks import finite_clock
from ._commit import publish
from ._fileio import FileBackend, current_backend
from ._hit import renew_inline
from ._medium import MEDIUM_BYTES, Medium
from ._oneshot import SMALL_BYTES, put_small, unlink_unrecorded_at
from ._paths import KINDS, PROCESS, ROOT_NAME, STALE_TEMP_SECONDS, Kind
from ._prune import prune_all, remove_entry
from ._reads import NOT_INLINE, check_read, found_landing, read_checked, read_inline, record_read
from ._roots import key_stamp, prepared_root
from ._stepwise import Stored
from ._turns import STEPS_SECONDS, cpu_turn, pace, soon, storing
from ._verify import GC_PAUSE_BYTES, EntryReport, decoded_beside, decoded_value

__all__ = [
    "KINDS",
    "ROOT_NAME",
    "EntryReport",
    "Kind",
    "Store",
    "Stored",
    "open_store",
    "publish",
]

Clock = Callable[[], float]


async def open_store(fs: Any) -> Store:
    """The store below ``fs.workspace_temp_dir()``, created and checked on first use.

    A :class:`LocalWorkspace` may carry a clock and a file backend (tests inject faults
    there); other workspaces get the running event loop's backend. The root is created and
    checked once per process and workspace, its directories held open (``_tree``); every later
    operation re-checks, one ``stat`` per directory without following links, that each name
    is still the directory held, ours and private, and opens the root again if not. A root on
    a file system that may stall a call (``_mounts``) is never looked at on the loop's thread.
    """
    if type(fs) is LocalWorkspace and fs.clock is None and fs.file_backend is None:
        # The common case, on every call: one lstat says the key file is the one read.
        known = _stores.get((PROCESS.pid, fs.path, current_backend()))
        if known is not None:
            store, stamp = known
            try:  # not contextlib.suppress: building one cost every read 0.3 us
                if key_stamp(store.root) == stamp:
                    return store
            except OSError:
                pass  # gone or unreadable: opened again below
    file_backend: FileBackend | None = None
    if isinstance(fs, LocalWorkspace):
        clock, file_backend = fs.clock, fs.file_backend
    else:
        clock = getattr(fs, "clock", None)  # the duck-typed workspace contract of earlier builds
    backend = file_backend or current_backend()
    base = os.fspath(fs.workspace_temp_dir())
    with map_errors(f"cannot use the workspace {base!r} for the store"):
        root = await prepared_root(backend, base)
    store = Store(root.path, finite_clock(clock) if clock else time.time, backend, root.key,
                  fast=file_backend is None and not root.may_hang)  # fmt: skip
    plain = type(fs) is LocalWorkspace and clock is None and file_backend is None
    if plain and root.stamp is not None and not root.may_hang:
        if len(_stores) >= 64:  # many workspaces: forget them all, they are cheap to open
            _stores.clear()
        _stores[(PROCESS.pid, fs.path, backend)] = (store, root.stamp)
    return store


# Stores of plain LocalWorkspaces (default clock and backend), with the key file's stamp when
# its key was read: a Store holds nothing else, so one per path and backend serves every call.
_stores: dict[tuple[int, str, FileBackend], tuple[Store, tuple[int, ...]]] = {}


class Store(Medium):
    """Content-addressed entries under an owned root, with TTL and LRU in an index."""

    def __init__(
        self, root: str, clock: Clock, backend: FileBackend, secret: bytes, *, fast: bool
    ) -> None:
        self.root = root
        self.clock = clock
        self._backend = backend
        self._key = secret
        # The one-hop paths of ``_oneshot`` bypass the backend's file calls: only for the
        # library's own backends, never for an injected one.
        self._fast = fast

    def digest_of(self, data: bytes | memoryview) -> str:
        """The keyed digest of ``data`` under this store's key, as receipts carry it."""
        return digest_of(self._key, data)

    async def put(
        self,
        kind: Kind,
        pieces: Iterable[bytes | memoryview],
        *,
        key: str | None,
        schema: Any,
        ttl_seconds: int,
        max_entries: int,
        want_value_up_to: int,
        layout: list[Span] | None = None,
    ) -> Stored:
        """Write ``pieces`` as one entry, verify it, and publish it atomically.

        ``key`` None means content-addressed (the hex digest). The validated value is returned
        when the entry is at most ``want_value_up_to`` bytes (larger ones may be verified in a
        worker process, and nobody needs their value). ``pieces`` is consumed on the event
        loop thread, one piece per write, so a lazy encoder never holds the loop for long.
        ``layout``, if given, is filled by the encoder as ``pieces`` are consumed and kept
        beside the entry so reads can decode it in slices. Raises ``ValueError`` if the bytes
        do not validate against ``schema`` and :class:`StoreError` if they cannot be retained;
        either way nothing is published and no temporary file is left behind, also when
        cancelled.
        """
        if not self._fast:
            return await self._put_streaming(
                kind, pieces, key, schema, ttl_seconds, max_entries, want_value_up_to, layout
            )
        turn = cpu_turn()
        async with turn:
            # Up to a medium value in this one turn (within its time budget): its last small
            # pieces gathered in a turn of their own queued behind every other task's first
            # turn, so 32 values were all encoded before the first was written (pool workers
            # idle for 90 ms).
            head, size, rest = _gather(iter(pieces), MEDIUM_BYTES)
        if rest is not None and size <= SMALL_BYTES:
            # The gather ended on its time budget: the next step yields first. Only ever
            # raised here (not reset: the count is shared with tasks holding the turn now).
            turn.spent = max(turn.spent, STEPS_SECONDS)
            size, rest = await _gather_more(head, size, rest, SMALL_BYTES)
        if rest is None and size <= SMALL_BYTES:
            data = b"".join(head)
            return await self._put_small(kind, key, data, layout, schema, ttl_seconds,
                                         max_entries, want_value_up_to)  # fmt: skip
        with storing():
            if rest is not None:
                size, rest = await _gather_more(head, size, rest, MEDIUM_BYTES)
            if rest is None:
                return await self._put_medium(kind, key, head, size, layout, schema, ttl_seconds,
                                              max_entries, size <= want_value_up_to)  # fmt: skip
            return await self._put_streaming(kind, itertools.chain(head, rest), key, schema,
                                             ttl_seconds, max_entries, want_value_up_to,
                                             layout)  # fmt: skip

    async def _put_small(
        self,
        kind: Kind,
        key: str | None,
        data: bytes,
        layout: list[Span] | None,
        schema: Any,
        ttl_seconds: int,
        max_entries: int,
        want_value_up_to: int,
    ) -> Stored:
        """At most one hop: reuse a live intact entry, or write, verify and publish ``data``."""
        hex_digest = digest_hex(self._key, data)
        key = key or hex_digest
        now = self.clock()
        row = self._new_row(kind, key, hex_digest, len(data), now + ttl_seconds, layout)
        temp_name = f"{secrets.token_hex(12)}.tmp"
        with map_errors(f"could not retain the {kind} value"):
            # A hit renewed on the loop when nothing there waits (_hit), else one hop.
            done = renew_inline(self.root, kind, key, data, row, schema, now, max_entries)
            if done is None or done is NOT_INLINE:
                done = await self._patiently(
                    put_small, self.root, temp_name, kind, key, data, hex_digest, row, schema,
                    now, self._key, max_entries, done is NOT_INLINE,
                )  # fmt: skip
            else:
                await pace()  # also the cancellation point, as after a read served inline
        if done.unrecorded:  # stored, then evicted: its file must not outlive the row
            with contextlib.suppress(OSError, sqlite3.Error):  # failing: a prune's to remove
                await self._patiently(unlink_unrecorded_at, self.root, kind, key)
        value = done.value if row.size <= want_value_up_to else None
        if row.size > want_value_up_to and row.size >= GC_PAUSE_BYTES:  # nobody wants it:
            soon(let_go, [done.value])  # freed after the call (see _medium), not in it
        return Stored(hex_digest=hex_digest, size=row.size, reused=done.reused, value=value)

    async def get(self, kind: Kind, key: str, schema: Any) -> Found[Any] | Missing | Broken:
        """Read, digest-check and validate one entry; a read counts as a use."""
        if not self._fast:
            return await self._get_stepwise(kind, key, schema)
        now = self.clock()
        try:
            got = read_inline(self.root, kind, key, now, self._key)
        except (OSError, sqlite3.Error):
            with map_errors(f"could not read the {kind} entry"):  # only built when needed
                raise
        if got is NOT_INLINE:
            with map_errors(f"could not read the {kind} entry"):
                got = await self._patiently(
                    read_checked, self.root, kind, key, now, self._key, schema
                )
        else:
            await pace()  # also the cancellation point: the read had no lasting effect
        if got is None:
            return Missing()
        if isinstance(got, str):
            return Broken(detail=got)
        if got.landing is not None:
            with map_errors(f"could not read the {kind} entry"):  # the helper's read failed
                return await found_landing(
                    self._backend, self.root, got, kind, key, schema, now, self._key
                )
        row, data, decoded, checked, _ = got
        try:
            if isinstance(decoded, Exception):
                raise decoded  # what the decode raised, now that the bytes checked
            if decoded is not None:
                return Found(value=decoded[0])
            if len(data) < GC_PAUSE_BYTES:  # small: no slices, no turn to take
                return Found(value=decode_exact(data, schema))
            spans = decode_layout(row.layout)
            if checked:
                value = await decoded_value(data, schema, spans)
            else:
                check = functools.partial(check_read, got, kind, key, self._key)
                value = await decoded_beside(self._backend, data, schema, spans, check)
                record_read(self.root, kind, key, now)
        except ValueError as exc:  # bytes checked; too deep for this stack: again in a thread
            return await _verify.decoded_in_thread(self._backend, kind, data, schema, exc)
        return Found(value=value)

    async def prune(self, max_entries: int | None = None) -> int:
        """Remove expired entries, and those beyond ``max_entries`` per kind.

        Also removes files no row names (left by a writer that died mid-commit, or by a small
        put whose row was evicted before its rename and which did not unlink it), rows whose
        file is absent (a small put that died between its row's commit and its rename; a file
        removed by hand) unless a temporary file under an hour old says a put may be in flight,
        and temporary files over an hour old.
        Returns how many entries and files went.
        """
        now = self.clock()
        # Temp files carry real file times, so their age is judged by the real clock.
        stale = time.time() - STALE_TEMP_SECONDS
        async with self._using_index() as index:
            return await self._patiently(prune_all, index, now, max_entries, stale)

    async def remove(self, kind: Kind, key: str) -> None:
        """Delete one entry (row and file), e.g. one that ``verify`` found broken."""
        async with self._using_index() as index:
            await self._patiently(remove_entry, index, kind, key)

    async def counts(self) -> dict[str, int]:
        """Live entries per kind."""
        async with self._using_index() as index:
            return await self._patiently(index.counts, self.clock())


# ----------------------------------------------------------------- blocking, in worker threads


def _gather(
    it: Iterator[bytes | memoryview], limit: int
) -> tuple[list[bytes | memoryview], int, Iterator[bytes | memoryview] | None]:
    """Consume ``it`` until more than ``limit`` bytes: (head, its size, the rest or None).

    Also stops (the rest not None) once encoding has held the loop for half of
    ``STEPS_SECONDS``: the first pieces of a large dict (a check of its keys' types, a
    sample, a sort of 562k keys) and its first small slices took 40 ms in this one turn.
    """
    head: list[bytes | memoryview] = []
    size = 0
    deadline = time.perf_counter() + STEPS_SECONDS / 2
    for piece in it:
        head.append(piece)
        size += len(piece)
        if size > limit or time.perf_counter() > deadline:
            return head, size, it
    return head, size, None


async def _gather_more(
    head: list[bytes | memoryview], size: int, it: Iterator[bytes | memoryview], limit: int
) -> tuple[int, Iterator[bytes | memoryview] | None]:
    """Go on consuming ``it`` into ``head`` up to ``limit`` bytes, one loop turn per piece.

    Returns the size gathered and the rest, or None when ``it`` ended. After a large piece
    the loop gets a turn, as it does between the writes of a streamed value: back to back,
    the pieces of a large value froze a 10 MB compaction's loop for 12-17 ms instead of 5-10.
    """
    turn = cpu_turn()
    while size <= limit:
        async with turn:  # encoding the next piece holds the loop
            piece = next(it, None)
        if piece is None:
            return size, None
        head.append(piece)
        size += len(piece)
        if len(piece) >= SMALL_BYTES:
            await anyio.lowlevel.checkpoint()
    return size, it
