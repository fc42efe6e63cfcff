"""Objects planted in the store (directories, sockets) never wedge it: Broken, or moved aside."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import response_compaction as rc
from response_compaction import _store
from tests._store_support import compact, entry_path, hex_of, ref_of, store_root
from tests.schemas import Exact, Row

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
A = Exact(rows=[Row(id=1, name="alpha")], total=1)
B = Exact(rows=[Row(id=2, name="bravo")], total=2)


async def read(harness: rc.Harness, value: Exact) -> rc.Found[Exact] | rc.Missing | rc.Broken:
    return await rc.response_compaction_read_exact(harness, ref_of(value), Exact)


def _plant_directory(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()
    (path / "inside").write_bytes(b"x")  # not empty: rmdir alone cannot clear it


def _plant_socket(path: Path) -> None:
    path.unlink(missing_ok=True)
    # A relative bind from the fan-out directory: the full path is beyond sun_path's limit.
    script = "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])"
    subprocess.run([sys.executable, "-c", script, path.name], cwd=path.parent, check=True)


async def test_stale_directory_in_tmp_stops_no_process(
    harness: rc.Harness, anyio_backend: str
) -> None:
    """An old directory in tmp/: a new process reads and verifies, and prune still runs."""
    await compact(harness, A)
    root = store_root(harness.fs)
    stale = root / "tmp" / "left-behind"
    stale.mkdir()
    (stale / "file").write_bytes(b"x")
    two_hours_ago = time.time() - 2 * 3600
    os.utime(stale, (two_hours_ago, two_hours_ago))
    command = [
        sys.executable,
        "-m",
        "tests._store_child",
        "read",
        str(store_root(harness.fs).parent),
    ]
    result = await anyio.run_process(
        [*command, anyio_backend, "-1", ref_of(A)], cwd=REPO, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout) == {"reads": ["Found"], "verify": ["found"]}
    store = await _store.open_store(harness.fs)
    await store.prune()
    await compact(harness, B)
    assert await read(harness, B) == rc.Found(value=B)


@pytest.mark.parametrize("plant", [_plant_directory, _plant_socket], ids=["directory", "socket"])
async def test_object_at_an_entry_path_reads_broken_and_can_be_repaired(
    harness: rc.Harness, plant: object
) -> None:
    """Planted over an entry: read and verify say Broken, remove clears it, compaction repairs."""
    await compact(harness, A)
    path = entry_path(store_root(harness.fs), hex_of(A))
    plant(path)  # type: ignore[operator]
    result = await read(harness, A)
    assert isinstance(result, rc.Broken)
    assert "not a regular file" in result.detail
    store = await _store.open_store(harness.fs)
    (report,) = await store.verify()
    assert report.state == "broken"
    await store.remove(report.kind, report.key)  # what `prune --broken` does
    assert not os.path.lexists(path)  # noqa: ASYNC240 - a test assertion, no loop to block
    await compact(harness, A)
    assert await read(harness, A) == rc.Found(value=A)


async def test_directory_at_an_entry_path_does_not_block_compaction(harness: rc.Harness) -> None:
    """A directory where a new value's entry belongs is moved aside; the value is stored."""
    await compact(harness, B)  # creates the store
    path = entry_path(store_root(harness.fs), hex_of(A))
    path.parent.mkdir(exist_ok=True, mode=0o700)
    _plant_directory(path)
    await compact(harness, A)
    assert await read(harness, A) == rc.Found(value=A)
    store = await _store.open_store(harness.fs)
    await store.prune()
    assert {report.state for report in await store.verify()} == {"found"}


_LEASE = """
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, signal.SIG_IGN)  # told of a wish to break it: kept (45 s)
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.fcntl(fd, getattr(fcntl, "F_SETLEASE", 1024), fcntl.F_WRLCK)
print("held", flush=True)
sys.stdin.read()  # held until the test closes our stdin
"""


@contextlib.contextmanager
def _lease_held(path: Path) -> Iterator[bool]:
    """A write lease on ``path`` held by another process while the block runs (False: none)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _LEASE, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        yield holder.stdout.readline() == b"held\n"
    finally:
        holder.communicate(timeout=30)


async def test_an_entry_another_process_holds_a_lease_on_is_written_afresh(
    harness: rc.Harness,
) -> None:
    """Opening it would wait for the lease's break (``EAGAIN`` with ``O_NONBLOCK``): the
    renewal, on the loop and then in the worker, takes it as nothing to renew, and the value
    is written again under its name (the rename needs no open), not refused as unstorable."""
    await compact(harness, A)
    with _lease_held(entry_path(store_root(harness.fs), hex_of(A))) as held:
        if not held:
            pytest.skip("no write lease here")  # a file system or kernel without leases
        again = await compact(harness, A)
    assert again.receipt.exact_cache == "reused"  # the row was live: only the file is new
    assert await read(harness, A) == rc.Found(value=A)
