"""Values of up to a few MB, whole in memory: the streaming algorithm in one hop.

The call-by-call algorithm (``_stepwise``) takes about ten worker-thread hops per value (open
the temp directory, open the file, a write per piece, fsync, open, read and close to read it
back, a hash, the index, the publish, the closes), and verifies a value over half a megabyte in
a worker process, a round trip of about 2 ms. For 1 MB that was a third of the time the work
itself takes. A value the encoder gave whole (up to ``MEDIUM_BYTES``) goes through the same
steps in the same order, with the same checks, in one worker-thread call (:func:`_store_here`):
create the temp file and write every piece (looping on short writes) while a helper hashes
the pieces and looks for the entry that digest names (one already live, intact on disk and
valid, is renewed instead, and the file just written discarded), hand its fsync to a syncer
thread, read it back by name, decode it against the schema (GC paused) in a helper while this
thread checks its keyed digest, wait for the fsync, then publish it (rename, directory fsync,
row). The read-back sees the bytes written whether or not they are on disk yet, and nothing
is published before the fsync and the verification both ended. The syncer is started before
the decode because msgspec holds the GIL while it decodes: a thread asked for the fsync
afterwards only began once the decode was over, so the two ran one after the other.

That is for a value stored alone on its event loop: decoding a few MB holds the GIL for a few
milliseconds, which the caller's loop can spare, and the value a receipt hands back is that
decode's, decoded once. While others are being stored on the loop (and nobody wants the value
back), the pool's worker processes verify it instead (``_verifiers``), so that many values at
once use every core, and the publish joins the loop's group commit (``_group``).

Only the library's own file backends take this path; an injected backend (the tests' fault
seam) gets the streaming algorithm, call by call.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import anyio

from .. import _pool, _verifiers
from .._canonical import Span
from .._errors import map_errors
from .._perf import paused_gc
from . import _indexes
from ._aside import Aside, in_list, let_go
from ._commit import Publication, publish
from ._group import publish_grouped
from ._index import IndexBusy
from ._oneshot import read_regular, renew_intact, write_fully
from ._paths import Kind
from ._stepwise import INDEX_ERRORS, Stepwise, Stored
from ._temp import Temp, create_temp, digest_pieces, temp_name, write_temp
from ._tree import tree
from ._turns import STEPS_SECONDS, cpu_turn, others_storing, soon
from ._verify import WORKER_VERIFY_BYTES, check_reply, checked_decode, decodes_plainly

__all__ = ["MEDIUM_BYTES", "Medium"]

#: Values up to this size are gathered whole on the loop and stored in one hop; decoding this
#: much holds the GIL for about 5-10 ms, reading it back from the page cache far less.
MEDIUM_BYTES = 2 << 20
#: The loop writes a medium value into the page cache this much at a time (see _write_here).
_WRITE_STEP = 1 << 20


class _Done(NamedTuple):
    """What :func:`_store_here` did: the digest, the value, and whether the key was live.

    ``reused`` None: the index was busy (another process holds its write lock), so the
    verified temp file is left for the caller to publish patiently, its directory fd open.
    """

    temp: Temp | None  # None when a live intact entry was renewed instead
    hex_digest: str
    value: Any
    reused: bool | None
    #: The decoded value nobody wants, for the caller to :func:`let_go` of once back.
    dropped: list[Any] | None = None


def _store_here(
    root: str, name: str, pieces: Sequence[bytes | memoryview], size: int, schema: Any,
    key: bytes, want_value: bool, item: Callable[[str], Publication],
) -> _Done:  # fmt: skip
    """Blocking: write, verify and publish in this one worker thread (see the module docstring).

    ``item`` makes the publication from the digest. A live entry with these bytes, intact
    and valid, is renewed instead of written again. The temp file is discarded if it does
    not verify (``ValueError``) or anything else fails. A value nobody wants is not freed
    here but handed back in ``dropped``, for the caller to free once it has returned.
    """
    written = _written_unless_live(root, name, pieces, schema, key, want_value, item)
    if isinstance(written, _Done):
        return written
    temp, hex_digest = written
    try:
        checked = [_verify_temp(temp, hex_digest, size, schema, key, synced=False)]
        value = checked.pop() if want_value else None
        temp.wait_synced()
        reused = _publish_now(root, item(hex_digest))
        if reused is None:
            return _Done(temp, hex_digest, value, None, checked)
    except BaseException:
        temp.discard(published=False)
        raise
    os.close(temp.dir_fd)  # a directory's fd: nothing to flush
    return _Done(temp, hex_digest, value, reused, checked)


def _written_unless_live(
    root: str, name: str, pieces: Sequence[bytes | memoryview], schema: Any, key: bytes,
    want_value: bool, item: Callable[[str], Publication],
) -> _Done | tuple[Temp, str]:  # fmt: skip
    """Blocking: the temp file written and its fsync begun, with the digest; or the renewal.

    A helper hashes the pieces and looks for the live entry that digest names while this
    thread writes (both let go of the GIL); for a schema with code of its own it only hashes,
    and the look follows the write on this thread, with the caller's context, as every decode
    of such a schema. A hit discards the file before any fsync.
    """

    def look(hex_digest: str) -> _Renewed | None:
        return _renew_here(root, item(hex_digest), pieces, schema, want_value)

    here = None if decodes_plainly(schema) else look
    with tree(root):  # first: a removed root is made again before a file is created in it
        ahead = Aside(_digest_then, key, pieces, look if here is None else None)
        try:
            temp = write_temp(os.path.join(root, "tmp"), name, pieces)
        except Exception:  # a full disk, say: a live entry answers (and its errors) as before
            hex_digest, renewed = _looked(ahead, here)
            if renewed is None:
                raise
            return _Done(None, hex_digest, *renewed)
        except BaseException:
            ahead.join()
            raise
    try:
        hex_digest, renewed = _looked(ahead, here)
        if renewed is None:
            temp.start_sync()
    except BaseException:
        temp.discard(published=False)
        raise
    if renewed is not None:
        temp.discard(published=False)  # never synced: closed and unlinked at once
        return _Done(None, hex_digest, *renewed)
    return temp, hex_digest


class _Renewed(NamedTuple):
    """A live entry renewed instead of written: its value if wanted, else what to let go of."""

    value: Any
    reused: bool
    dropped: list[Any] | None


_Look = Callable[[str], "_Renewed | None"]


def _digest_then(
    key: bytes, pieces: Sequence[bytes | memoryview], look: _Look | None
) -> tuple[str, _Renewed | None]:
    """Blocking: the keyed digest of ``pieces``, and ``look(digest)`` (the renewal) if given."""
    hex_digest = digest_pieces(key, pieces)
    return hex_digest, None if look is None else look(hex_digest)


def _looked(
    ahead: Aside[tuple[str, _Renewed | None]], here: _Look | None
) -> tuple[str, _Renewed | None]:
    """``ahead``'s digest and renewal; ``here``: the look made now, on this thread, instead."""
    hex_digest, renewed = ahead.wait()
    return hex_digest, renewed if here is None else here(hex_digest)


def _renew_here(
    root: str, publication: Publication, pieces: Sequence[bytes | memoryview], schema: Any,
    want_value: bool,
) -> _Renewed | None:  # fmt: skip
    """Blocking: renew the entry ``publication`` names if live, intact and ``pieces``.

    What was renewed (the value, or the value to let go of once the call has returned, as
    ``_store_here`` does); None when it is to be written.

    A hit read, compared and decoded the stored bytes and renewed the row (3-4 ms for 1 MB),
    where writing them again cost a whole store (10-11 ms, more than a fresh one).
    """
    _, kind, key, row, now, max_entries = publication
    try:
        with paused_gc():  # a young collection over the fresh tree costs more than the decode
            put = renew_intact(root, kind, key, pieces, row, schema, now, max_entries)
    except IndexBusy:  # another process holds the index: written afresh, published patiently
        return None
    if put is None:
        return None
    if want_value:
        return _Renewed(put.value, True, None)
    return _Renewed(None, True, [put.value])


def _write_steps(fd: int, steps: Sequence[memoryview]) -> None:
    """Blocking: write every step to ``fd`` (the rest of a write the loop handed off)."""
    for step in steps:
        write_fully(fd, step)


def _publish_now(root: str, publication: Publication) -> bool | None:
    """Blocking: :func:`publish` at once; None if the index is busy (another process)."""
    try:
        with map_errors(INDEX_ERRORS):
            index = _indexes.acquire(root)
        try:
            with map_errors(f"could not publish the {publication.kind} value in the store index"):
                return publish(index, *publication)
        finally:
            _indexes.release(index)
    except IndexBusy:
        return None


def _verify_temp(
    temp: Temp, hex_digest: str, size: int, schema: Any, key: bytes, *, synced: bool = True
) -> Any:
    """Blocking: read the temp file back, check its keyed digest and decode it: the value.

    Raises ``ValueError`` saying what is wrong. At most one byte more than written is read:
    enough to tell that the file grew. ``synced=False`` leaves waiting for the fsync (and
    its failure) to the caller.
    """
    data = read_regular(temp.name, temp.dir_fd, size)
    with paused_gc():  # a young collection over the fresh tree costs more than the decode
        value = checked_decode(data, hex_digest, size, schema, key)
    if synced:
        temp.wait_synced()
    return value


class Medium(Stepwise):
    """The put of a value whole in memory (see the module docstring)."""

    async def _put_medium(
        self,
        kind: Kind,
        key: str | None,
        pieces: Sequence[bytes | memoryview],
        size: int,
        layout: list[Span] | None,
        schema: Any,
        ttl_seconds: int,
        max_entries: int,
        want_value: bool,
    ) -> Stored:
        name = temp_name()
        item = functools.partial(self._item, kind, key, name, size, layout, ttl_seconds,
                                 max_entries)  # fmt: skip
        backend = self._backend
        with map_errors(f"could not retain the {kind} value"):
            # A worker process verifies only a value nobody wants back (it would be decoded
            # twice), and only while others are being stored on this loop.
            if not want_value and size >= WORKER_VERIFY_BYTES and others_storing():
                return await self._put_elsewhere(name, pieces, size, schema, item)
            done = await backend.run(
                _store_here, self.root, name, pieces, size, schema, self._key, want_value, item
            )
            if done.dropped:
                # Freeing 1 MB of decoded rows took 0.8-2.2 ms (not 0.5): done in the worker
                # while the file's fsync ran, it outlasted the fsync by nearly that much, and
                # a helper begun before the call returned shared the GIL with the rest of it.
                # So the free starts once the caller's task yields, the receipt its own.
                soon(let_go, done.dropped)
            reused = done.reused
            if reused is None:  # the index was busy: publish patiently, then clean up
                assert done.temp is not None  # noqa: S101 - only a written temp file waits
                reused = await self._publish_temp(done.temp, item(done.hex_digest))
        return Stored(hex_digest=done.hex_digest, size=size, reused=reused, value=done.value)

    def _item(
        self,
        kind: Kind,
        key: str | None,
        name: str,
        size: int,
        layout: list[Span] | None,
        ttl_seconds: int,
        max_entries: int,
        hex_digest: str,
    ) -> Publication:
        """The publication of temp file ``name`` once its digest is known (any thread)."""
        now = self.clock()
        entry = key or hex_digest
        row = self._new_row(kind, entry, hex_digest, size, now + ttl_seconds, layout)
        return Publication(name, kind, entry, row, now, max_entries)

    async def _put_elsewhere(
        self,
        name: str,
        pieces: Sequence[bytes | memoryview],
        size: int,
        schema: Any,
        item: Callable[[str], Publication],
    ) -> Stored:
        """Write here, verify in a pool worker, publish in a group commit (many at once).

        The write runs on the loop, with no hop (about 0.2 ms per MB into the page cache,
        counted in the loop's CPU turn): in a worker thread, each of its GIL reacquisitions
        waited out the 5 ms switch interval while the loop encoded other values, so the first
        of 32 writes ended after all 32 encodes (88 ms) and the pool's workers idled. The keyed
        hash of the pieces runs in the syncer thread before its fsync (hashing lets go of the
        GIL). The worker reads the file back, hashes and decodes it, and the two digests are
        compared here in constant time: the receipt's digest is this process's own, of the
        bytes it handed to ``write``, published only once the bytes read back have it and
        decode.
        """
        tmp_path = os.path.join(self.root, "tmp")
        temp = create_temp(tmp_path, name)
        try:
            await self._write_here(temp, pieces)
            temp.hash_and_sync(self._key, pieces)
        except BaseException:
            temp.discard(published=False)
            raise
        try:
            hex_digest = await self._verify_elsewhere(temp, size, schema)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._backend.run(functools.partial(temp.discard, published=False))
            raise
        reused = await self._publish_temp(temp, item(hex_digest))
        return Stored(hex_digest=hex_digest, size=size, reused=reused)

    async def _write_here(self, temp: Temp, pieces: Sequence[bytes | memoryview]) -> None:
        """Write ``pieces`` from the loop while the page cache takes them at once.

        In steps of ``_WRITE_STEP``; once writing has held the loop for half a turn (the
        kernel throttling dirty pages, a slow file system) the rest goes to a worker thread,
        which runs to its end whatever happens to the caller.
        """
        began = time.perf_counter()
        steps = [view[at : at + _WRITE_STEP] for piece in pieces
                 for view in (memoryview(piece).cast("B"),)
                 for at in range(0, len(view), _WRITE_STEP)]  # fmt: skip
        try:
            for i, step in enumerate(steps):
                if time.perf_counter() - began > STEPS_SECONDS / 2:
                    await self._backend.run(_write_steps, temp.fd, steps[i:])
                    return
                write_fully(temp.fd, step)
        finally:
            cpu_turn().spent += time.perf_counter() - began

    async def _publish_temp(self, temp: Temp, publication: Publication) -> bool:
        """Publish the verified ``temp`` (group commit, patient), then let go of it."""
        published = False
        try:
            reused = await self._publish_item(publication)
            published = True
        finally:
            if published:
                os.close(temp.dir_fd)  # a directory's fd: nothing to flush
            else:
                with anyio.CancelScope(shield=True):
                    await self._backend.run(functools.partial(temp.discard, published=False))
        return reused

    async def _verify_elsewhere(self, temp: Temp, size: int, schema: Any) -> str:
        """Verify in a pool worker, or in a thread here when none is free: the digest.

        Raises ``ValueError`` if the bytes read back are not those written or do not decode.
        """
        path = os.path.join(self.root, "tmp", temp.name)
        reply = await _verifiers.verify_unknown(path, size, schema, self._key)
        if temp.synced_already():
            hex_digest = temp.wait_synced()  # done: only its outcome to read, no hop
        else:
            hex_digest = await self._backend.run(temp.wait_synced)
        if hex_digest is None:  # pragma: no cover - hash_and_sync always hashes
            raise RuntimeError("the syncer did not hash the value")
        if reply is _pool.NOT_DONE:  # verified in a thread here: nobody wants the value
            dropped = await self._backend.run(in_list, _verify_temp, temp, hex_digest, size,
                                              schema, self._key)  # fmt: skip
            soon(let_go, dropped)  # as _put_medium's: not on the loop's thread, nor in the call
        else:
            check_reply(reply, hex_digest)
        return hex_digest

    async def _publish_item(self, item: Publication) -> bool:
        """Publish ``item`` in a group commit; whether its key was live before."""
        with map_errors(INDEX_ERRORS):
            # Open already: no hop to take it (releasing on the loop leaves closing idle
            # indexes, a checkpoint, to a worker thread's next release).
            index = _indexes.acquire_now(self.root)
            if index is None:
                index = await self._patiently(_indexes.acquire, self.root)
        try:
            with map_errors(f"could not publish the {item.kind} value in the store index"):
                return await publish_grouped(self._patiently, index, item)
        finally:
            _indexes.release(index, close_idle=False)
