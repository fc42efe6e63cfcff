"""Checking bytes against their record: size and digest, schema, in a worker when large."""

from __future__ import annotations

import functools
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.lowlevel
import msgspec.inspect as mi

from .. import _pool, _verifiers
from .._canonical import Span, decode_exact
from .._digest import digest_hex, matches
from .._encoding import TooDeepError
from .._models import Broken, Found
from .._perf import paused_gc
from .._pydantic import is_pydantic_schema
from .._refusals import type_nodes
from .._slices import Sign, decode_sliced, open_layout, seal_layout
from . import _reading
from ._aside import Aside, let_go
from ._fileio import FileBackend
from ._index import Entry
from ._landing import Landing, decoded_landing, land_file
from ._paths import Kind, open_entry, regular_opener
from ._reading import Data, read_limited
from ._turns import cpu_turn, next_turn, soon

__all__ = [
    "EntryReport",
    "check_digest",
    "check_entry",
    "check_reply",
    "check_trusted",
    "check_trusted_digest",
    "checked_decode",
    "decode_beside",
    "decode_outcome",
    "decoded_beside",
    "decoded_in_thread",
    "decoded_value",
    "decodes_plainly",
    "opened_layout",
    "seal",
    "sealed_layout",
    "verify_file",
]

#: Verifying at least this many bytes (when nobody needs the value) runs in a worker process
#: when one is idle: msgspec holds the GIL while it decodes, so a thread would freeze the
#: caller's event loop for the whole decode, and concurrent verifications would share a core.
WORKER_VERIFY_BYTES = 512 << 10
#: Decoding more bytes than this in the caller's process pauses the cyclic GC meanwhile:
#: a full collection over a freshly decoded tree can cost more than the decode itself.
GC_PAUSE_BYTES = 64 << 10
#: From this size a decode runs in a helper thread while the caller hashes the same bytes
#: (hashing lets go of the GIL; the helper takes it meanwhile): 1 MB of short strings read
#: back and verified in 3.3 instead of 3.8 ms. (A hasher helper asked for beside a decode
#: had to be waited for until it began, which cost more than it hid below 4 MB.) A read
#: decodes from this size too, in its worker thread but after the hash (``_reads``).
DECODE_BESIDE_BYTES = 256 << 10
#: Up to this many bytes are decoded in one call even when a layout would cut them: slices,
#: the cut arrays' markers and the outer document cost more than they save (1 MB of short
#: strings: about 1.5x a whole decode), and the whole holds the GIL for a few milliseconds.
WHOLE_DECODE_BYTES = 2 << 20


@dataclass(frozen=True, slots=True)
class EntryReport:
    """One entry as ``verify`` saw it."""

    kind: Kind
    key: str
    state: Literal["found", "expired", "missing", "broken"]
    size: int
    detail: str = ""


def check_digest(data: bytes, hex_digest: str, size: int, key: bytes) -> None:
    """Raise ``ValueError`` unless ``data`` is ``size`` bytes with keyed digest ``hex_digest``."""
    # Says what failed, never facts (a size, a digest) about the bytes found on disk: they
    # may be a foreign file's, and a digest would be an oracle for the store's key.
    if len(data) != size:
        raise ValueError("the bytes read back are not as long as those written")
    if not matches(key, data, hex_digest):
        raise ValueError("the bytes read back do not match their digest")


def checked_decode(data: bytes, hex_digest: str, size: int, schema: Any, key: bytes) -> Any:
    """:func:`check_digest` then :func:`decode_exact`, the decode run beside the digest.

    Same value and the same errors, in the same order of precedence (a length or digest
    mismatch wins over a decode problem).
    """
    if len(data) != size or len(data) < DECODE_BESIDE_BYTES or not decodes_plainly(schema):
        check_digest(data, hex_digest, size, key)
        return decode_exact(data, schema)
    decoding = decode_beside(data, schema)
    found = digest_hex(key, data)
    outcome = decoding.take()
    check_digest_of(found, hex_digest)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome[0]


def decode_beside(data: bytes, schema: Any) -> Aside[tuple[Any] | Exception]:
    """``data`` being decoded against ``schema`` in a helper thread, GC paused.

    Asked for just before the caller hashes ``data``: the helper takes the GIL while the
    hash runs without it. Its outcome is ``(value,)`` or what the decode raised, which the
    caller raises only once the bytes are known to be the right ones. Only for schemas that
    :func:`decodes_plainly` (no code of the caller's may see bytes not yet checked).
    """
    return Aside(decode_outcome, data, schema, pool="decode")


def decode_outcome(data: bytes, schema: Any) -> tuple[Any] | Exception:
    """``(value,)``, or what decoding ``data`` against ``schema`` raised (GC paused)."""
    with paused_gc():  # a young collection over the fresh tree costs more than the decode
        try:
            return (decode_exact(data, schema),)
        except Exception as exc:  # raised by the caller once the digest is known to hold
            return exc


@functools.lru_cache(maxsize=256)
def decodes_plainly(schema: Any) -> bool:
    """Whether decoding against ``schema`` runs msgspec's own code only.

    Not a pydantic model, no ``__post_init__`` (structs, dataclasses, attrs), no custom
    type: code of the caller's must only ever see bytes whose digest was checked, so those
    are decoded after their check, not beside it.
    """
    if is_pydantic_schema(schema):
        return False
    try:
        root = mi.type_info(schema)
    except (TypeError, ValueError):
        return False
    for node in type_nodes(root):
        if isinstance(node, mi.CustomType | mi.ExtType):
            return False
        cls = getattr(node, "cls", None)
        if any(hasattr(cls, hook) for hook in ("__post_init__", "__attrs_post_init__")):
            return False
    return True


def check_reply(reply: dict[str, Any], hex_digest: str) -> None:
    """Raise ``ValueError`` unless a pool worker read back bytes with digest ``hex_digest``.

    Bytes that do not decode too; a length or digest mismatch wins, as in ``checked_decode``.
    """
    if reply["digest"] is None:  # not as long as written: never hashed
        raise ValueError(reply["problem"])
    check_digest_of(reply["digest"], hex_digest)
    if reply["problem"] is not None:
        raise ValueError(reply["problem"])


def check_digest_of(found_hex: str, hex_digest: str) -> None:
    """Raise ``ValueError`` unless the digest found is ``hex_digest`` (in constant time)."""
    if not hmac.compare_digest(found_hex, hex_digest):
        raise ValueError("the bytes read back do not match their digest")


def seal(secret: bytes, kind: Kind, key: str, content_hex: str) -> str:
    """What the index records as an entry's digest, and what a read trusts.

    An exact entry is named by its keyed digest, so its key is the only digest a read trusts
    and the row's copy is never consulted. A summary is named by its cache key, which says
    nothing about its bytes; its row holds HMAC-SHA256 under the store's key of (kind, key,
    keyed digest of the bytes). Rewriting a summary and its row takes that key.
    """
    if kind == "exact":
        return content_hex
    return digest_hex(secret, f"{kind}\0{key}\0{content_hex}".encode())  # HMAC-SHA256


def _layout_signer(secret: bytes, kind: Kind, key: str, recorded: str) -> Sign:
    # Bound to the entry (its name and the digest its row records, itself a seal for a
    # summary), so a sealed layout moved onto another entry does not verify; "layout" first
    # keeps these messages apart from the summary seals above.
    prefix = f"layout\0{kind}\0{key}\0{recorded}\0".encode()

    def sign(message: bytes) -> str:
        return digest_hex(secret, prefix + message)  # HMAC-SHA256, its pads hashed once

    return sign


def sealed_layout(
    secret: bytes, kind: Kind, key: str, recorded: str, layout: list[Span] | None
) -> bytes | None:
    """The writer's layout of an entry as its row keeps it, sealed with the store's key."""
    return seal_layout(layout, _layout_signer(secret, kind, key, recorded)) if layout else None


def opened_layout(
    secret: bytes, kind: Kind, key: str, recorded: str, stored: bytes | None
) -> tuple[Span, ...]:
    """A row's layout, its item counts kept only where this store's key sealed them.

    A count says which bytes an item index names; only bytes that verify are ever shown, so
    a sealed count over verified bytes is what the writer encoded.
    """
    return open_layout(stored, _layout_signer(secret, kind, key, recorded))


def check_trusted(data: Data, kind: Kind, key: str, recorded: str, secret: bytes) -> None:
    """Raise ``ValueError`` unless ``data`` is what ``key`` names (exact) or was sealed to it."""
    check_trusted_digest(digest_hex(secret, data), kind, key, recorded, secret)


def check_trusted_digest(found: str, kind: Kind, key: str, recorded: str, secret: bytes) -> None:
    """:func:`check_trusted` of bytes whose keyed digest is ``found``."""
    if kind == "exact":
        if not hmac.compare_digest(found, key):
            raise ValueError("the bytes do not hash to the reference")
    elif not hmac.compare_digest(seal(secret, kind, key, found), recorded):
        raise ValueError("the bytes are not those sealed to this key")


#: A read limit up to this much is reserved without looking at the file's size first.
_RESERVE_UNLOOKED = 16 << 20


async def read_all(
    backend: FileBackend, path: str, dir_fd: int | None = None, *, limit: int = -1
) -> bytes:
    """A regular file (at most ``limit`` bytes if not -1), opened without following links."""
    file = await backend.open(path, "rb", regular_opener(dir_fd))
    try:
        if limit < 0:
            return await file.read(-1)
        # No more than the file holds, and a byte to tell it grew: ``limit`` may come from a
        # forged index row, and a read reserves its size up front (2**40: a MemoryError). A
        # small one reserves little: no hop to look.
        if limit > _RESERVE_UNLOOKED:
            limit = min(limit, (await backend.run(os.fstat, file.fileno())).st_size + 1)
        chunks: list[bytes] = []
        while limit > 0 and (chunk := await file.read(limit)):  # short reads: read on
            chunks.append(chunk)
            limit -= len(chunk)
        return b"".join(chunks)
    finally:
        with anyio.CancelScope(shield=True):
            await file.close()


async def decoded_value(data: Data, schema: Any, spans: tuple[Span, ...]) -> Any:
    """Decode digest-checked ``data``, in slices when it is large."""
    if len(data) < GC_PAUSE_BYTES:
        return decode_exact(data, schema)
    with paused_gc():
        async with cpu_turn():
            if len(data) <= WHOLE_DECODE_BYTES:
                return decode_exact(data, schema)
            return await decode_sliced(data, schema, spans, next_turn)


async def decoded_in_thread(
    backend: FileBackend, kind: str, data: bytes | memoryview, schema: Any, failed: ValueError
) -> Found[Any] | Broken:
    """Checked ``data`` whose decode raised ``failed``: Broken, or decoded in a thread.

    Only :class:`TooDeepError` (a deep caller's stack ran out) is retried, on a shallow one.
    """
    if isinstance(failed, TooDeepError):
        try:
            return Found(value=await backend.run(decode_exact, data, schema))
        except ValueError as exc:
            failed = exc
    return Broken(detail=f"{kind} entry does not verify: {failed}")


async def decoded_beside(
    backend: FileBackend, data: bytes, schema: Any, spans: tuple[Span, ...],
    check: Callable[[], object],
) -> Any:  # fmt: skip
    """:func:`decoded_value` while ``check()`` (a digest check) runs in a helper thread.

    For bytes decoded in slices, whose turns give the helper the GIL to start hashing (which
    then lets go of it): 10 MB of short strings hashed in 5 ms no longer before the decode.
    The check's ``ValueError`` wins over whatever the decode raised; the value is returned
    only once the check has passed. A schema that does not :func:`decodes_plainly` is
    checked first.
    """
    if not decodes_plainly(schema):
        await backend.run(check)
        return await decoded_value(data, schema, spans)
    checking = Aside(check, pool="digest")
    try:
        value = await decoded_value(data, schema, spans)
    except Exception:
        await _outcome(backend, checking)
        raise
    await _outcome(backend, checking)
    return value


async def _outcome(backend: FileBackend, aside: Aside[Any]) -> Any:
    if aside.done():
        return aside.wait()  # over: only its outcome to read, no hop
    return await backend.run(aside.wait)


async def verify_file(
    backend: FileBackend,
    path: str,
    hex_digest: str,
    size: int,
    schema: Any,
    spans: tuple[Span, ...],
    key: bytes,
    *,
    want_value: bool,
    use_worker: bool,
    land: bool = False,
) -> Any:
    """Read a fresh temp file back and verify it; its value if ``want_value``, else None.

    Large files nobody needs the value of are verified in a worker process when the schema
    can travel there. ``land``: a large file is decoded as it is read (``_landing``). Raises
    ``ValueError`` with what is wrong.
    """
    if use_worker and size >= WORKER_VERIFY_BYTES and not want_value:
        problem = await _verifiers.verify(path, hex_digest, size, schema, key, spans)
        if problem is not _pool.NOT_DONE:
            if problem is not None:
                raise ValueError(problem)
            return None
    if land and size >= _reading.HASHED_BYTES and decodes_plainly(schema):
        landing = await backend.run(land_file, path, None, size, key)
        if isinstance(landing, Landing):
            check = functools.partial(_check_landed, hex_digest, size)
            value = await decoded_landing(backend, landing, schema, spans, check)
            return _handed(value, want_value)
        data = landing  # not the size written: read here, for the checks below to refuse
    else:
        data = await read_all(backend, path)
    if len(data) <= WHOLE_DECODE_BYTES:
        await backend.run(check_digest, data, hex_digest, size, key)
        value = await decoded_value(data, schema, spans)
    else:
        check = functools.partial(check_digest, data, hex_digest, size, key)
        value = await decoded_beside(backend, data, schema, spans, check)
    return _handed(value, want_value)


def _handed(value: Any, want_value: bool) -> Any:
    """``value`` if wanted; else None, and ``value`` let go of once the caller's task yields.

    Dropped here, a large tree died in one C call on the loop's thread: 52 MB of rows whose
    schema cannot travel to a worker (defined in ``__main__``) froze the loop 95-104 ms.
    """
    if want_value:
        return value
    soon(let_go, [value])
    return None


def _check_landed(hex_digest: str, size: int, data: Data, found: str) -> None:
    """:func:`check_digest` of bytes read by a ``Landing``, whose keyed digest is ``found``."""
    if len(data) != size:
        raise ValueError("the bytes read back are not as long as those written")
    check_digest_of(found, hex_digest)


def check_entry(root: str, entry: Entry, expired: bool, secret: bytes) -> EntryReport:
    """Blocking: re-check one entry's bytes against its trusted digest (not its schema)."""
    kind, key, size = entry.kind, entry.key, entry.size
    if entry.corrupt:
        return EntryReport(kind, key, "broken", size, "its index row is corrupt")
    try:
        fd = open_entry(root, kind, key)
    except FileNotFoundError:
        return EntryReport(kind, key, "missing", size)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return EntryReport(kind, key, "broken", size, f"cannot open: {reason}")
    try:
        data = read_limited(fd, size)  # a planted huge file: one byte more than the row's size
    except OSError as exc:
        return EntryReport(kind, key, "broken", size, f"cannot read: {exc.strerror or 'OSError'}")
    finally:
        os.close(fd)
    try:
        check_trusted(data, kind, key, entry.digest, secret)
    except ValueError as exc:
        return EntryReport(kind, key, "broken", size, str(exc))
    return EntryReport(kind, key, "expired" if expired else "found", size)
