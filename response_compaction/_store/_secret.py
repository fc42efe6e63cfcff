"""The store's sealing key: 32 random bytes in ``seal.key``, 0600, ours, made once.

It seals summary rows to their cache key (``_verify.seal``). Created in ``tmp/``, fsynced and
hard-linked into place, so a reader never sees half a key, and concurrent first opens agree.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import threading

from .._errors import UnsafeStoreError
from ._paths import FILE_FLAGS, open_dir, unlink_quietly

__all__ = ["SECRET_NAME", "load_secret"]

_lock = threading.Lock()
SECRET_NAME = "seal.key"  # noqa: S105 - a file name, not a secret
_SECRET_BYTES = 32
_secrets: dict[tuple[int, str], bytes] = {}


def load_secret(root: str) -> bytes:
    """The store's sealing key (created on first use): 32 random bytes, 0600, ours.

    It seals summary rows to their cache key (see :func:`..._verify.seal`). Created in
    ``tmp/``, fsynced and hard-linked into place, so a reader never sees half a key.
    """
    with _lock:
        cached = _secrets.get((os.getpid(), root))
    if cached is not None:
        return cached
    root_fd = open_dir(root, create=False)
    try:
        try:
            secret = _read_secret(root_fd, root)
        except FileNotFoundError:
            _create_secret(root_fd, root)
            secret = _read_secret(root_fd, root)
    finally:
        os.close(root_fd)
    with _lock:
        _secrets[(os.getpid(), root)] = secret
    return secret


def _read_secret(root_fd: int, root: str) -> bytes:
    path = os.path.join(root, SECRET_NAME)
    fd = os.open(SECRET_NAME, os.O_RDONLY | FILE_FLAGS | os.O_NONBLOCK, dir_fd=root_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise UnsafeStoreError("store key is not a private regular file of ours", path)
        secret = os.read(fd, _SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(secret) != _SECRET_BYTES:
        raise UnsafeStoreError("store key has the wrong size", path)
    return secret


def _create_secret(root_fd: int, root: str) -> None:
    tmp_fd = open_dir("tmp", create=False, dir_fd=root_fd)
    temp = f"{secrets.token_hex(12)}.key.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=tmp_fd)
        try:
            os.write(fd, secrets.token_bytes(_SECRET_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
            os.link(temp, SECRET_NAME, src_dir_fd=tmp_fd, dst_dir_fd=root_fd, follow_symlinks=False)
        os.fsync(root_fd)
    finally:
        unlink_quietly(temp, tmp_fd)
        os.close(tmp_fd)
