"""``python -m response_compaction._worker``: one verification worker of the pool in ``_pool``.

Nothing in the package imports this module: it only ever runs as the worker's ``__main__``.
It reads requests from stdin and writes replies to a copy of stdout (stdout itself goes to
stderr, so whatever a schema's module prints cannot corrupt the replies).
"""

from __future__ import annotations

import functools
import gc
import os
import sys

import msgspec

from ._pool import receive, resolve, send
from ._store._verify import verify_path


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
        try:
            schema = load(request["schema"])
        except Exception as exc:  # the schema's module may raise anything while importing
            send(replies, {"error": f"cannot load the schema: {type(exc).__name__}"})
            continue
        try:
            problem = verify_path(
                request["path"], request["digest"], request["size"], schema, request["key"]
            )
        except OSError as exc:
            send(replies, {"error": f"cannot read the file: {exc.strerror or 'OSError'}"})
            continue
        send(replies, {"problem": problem})


if __name__ == "__main__":
    gc.disable()  # this process only decodes; decoded values hold no cycles
    _serve()
