"""The floor and the peers: the same jobs done with raw msgspec, hashlib and os calls.

The floor is the least any implementation of the contract's exact path can do: encode the
canonical JSON, hash it, write it to a temporary file (looping on short writes), fsync it,
rename it into place, fsync the directory, read it back, hash it again and decode it against
the schema. It decodes with the cyclic GC paused, as the library does, so neither side pays
for a collection over a freshly built tree. It never yields to an event loop: that is what
makes it a floor for time, and the worst case for an event loop.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import msgspec

__all__ = [
    "diskcache_get",
    "diskcache_set",
    "floor_put",
    "floor_read",
    "naive_json_write",
    "paused_gc",
]

_ENCODER = msgspec.json.Encoder(order="sorted")
_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _decoder(schema: Any) -> msgspec.json.Decoder[Any]:
    decoder = _DECODERS.get(schema)
    if decoder is None:
        decoder = _DECODERS[schema] = msgspec.json.Decoder(schema)
    return decoder


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic GC off for the block (as the library does for big decodes)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as file:
            return file.readall()
    finally:
        os.close(fd)


def floor_put(value: Any, schema: Any, directory: str, name: str) -> Any:
    """Encode, hash, write, fsync, rename, fsync dir, read back, hash, decode; the value."""
    data = _ENCODER.encode(value)
    digest = hashlib.sha256(data).hexdigest()
    temp = os.path.join(directory, f"{name}.tmp")
    final = os.path.join(directory, name)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temp, final)
    dir_fd = os.open(directory, _DIR)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    del data
    return floor_read(final, digest, schema)


def floor_read(path: str, digest: str, schema: Any) -> Any:
    """Read, hash, compare and decode against ``schema``; the value."""
    data = _read_all(path)
    if hashlib.sha256(data).hexdigest() != digest:
        raise ValueError("digest mismatch")
    with paused_gc():
        return _decoder(schema).decode(data)


def naive_json_write(value: Any, path: str) -> None:
    """What a hurried caller writes: stdlib json with sorted keys, no fsync, no check."""
    text = json.dumps(msgspec.to_builtins(value), sort_keys=True, separators=(",", ":"))
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)


def diskcache_set(cache: Any, key: str, data: bytes) -> None:
    """diskcache ``Cache.set`` of the canonical bytes (stored as a file above 32 KB)."""
    cache.set(key, data)


def diskcache_get(cache: Any, key: str) -> bytes:
    """diskcache ``Cache.get`` of those bytes (no digest check, no decode)."""
    data = cache.get(key)
    if data is None:
        raise LookupError(key)
    return cast(bytes, data)
