"""``response_compaction_read_part``: a bounded, verified part of an exact value.

The thin I/O shell around :mod:`._part`: the store hands over the entry's bytes only after
they hash to the digest the reference names, and the part is cut from those bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import anyio.lowlevel
import msgspec

from ._canonical import Span
from ._errors import HIDDEN_CONTEXT_DROPPED
from ._models import Broken, Found, Missing
from ._part import Part, check_request, parse_pointer, part_of
from ._part_index import LayoutMismatchError, Node, index_document, remember
from ._refs import MalformedRefError, parse_exact_ref
from ._store import open_store
from ._store._fileio import current_backend
from ._store._partial import WholeWork, get_checked
from ._store._reading import Data

__all__ = ["response_compaction_read_part"]

#: Parts of documents up to this size are cut on the event loop, of larger ones in a worker
#: thread.
INLINE_BYTES = 1 << 20


async def response_compaction_read_part(
    harness: Any,
    exact_ref: str,
    *,
    pointer: str = "",
    start: int | None = None,
    stop: int | None = None,
    max_bytes: int = 65536,
) -> Found[Part] | Missing | Broken:
    """Read a bounded part of an exact value: the node at ``pointer``, window ``[start, stop)``.

    Verified like :func:`response_compaction_read_exact`: ``Found(Part)`` only from bytes
    that hash to the digest in ``exact_ref``; ``Missing()`` when never stored, expired or
    evicted; ``Broken(detail)`` for a malformed reference or bytes that do not verify. The
    part's ``json`` is never more than ``max_bytes`` UTF-8 bytes; see :class:`Part` for how
    arrays and objects are windowed, outlined when not even one item fits, and strings cut.

    Raises ``ValueError`` for a malformed pointer, a negative ``start``/``stop`` or
    ``max_bytes < 256`` (before any I/O), and ``LookupError`` when the pointer names nothing
    in the value. A read counts as a use of the entry.
    """
    parse_pointer(pointer)
    check_request(start, stop, max_bytes)
    try:
        parsed = parse_exact_ref(exact_ref)
    except MalformedRefError as error:
        return Broken(detail=str(error))
    with HIDDEN_CONTEXT_DROPPED:  # see response_compact
        return await _read_part(harness, parsed.hex, pointer, start, stop, max_bytes)


async def _read_part(
    harness: Any, hex_digest: str, pointer: str, start: int | None, stop: int | None,
    max_bytes: int,
) -> Found[Part] | Missing | Broken:  # fmt: skip
    store = await open_store(harness.fs)

    async def work(data: Data, spans: tuple[Span, ...]) -> tuple[Node | None, Part]:
        node = await index_document(data, spans, hex_digest, anyio.lowlevel.checkpoint)

        def cut() -> Part:
            return part_of(node, pointer, start=start, stop=stop, max_bytes=max_bytes)

        return node, await _cut(cut, len(data))

    try:
        result = await get_checked(
            store,
            "exact",
            hex_digest,
            work,
            whole=_whole_part(pointer, start, stop, max_bytes),
        )
    except LayoutMismatchError:
        # Only a holder of the store's key can seal a layout: the row was forged with it.
        return Broken(detail="exact entry's sealed layout does not match its verified bytes")
    except msgspec.DecodeError as exc:
        return Broken(detail=f"exact entry does not verify: not JSON ({exc})")
    if isinstance(result, Missing | Broken):
        return result
    node, part = result
    if node is not None:
        remember(hex_digest, node)  # only now: the bytes it was learned from verified
    return Found(value=part)


async def _cut(cut: Callable[[], Part], size: int) -> Part:
    """``cut()`` here when small; in a worker thread when large or out of stack here.

    Without a usable layout a large node is scanned by msgspec in one call, which holds the
    GIL; in a worker thread the loop at least runs between such calls. A deep value cut from
    a deep caller's stack (a framework's, an MCP server's) runs out of it; a worker thread's
    starts shallow.
    """
    if size <= INLINE_BYTES:
        with contextlib.suppress(RecursionError):
            return cut()
    return await current_backend().run(cut)


def _whole_part(
    pointer: str, start: int | None, stop: int | None, max_bytes: int
) -> WholeWork[tuple[Node | None, Part]]:
    """The part cut from a large entry's bytes, in a pool worker or a thread, and no node.

    A node holds the whole document: it would not travel, and is not worth keeping.
    """
    args: dict[str, Any] = {
        "pointer": pointer,
        "start": start,
        "stop": stop,
        "max_bytes": max_bytes,
    }

    def local(data: bytes) -> tuple[Node | None, Part]:
        return None, part_of(data, pointer, start=start, stop=stop, max_bytes=max_bytes)

    def from_reply(encoded: bytes) -> tuple[Node | None, Part]:
        return None, msgspec.msgpack.decode(encoded, type=Part)

    return WholeWork(op="part", args=args, local=local, from_reply=from_reply)
