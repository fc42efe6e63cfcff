"""``python -m response_compaction._worker``: one verification worker of the pool in ``_pool``.

Nothing in the package imports this module: it only ever runs as the worker's ``__main__``.
It reads requests from stdin and writes replies to a copy of stdout (stdout itself goes to
stderr, so whatever a schema's module prints cannot corrupt the replies). Two request kinds:
``verify`` (a fresh temporary file against its digest and schema, whole or one share of
its sliced decode) and ``part`` (a part of a stored entry, cut only from bytes whose keyed
digest checks; see ``_store._partial``).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
from collections.abc import Callable
from typing import Any

import msgspec

from ._canonical import Span
from ._described import resolve
from ._digest import digest_hex, matches
from ._part import part_of
from ._pool import receive, send
from ._slices import decode_layout, share_decodes
from ._store._aside import Aside
from ._store._partial import RAISED, on_entry
from ._store._paths import FILE_FLAGS
from ._store._reading import read_limited
from ._store._verify import (
    check_trusted,
    checked_decode,
    decode_beside,
    decode_outcome,
    decodes_plainly,
)

#: Work on a whole entry's bytes, by request kind: ``args`` in, a msgpack-encodable result out.
_WHOLE_WORK: dict[str, Callable[..., Any]] = {"part": part_of}


def _verify(request: dict[str, Any], load: Callable[[str], Any]) -> tuple[dict[str, Any], Any]:
    """The reply, and the decoded value: freed once the reply is out (``verify_path``)."""
    try:
        schema = load(request["schema"])
    except Exception as exc:  # the schema's module may raise anything while importing
        return {"error": f"cannot load the schema: {type(exc).__name__}"}, None
    path, hex_digest, size, key = (
        request["path"],
        request["digest"],
        request["size"],
        request["key"],
    )
    try:
        if "share" in request:  # one of several workers verifying one file (``_verifiers``)
            share, shares = request["share"]
            spans = decode_layout(request["layout"])
            ok, decoded = verify_share_path(
                path, hex_digest, size, schema, key, spans, share, shares
            )
            return {"ok": ok}, decoded
        if hex_digest is None:
            return _hashed(path, size, schema, key)
        problem, value = verify_path(path, hex_digest, size, schema, key)
    except OSError as exc:
        return {"error": f"cannot read the file: {exc.strerror or 'OSError'}"}, None
    return {"problem": problem}, value


def _hashed(path: str, size: int, schema: Any, key: bytes) -> tuple[dict[str, Any], Any]:
    """Read back, hash and decode a file whose digest the caller compares: (reply, value).

    The digest goes back to the caller's process only, which compares it with its own in
    constant time; it is never in an error or a receipt.
    """
    data = _read_back(path, size)
    if len(data) != size:
        return {"problem": "the bytes read back are not as long as those written",
                "digest": None}, None  # fmt: skip
    if decodes_plainly(schema):
        decoding = decode_beside(data, schema)  # decoded in a helper while this thread hashes
        found = digest_hex(key, data)
        outcome = decoding.wait()
    else:  # the schema's own code runs after the hash, as it always did
        found = digest_hex(key, data)
        outcome = decode_outcome(data, schema)
    if isinstance(outcome, ValueError):
        return {"problem": str(outcome), "digest": found}, None
    if isinstance(outcome, Exception):
        raise outcome
    return {"problem": None, "digest": found}, outcome[0]


def verify_path(
    path: str, hex_digest: str, size: int, schema: Any, key: bytes
) -> tuple[str | None, Any]:
    """In a worker process: read the file back and verify it: (what is wrong or None, value).

    The value is handed back so that the worker frees it after its reply, not before: freeing
    a decoded tree takes a fifth as long as decoding it (8 ms for 10 MB of short strings).
    ``OSError`` is left to the caller: "this worker could not do the job", not a verdict.
    """
    data = _read_back(path, size)
    try:
        return None, checked_decode(data, hex_digest, size, schema, key)
    except ValueError as exc:
        return str(exc), None


def verify_share_path(
    path: str, hex_digest: str, size: int, schema: Any, key: bytes,
    spans: tuple[Span, ...], share: int, shares: int,
) -> tuple[bool, Any]:  # fmt: skip
    """In a worker process: whether one share of the file's sliced decode vouches for it.

    True when the file holds ``size`` bytes with digest ``hex_digest`` and share ``share`` of
    its sliced decode succeeds (``_slices.share_decodes``); beside it what was decoded, for
    the worker to free after its reply. Every share checks the digest of the bytes it read
    itself. False says only that this share could not vouch for the file: a whole
    verification then says what is wrong, if anything. ``OSError`` is left to the caller,
    as in :func:`verify_path`.
    """
    data = _read_back(path, size)
    if len(data) != size:
        return False, None
    if not decodes_plainly(schema):  # code of the caller's sees only checked bytes
        if not matches(key, data, hex_digest):
            return False, None
        decoded = share_decodes(data, schema, spans, share, shares)
        return decoded is not None, decoded
    deciding = Aside(share_decodes, data, schema, spans, share, shares, pool="decode")
    intact = matches(key, data, hex_digest)  # hashing lets go of the GIL for the helper
    decoded = deciding.wait()
    return intact and decoded is not None, decoded


def _read_back(path: str, size: int) -> bytes:
    """The temp file at ``path``: at most one byte more than ``size`` (``OSError`` to the caller).

    One byte more tells that the file grew.
    """
    fd = os.open(path, os.O_RDONLY | FILE_FLAGS)
    try:
        return read_limited(fd, size)
    finally:
        os.close(fd)


def _whole(request: dict[str, Any]) -> dict[str, Any]:
    """What ``on_entry`` found, as plain data; ``error`` sends the job back to the caller."""
    keywords = request["check"]
    check = functools.partial(check_trusted, **keywords)
    work = functools.partial(_WHOLE_WORK[request["op"]], **request["args"])
    where = (request["root"], keywords["kind"], keywords["key"], request["size"])
    state, payload = on_entry(where, check, work)
    if state == "raised":
        tag = RAISED.get(type(payload))
        if tag is None:  # raised again by the caller's own thread, as it would be there
            return {"error": f"the work raised {type(payload).__name__}"}
        return {"raised": [tag, str(payload)]}
    if state == "ok":
        try:
            return {"ok": msgspec.msgpack.encode(payload)}
        except (TypeError, ValueError, OverflowError) as exc:  # e.g. an int beyond 64 bits
            return {"error": f"cannot send the result: {type(exc).__name__}"}
    return {state: payload}


def _serve() -> None:
    """The worker's loop: one request in, one reply out, until stdin closes."""
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a schema's module prints must not corrupt the replies
    load = functools.lru_cache(maxsize=64)(lambda text: resolve(msgspec.json.decode(text)))
    send(replies, {"ready": True})
    while True:
        try:
            request = receive(requests)
        except EOFError:
            return
        if request.get("op") == "verify":
            reply, value = _verify(request, load)
            send(replies, reply)
            del value  # after the reply: the caller need not wait for the tree to be freed
        else:
            send(replies, _whole(request))


if __name__ == "__main__":
    gc.disable()  # this process only decodes; decoded values hold no cycles
    # The caller went away (a forked child that started this worker and ended at once): its
    # end of the socket is closed, and there is no one to tell; a traceback would only litter
    # the caller's stderr.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        _serve()
