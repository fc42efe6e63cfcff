"""Whether a store's file system may leave a call waiting on the network or another process.

The fast paths of a local store do a few file calls on the event loop thread itself (the
key file's ``lstat`` on every call, small reads and cache-hit renewals, ``_hit`` and
``_reads``): on a local disk they take microseconds, and no timeout on that loop could cut
one short if it did not return. On NFS, SMB, 9p or a FUSE file system a stalled server or
daemon leaves such a call waiting for as long as it stalls, with every other task of the
loop. A store there takes the worker threads for everything (the call-by-call algorithm an
injected file backend gets): slower, never a frozen loop.

Classified once per root and device, in a worker thread, from ``/proc/self/mountinfo`` (the
line of the root's mount id, from ``/proc/self/fdinfo``): a known networked or userspace type
may hang; otherwise a file system on a block device is local, as are the in-memory and
volume-managing types whose devices are anonymous (tmpfs, btrfs, ZFS, overlay); any other
anonymous device may hang. Where the table cannot be read (not Linux), the store is taken to
be local, as it always was. Overlay is taken as local whatever lies below it, and a mount
that appears over a root already in use is noticed only by the key file's ``lstat`` on the
loop, the one call that still goes there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

__all__ = ["MOUNTINFO", "fs_type", "hangs_by_type", "may_hang", "mount_of"]

MOUNTINFO = "/proc/self/mountinfo"

#: Served over a network or by a userspace daemon (``fuse.sshfs``, ``fuse.gcsfuse``... match
#: by their prefix): a call may wait on someone else for as long as they take.
_REMOTE = frozenset({
    "9p", "afs", "ceph", "cifs", "coda", "davfs", "fuse", "fuseblk", "gfs2", "glusterfs",
    "gpfs", "lustre", "ncpfs", "nfs", "nfs4", "ocfs2", "smb3", "smbfs", "virtiofs",
})  # fmt: skip
#: Local although their devices are anonymous (major 0), as a block device's are not.
_LOCAL_ANONYMOUS = frozenset({
    "bcachefs", "btrfs", "overlay", "ramfs", "tmpfs", "zfs",
})  # fmt: skip


def may_hang(path: str) -> bool:
    """Whether the file system of directory ``path`` may stall a call (blocking).

    Found by the mount id of an fd of ``path`` (``/proc/self/fdinfo``): a btrfs subvolume's
    or an overlay's files report a device of their own, which no line of the table names.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dev = os.fstat(fd).st_dev
        mount = _mount_id(fd)
    finally:
        os.close(fd)
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="replace") as table:
            text = table.read()
    except OSError:
        return False  # no table (not Linux): as before there was one
    found = None if mount is None else mount_of(text, mount)
    if found is None:
        return hangs_by_type(fs_type(text, dev), dev)
    return hangs_by_type(*found)


def _mount_id(fd: int) -> int | None:
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def hangs_by_type(kind: str | None, dev: int) -> bool:
    """Whether a file system of type ``kind`` (None: not in the table) on ``dev`` may stall."""
    if kind is None:
        return os.major(dev) == 0  # a mount the table does not list: by its device alone
    if kind in _REMOTE or kind.startswith("fuse."):
        return True
    return os.major(dev) == 0 and kind not in _LOCAL_ANONYMOUS


def mount_of(mountinfo: str, mount_id: int) -> tuple[str, int] | None:
    """The type and device ``mountinfo`` gives mount ``mount_id`` (None: no such line)."""
    wanted = str(mount_id)
    for ident, device, kind in _lines(mountinfo):
        if ident == wanted:
            try:
                major, minor = (int(n) for n in device.split(":"))
            except ValueError:
                return None
            return kind, os.makedev(major, minor)
    return None


def fs_type(mountinfo: str, dev: int) -> str | None:
    """The type ``mountinfo`` gives device ``dev``; the last mount of it wins (mounted over)."""
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    found: str | None = None
    for _, device, kind in _lines(mountinfo):
        if device == wanted:
            found = kind
    return found


def _lines(mountinfo: str) -> Iterator[tuple[str, str, str]]:
    """Mount id, ``major:minor`` and type of each line of ``mountinfo`` that parses.

    Each line of ``/proc/<pid>/mountinfo``: mount id, parent id, ``major:minor``, root, mount
    point, options, optional fields, ``-``, type, source, super options.
    """
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 7:
            continue
        try:
            kind = fields[fields.index("-", 6) + 1]
        except (ValueError, IndexError):
            continue
        if kind:
            yield fields[0], fields[2], kind
