"""Verifying large values in the pool's workers (``_pool``), and in the caller when they are busy.

With every worker busy the caller's core is one more worker, but only one: while an event
loop verifies one value itself, its next verification waits for one of the workers this loop
holds to come back. Before, 32 concurrent compactions verified about 30 values on the loop's
core while the two workers sat idle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import anyio
import msgspec
from anyio.lowlevel import RunVar

from ._pool import NOT_DONE, POOL, call, describe

__all__ = ["verify", "verifying_here"]


class _Share:
    """Verifications of one event loop: how many are in workers and in the caller."""

    __slots__ = ("changed", "in_flight", "local")

    def __init__(self) -> None:
        self.in_flight = 0
        self.local = 0
        self.changed = anyio.Event()

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


@contextlib.contextmanager
def verifying_here() -> Iterator[None]:
    """Around a verification done in the caller's process (see :func:`verify`)."""
    share = _share()
    share.local += 1
    try:
        yield
    finally:
        share.local -= 1
        share.poke()


async def verify(path: str, hex_digest: str, size: int, schema: Any, key: bytes) -> Any:
    """Have a worker verify the file at ``path``: what is wrong, None, or NOT_DONE."""
    description = describe(schema)
    if description is None:
        return NOT_DONE
    share = _share()
    worker = POOL.checkout()
    while worker is None and share.local and share.in_flight:
        await share.changed.wait()
        worker = POOL.checkout()
    if worker is None:
        return NOT_DONE
    share.in_flight += 1
    try:
        reply = await call(
            {
                "op": "verify",
                "path": path,
                "digest": hex_digest,
                "size": size,
                "key": key,
                "schema": msgspec.json.encode(description).decode(),
            },
            worker,
        )
    finally:
        share.in_flight -= 1
        share.poke()
    return reply if reply is NOT_DONE else reply["problem"]
