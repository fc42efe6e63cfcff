"""Verifying large values in the pool's workers (``_pool``), and in the caller only when none is.

A verification finding every worker busy used to run in the caller at once: 32 concurrent
compactions verified about 15 values on the event loop's core (which also encodes every
value) while the workers idled between jobs. Now it is queued behind the job of a worker this
event loop holds (one deep: the worker starts it the moment it is done, while the loop may be
busy encoding for milliseconds), or waits for one of them to come back; it runs in the caller
only when this loop holds none (the pool is not started, or other loops hold every worker),
so it never waits on someone else's work.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import msgspec
from anyio.lowlevel import RunVar

from . import _pool
from ._canonical import Span
from ._described import describe
from ._pool import NOT_DONE, call
from ._slices import encode_layout

__all__ = ["MAX_SHARES", "QUEUE_BEHIND_BYTES", "SHARED_VERIFY_BYTES", "verify", "verify_unknown"]

#: From this size a file streamed in slices is verified by several workers at once.
SHARED_VERIFY_BYTES = 4 << 20
#: Workers sharing one file at most: each reads and hashes the whole file.
MAX_SHARES = 4
#: A verification is queued behind a worker's job of at most this many bytes (about 15 ms of
#: decoding here); behind a larger one it waits for whichever worker is back first.
QUEUE_BEHIND_BYTES = 4 << 20


class _Share:
    """One event loop's verifications in workers: how many, and a wake-up when one ends."""

    __slots__ = ("changed", "held", "in_flight")

    def __init__(self) -> None:
        self.in_flight = 0
        self.changed = anyio.Event()
        #: The workers this loop's single verifications use now (once per call).
        self.held: list[Any] = []

    def queue_behind(self) -> Any:
        """The worker of :attr:`held` with the smallest job that may take one more behind it."""
        ready = [worker for worker in self.held if worker.can_queue(QUEUE_BEHIND_BYTES)]
        return min(ready, key=lambda worker: worker.queued_bytes, default=None)

    def poke(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


_SHARES: RunVar[_Share] = RunVar("response_compaction_pool_share")


def _share() -> _Share:
    try:
        return _SHARES.get()
    except LookupError:
        share = _Share()
        _SHARES.set(share)
        return share


#: A schema's description as sent, by schema: the same few schemas come back on every call.
_SENT: dict[Any, str | None] = {}


def _described(schema: Any) -> str | None:
    try:
        return _SENT[schema]
    except KeyError:
        pass
    except TypeError:  # not hashable: described per call
        return _encoded(schema)
    text = _SENT[schema] = _encoded(schema)
    if len(_SENT) > 256:  # schemas made on the fly must not grow it without bound
        # Loops in other threads may evict at the same time: a lost race evicts nothing.
        with contextlib.suppress(KeyError, RuntimeError, StopIteration):
            _SENT.pop(next(iter(_SENT)))
    return text


def _encoded(schema: Any) -> str | None:
    description = describe(schema)
    return None if description is None else msgspec.json.encode(description).decode()


async def verify(
    path: str, hex_digest: str, size: int, schema: Any, key: bytes, spans: tuple[Span, ...] = ()
) -> Any:
    """Have a worker verify the file at ``path``: what is wrong, None, or NOT_DONE.

    A file of at least ``SHARED_VERIFY_BYTES`` streamed in slices (``spans``) is verified by
    every idle worker at once when two or more are, each decoding a share of the slices (10
    MB of short strings: about 48 ms decoded whole). Only a file they all vouch for passes
    that way; anything else is verified whole, which says what is wrong.
    """
    shareable = size >= SHARED_VERIFY_BYTES and bool(spans)
    if shareable and await _shared(path, hex_digest, size, schema, key, spans):
        return None
    reply = await _verify(path, hex_digest, size, schema, key)
    return reply if reply is NOT_DONE else reply["problem"]


async def _shared(
    path: str, hex_digest: str, size: int, schema: Any, key: bytes, spans: tuple[Span, ...]
) -> bool:
    """Whether the idle workers, each verifying a share, all vouch for the file."""
    description = _described(schema)
    workers = [] if description is None else _checkout_idle(MAX_SHARES)
    if len(workers) < 2:
        for worker in workers:
            _pool.POOL.checkin(worker)
        return False
    request = {"op": "verify", "path": path, "digest": hex_digest, "size": size, "key": key,
               "schema": description, "layout": encode_layout(spans)}  # fmt: skip
    replies: list[Any] = [NOT_DONE] * len(workers)

    async def one(share: int) -> None:
        replies[share] = await call({**request, "share": [share, len(workers)]}, workers[share])

    loop_share = _share()
    loop_share.in_flight += len(workers)
    try:
        async with anyio.create_task_group() as group:
            for share in range(len(workers)):
                group.start_soon(one, share)
    finally:
        loop_share.in_flight -= len(workers)
        loop_share.poke()
    return all(reply is not NOT_DONE and reply.get("ok") is True for reply in replies)


def _checkout_idle(most: int) -> list[Any]:
    workers: list[Any] = []
    while len(workers) < most and (worker := _pool.POOL.checkout()) is not None:
        workers.append(worker)
    return workers


async def verify_unknown(path: str, size: int, schema: Any, key: bytes) -> Any:
    """Have a worker read back, hash and decode the file at ``path``: its reply, or NOT_DONE.

    The reply's ``digest`` is the keyed digest of the bytes it read (None if they were not
    ``size`` long) and ``problem`` what is wrong with them otherwise, or None: the caller
    compares the digest with its own.
    """
    return await _verify(path, None, size, schema, key)


async def _verify(path: str, hex_digest: str | None, size: int, schema: Any, key: bytes) -> Any:
    description = _described(schema)
    if description is None:
        return NOT_DONE
    share = _share()
    worker = _pool.POOL.checkout() or share.queue_behind()
    while worker is None and share.in_flight:
        await share.changed.wait()
        worker = _pool.POOL.checkout() or share.queue_behind()
    if worker is None:
        return NOT_DONE
    share.in_flight += 1
    share.held.append(worker)
    try:
        reply = await call(
            {
                "op": "verify",
                "path": path,
                "digest": hex_digest,
                "size": size,
                "key": key,
                "schema": description,
            },
            worker,
        )
    finally:
        share.in_flight -= 1
        share.held.remove(worker)
        share.poke()
    return reply
