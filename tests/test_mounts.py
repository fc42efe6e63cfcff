"""A store on a file system that may stall (NFS, FUSE...) never holds the event loop's thread.

The mount table is parsed and classified as a pure function; the real mounts of this machine
are classified too; and where ``bindfs`` and ``/dev/fuse`` are there (the test session
installs ``bindfs`` when it can), a store on a real FUSE mount is used while its daemon is
stopped: the loop goes on, and every call finishes once the daemon does.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import anyio
import pytest

import response_compaction as rc
from response_compaction._store._mounts import (
    MOUNTINFO,
    fs_type,
    hangs_by_type,
    may_hang,
    mount_of,
)
from tests._store_support import compact
from tests.schemas import Exact, Row

A = Exact(rows=[Row(id=1, name="alpha")], total=1)
B = Exact(rows=[Row(id=2, name="bravo")], total=2)

TABLE = "\n".join([
    "22 27 0:21 / /proc rw,relatime - proc proc rw",
    "27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw",
    "30 25 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw",
    "46 27 0:40 / /mnt/a\\040b rw,nosuid master:7 - fuse /src rw,user_id=0",
    "47 27 0:41 / /home rw - nfs4 server:/home rw,vers=4.2",
    "48 27 0:42 / /vol rw - btrfs /dev/sdb rw,subvolid=5",
    "49 27 8:17 / /ntfs rw - fuseblk /dev/sdb1 rw",
    "50 27 0:43 / /gcs rw - fuse.gcsfuse bucket rw",
    "51 27 0:44 / /odd rw - weirdfs none rw",
    "52 27 0:40 / /mnt/again rw - overlay overlay rw",
    "not a mount line",
    "53 27 0:45 / /broken rw no-separator-here",
])  # fmt: skip


@pytest.mark.parametrize(
    ("dev", "kind"),
    [
        ((0, 21), "proc"),
        ((254, 0), "ext4"),  # optional fields before the separator
        ((0, 27), "tmpfs"),
        ((0, 41), "nfs4"),
        ((0, 40), "overlay"),  # mounted twice: the later line wins
        ((0, 45), None),  # its line has no separator
        ((9, 9), None),  # not in the table
    ],
)
def test_the_type_is_read_from_the_device_s_line(dev: tuple[int, int], kind: str | None) -> None:
    assert fs_type(TABLE, os.makedev(*dev)) == kind


@pytest.mark.parametrize(
    ("mount_id", "found"),
    [
        (48, ("btrfs", os.makedev(0, 42))),  # a subvolume's files report other devices
        (46, ("fuse", os.makedev(0, 40))),
        (27, ("ext4", os.makedev(254, 0))),
        (53, None),  # no separator
        (99, None),
    ],
)
def test_a_mount_is_found_by_its_id(mount_id: int, found: tuple[str, int] | None) -> None:
    assert mount_of(TABLE, mount_id) == found


@pytest.mark.parametrize(
    ("kind", "dev", "hangs"),
    [
        ("ext4", (254, 0), False),
        ("xfs", (259, 1), False),
        ("tmpfs", (0, 27), False),
        ("btrfs", (0, 42), False),
        ("overlay", (0, 40), False),
        ("nfs4", (0, 41), True),
        ("nfs", (0, 41), True),
        ("cifs", (0, 41), True),
        ("9p", (0, 41), True),
        ("fuse", (0, 40), True),
        ("fuse.gcsfuse", (0, 43), True),
        ("fuseblk", (8, 17), True),  # a daemon over a disk
        ("weirdfs", (0, 44), True),  # an anonymous device of a type nobody listed
        ("weirdfs", (8, 1), False),  # a block device's
        (None, (0, 50), True),
        (None, (8, 1), False),
    ],
)
def test_remote_userspace_and_unknown_anonymous_file_systems_may_hang(
    kind: str | None, dev: tuple[int, int], hangs: bool
) -> None:
    assert hangs_by_type(kind, os.makedev(*dev)) is hangs


@pytest.mark.skipif(not os.path.exists(MOUNTINFO), reason="no mount table (not Linux)")
def test_this_machine_s_mounts_are_classified() -> None:
    assert may_hang("/proc")  # an anonymous device of no listed type
    for path in ("/", os.path.dirname(os.path.abspath(__file__))):
        kind = fs_type(Path(MOUNTINFO).read_text(), os.stat(path).st_dev)
        if kind in {"ext4", "xfs", "btrfs", "tmpfs", "overlay"}:
            assert not may_hang(path), kind
    shm = Path("/dev", "shm")  # tmpfs where present
    if shm.is_dir() and fs_type(Path(MOUNTINFO).read_text(), shm.stat().st_dev) == "tmpfs":
        assert not may_hang(str(shm))


class Fuse:
    """A bindfs mount of ``source`` at ``path``, its daemon our child, and a way to stop it."""

    def __init__(self, source: Path, path: Path) -> None:
        self.source, self.path = source, path
        # No kernel caching of names or attributes: every call reaches the daemon.
        options = "attr_timeout=0,entry_timeout=0,negative_timeout=0"
        with open(MOUNTINFO, "rb") as table:  # pollable: a mount wakes a poll for POLLPRI
            self.daemon = subprocess.Popen(["bindfs", "-f", "-o", options, str(source), str(path)])
            _wait_for_mount(table, path, self.daemon)
        self.pid = self.daemon.pid

    @contextlib.contextmanager
    def stopped(self) -> Iterator[Stall]:
        """The daemon stopped (SIGSTOP) for the block; continued by :meth:`Stall.release`.

        A watchdog thread continues it after 60 s if nothing released it: a loop frozen by a
        call into the stopped file system cannot release it, and the test then fails.
        """
        stall = Stall(self.pid)
        os.kill(self.pid, signal.SIGSTOP)
        watchdog = threading.Thread(target=stall.watch, daemon=True)
        watchdog.start()
        try:
            yield stall
        finally:
            stall.release()
            watchdog.join()

    def close(self) -> None:
        # Lazily: the library keeps the store's directories and index open (busy otherwise).
        subprocess.run(["umount", "-l", str(self.path)], check=False)
        self.daemon.send_signal(signal.SIGCONT)
        self.daemon.terminate()
        self.daemon.wait()


def _wait_for_mount(table: IO[bytes], path: Path, daemon: subprocess.Popen[bytes]) -> None:
    poll = select.poll()
    poll.register(table, select.POLLPRI)
    wanted = b" " + os.fsencode(path) + b" "
    while wanted not in table.read():
        if daemon.poll() is not None:
            raise RuntimeError("bindfs ended before it mounted")
        poll.poll(10_000)  # a mount table change, or a look again at the daemon
        table.seek(0)


class Stall:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.released = threading.Event()
        self.timed_out = False

    def watch(self) -> None:
        if not self.released.wait(60):
            self.timed_out = True
        os.kill(self.pid, signal.SIGCONT)

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def fuse(tmp_path: Path) -> Iterator[Fuse]:
    if shutil.which("bindfs") is None or not os.access("/dev/fuse", os.R_OK | os.W_OK):
        pytest.skip("needs bindfs and /dev/fuse (nox's test session installs bindfs as root)")
    (tmp_path / "source").mkdir()
    (tmp_path / "mount").mkdir()
    mount = Fuse(tmp_path / "source", tmp_path / "mount")
    try:
        yield mount
    finally:
        mount.close()


@pytest.mark.anyio
async def test_a_stopped_fuse_daemon_stalls_the_calls_not_the_loop(fuse: Fuse) -> None:
    """Reads, cache hits and new values on a stopped FUSE mount: the loop runs on meanwhile.

    Each call waits in a worker thread for the daemon; the test's own task goes on and
    continues the daemon itself. A call made on the loop's thread (the key file's ``lstat``,
    a small read, a renewal) would hold the loop until the watchdog continued the daemon.
    """
    workspace = fuse.path / "workspace"
    workspace.mkdir()
    harness = rc.Harness(fs=rc.LocalWorkspace(workspace), llm=None)
    assert may_hang(str(workspace))
    ref = (await compact(harness, A)).receipt.exact_ref
    await compact(harness, A)  # as the fast paths would serve it: a cache hit
    results: dict[str, Any] = {}

    async def read() -> None:
        results["read"] = await rc.response_compaction_read_exact(harness, ref, Exact)

    async def again(name: str, value: Exact) -> None:
        results[name] = (await compact(harness, value)).receipt.exact_cache

    with fuse.stopped() as stall:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read)
            tasks.start_soon(again, "hit", A)
            tasks.start_soon(again, "new", B)
            for _ in range(20):  # every task has gone as far as it can without the daemon
                await anyio.lowlevel.checkpoint()
            assert results == {}  # all three wait for the daemon
            stall.release()
    assert not stall.timed_out, "a call into the stopped file system held the event loop"
    assert results["read"] == rc.Found(value=A)
    assert results["hit"] == "reused"
    assert results["new"] == "stored"
