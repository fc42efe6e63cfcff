"""Reads never need the index's write lock, and every wait for it honours the caller's deadline.

Real child processes hold the lock, fill the disk (``RLIMIT_FSIZE``) or see the store through
a read-only bind mount (a user namespace, where the machine allows one).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

import response_compaction as rc
from response_compaction import _store
from tests._store_support import (
    FaultyBackend,
    compact,
    ref_of,
    seed_key,
    store_root,
    with_backend,
)
from tests.schemas import Exact, Row

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
A = Exact(rows=[Row(id=1, name="alpha")], total=1)
B = Exact(rows=[Row(id=2, name="bravo")], total=2)


def _child(mode: str, ws: Path, backend: str, *args: object) -> list[str]:
    return [sys.executable, "-m", "tests._store_child", mode, str(ws), backend, *map(str, args)]


async def test_read_returns_found_while_another_process_holds_the_write_lock(
    tmp_path: Path, anyio_backend: str
) -> None:
    """A held write lock: reads return Found within the caller's deadline, a write obeys it."""
    ws = tmp_path / "ws"
    seed_key(ws)
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    await compact(harness, A)
    command = _child("hold", ws, anyio_backend)
    async with await anyio.open_process(command, cwd=REPO) as process:
        assert process.stdout is not None
        assert process.stdin is not None
        line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 64)
        assert line == b"locked"
        with anyio.fail_after(30):  # well under the 60 s a read waiting for the lock would take
            assert await rc.response_compaction_read_exact(harness, ref_of(A), Exact) == rc.Found(
                value=A
            )
            store = await _store.open_store(rc.LocalWorkspace(ws))
            assert [report.state for report in await store.verify()] == ["found"]
        # The write must wait for the lock, and the caller's deadline must stop the wait.
        with anyio.move_on_after(0.3) as scope:
            await compact(harness, B)
        assert scope.cancelled_caught
        await process.stdin.aclose()
        assert await process.wait() == 0
    await compact(harness, B)
    assert await rc.response_compaction_read_exact(harness, ref_of(B), Exact) == rc.Found(value=B)


async def test_reads_and_verify_work_on_a_full_disk(tmp_path: Path, anyio_backend: str) -> None:
    """With no byte writable (RLIMIT_FSIZE 0), intact entries still read Found and verify."""
    ws = tmp_path / "ws"
    seed_key(ws)
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    await compact(harness, A)
    await compact(harness, B)
    result = await anyio.run_process(
        _child("read", ws, anyio_backend, 0, ref_of(A), ref_of(B)), cwd=REPO, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout) == {"reads": ["Found", "Found"], "verify": ["found"] * 2}


def _read_only_mount_works(ws: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = f"mount --bind {ws} {ws} && mount -o remount,bind,ro {ws} && ! touch {ws}/probe"
    return subprocess.run(["unshare", "-rm", "sh", "-c", probe], check=False).returncode == 0


@pytest.mark.parametrize("older", [False, True], ids=["current", "older build"])
async def test_reads_and_verify_work_on_a_read_only_mount(
    tmp_path: Path, anyio_backend: str, older: bool
) -> None:
    """Through a read-only bind mount, intact entries read Found and verify reports them.

    Also for an index of an older build, which lacks the object created last (nobody can
    bring a read-only index up to date): the schema check refused it.
    """
    ws = tmp_path / "ws"
    seed_key(ws)
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    await compact(harness, A)
    _store._indexes.close_all()
    if older:
        index = store_root(ws) / "index.sqlite3"
        with contextlib.closing(sqlite3.connect(index, isolation_level=None)) as db:
            db.execute("DROP INDEX clocks_seen")
    if not _read_only_mount_works(ws):
        pytest.skip("no user namespaces here to make a read-only bind mount")
    child = " ".join(_child("read", ws, anyio_backend, -1, ref_of(A)))
    script = f"mount --bind {ws} {ws} && mount -o remount,bind,ro {ws} && exec {child}"
    result = await anyio.run_process(["unshare", "-rm", "sh", "-c", script], cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout) == {"reads": ["Found"], "verify": ["found"]}


async def test_disk_full_during_the_index_commit_is_a_plain_store_error(
    tmp_path: Path, anyio_backend: str
) -> None:
    """A full tmpfs at the commit: StoreError saying so, no receipt, the store still works."""
    ws = tmp_path / "ws"
    ws.mkdir()
    if not _read_only_mount_works(ws):
        pytest.skip("no user namespaces here to mount a small tmpfs")
    child = " ".join(_child("commitfull", ws, anyio_backend))
    script = f"mount -t tmpfs -o size=2m tmpfs {ws} && exec {child}"
    result = await anyio.run_process(["unshare", "-rm", "sh", "-c", script], cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    assert report["raised"] == "StoreError"
    assert report["message"].endswith("store index: OperationalError: database or disk is full")
    assert report["reads"] == ["Found", "Missing"]


def _unlink_index(root: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (root / f"index.sqlite3{suffix}").unlink(missing_ok=True)


def _replace_index(root: Path) -> None:
    fresh = root / "replacement.sqlite3"
    sqlite3.connect(fresh).close()
    fresh.chmod(0o600)
    for suffix in ("-wal", "-shm"):
        (root / f"index.sqlite3{suffix}").unlink(missing_ok=True)
    fresh.replace(root / "index.sqlite3")


@pytest.mark.parametrize("swap", [_unlink_index, _replace_index], ids=["unlinked", "replaced"])
async def test_a_receipt_after_the_index_was_swapped_is_honoured_by_other_processes(
    tmp_path: Path, anyio_backend: str, swap: object
) -> None:
    """Index removed or replaced under a running process: its next receipt reads in another."""
    ws = tmp_path / "ws"
    seed_key(ws)
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    await compact(harness, A)  # this process now holds the index open
    swap(store_root(ws))  # type: ignore[operator]
    compacted = await compact(harness, B)
    result = await anyio.run_process(
        _child("read", ws, anyio_backend, -1, compacted.receipt.exact_ref), cwd=REPO, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["reads"] == ["Found"]


async def test_an_index_swapped_inside_an_operation_fails_loudly(tmp_path: Path) -> None:
    """Swapped between open and commit: a StoreError saying so, never a receipt."""
    ws = tmp_path / "ws"
    seed_key(ws)
    harness = rc.Harness(fs=rc.LocalWorkspace(ws), llm=None)
    await compact(harness, A)

    @contextlib.contextmanager
    def swap_first(fn: object) -> Iterator[None]:
        if getattr(fn, "__name__", "") == "publish":
            _unlink_index(store_root(ws))
        yield

    swapping = with_backend(harness, FaultyBackend(in_thread=swap_first))
    with pytest.raises(rc.StoreError, match="removed or replaced"):
        await compact(swapping, B)
    compacted = await compact(harness, B)  # the next call reopens it
    assert compacted.receipt.exact_ref == ref_of(B)
    assert await rc.response_compaction_read_exact(harness, ref_of(B), Exact) == rc.Found(value=B)
