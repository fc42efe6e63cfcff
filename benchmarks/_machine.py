"""What the figures were measured on: CPU, cores, RAM, the temp dir's disk, versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

__all__ = ["fsync_latency_ms", "library_source", "machine", "mount_of", "versions"]

LIBRARIES = ("response-compaction", "msgspec", "anyio", "trio", "aiofiles", "openai", "diskcache")


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except OSError:
        return ""


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _ram_gb() -> float:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024 / 1024
    return float("nan")


def mount_of(path: str) -> dict[str, str]:
    """The mount holding ``path``: device, filesystem type, mount point, mount options."""
    path = os.path.realpath(path)
    best: dict[str, str] = {}
    for line in _read("/proc/mounts").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        device, point, fstype, options = fields[:4]
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best.get("mount", "")):
            best = {"device": device, "mount": point, "fs": fstype, "options": options}
    name = os.path.basename(best.get("device", ""))
    rotational = _read(f"/sys/block/{name}/queue/rotational").strip()
    if rotational:
        best["rotational"] = rotational
    return best


def fsync_latency_ms(directory: str, count: int = 30) -> float:
    """Median time to write 4 KB to a new file and fsync it, in ms: how honest the disk is."""
    times = []
    for i in range(count):
        path = os.path.join(directory, f"fsync-probe-{i}")
        started = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, b"x" * 4096)
        os.fsync(fd)
        os.close(fd)
        times.append(time.perf_counter() - started)
        os.unlink(path)
    return statistics.median(times) * 1000


def library_source() -> str:
    """Where the measured library was imported from, and its git commit (plus local edits)."""
    import response_compaction

    where = os.path.dirname(os.path.dirname(os.path.abspath(response_compaction.__file__)))

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", where, *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--", "response_compaction").splitlines()
    except (OSError, subprocess.SubprocessError):
        return f"{where} (not a git checkout)"
    edits = f", {len(dirty)} uncommitted file(s) in response_compaction/" if dirty else ""
    return f"{where} at git {head}{edits}"


def compile_library() -> str:
    """Write the library's bytecode, as installing it does; what was found, for the header.

    An editable checkout run with ``PYTHONDONTWRITEBYTECODE`` set (this machine's sessions
    have it) compiles every module from source in each fresh process: the import took 146-254
    ms instead of 90, and every verification worker and cold-start process paid it too.
    """
    import compileall

    import response_compaction

    package = os.path.dirname(os.path.abspath(response_compaction.__file__))
    # Written whatever sys.dont_write_bytecode says; a read-only install keeps its own.
    written = compileall.compile_dir(package, quiet=2, force=False)
    flag = "PYTHONDONTWRITEBYTECODE set" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "-"
    return f"compiled ({flag})" if written else f"not all compiled ({flag})"


def versions() -> dict[str, str]:
    """Python and library versions."""
    found = {"python": f"{platform.python_implementation()} {sys.version.split()[0]}"}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def machine(tmp_root: str) -> dict[str, Any]:
    """The machine, the temp dir's filesystem (and whether /work shares it), and the kernel."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    work = "/work" if os.path.isdir("/work") else os.getcwd()
    same_disk = os.stat(tmp_root).st_dev == os.stat(work).st_dev
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "ram_gb": round(_ram_gb(), 1),
        "os": f"{platform.system()} {platform.release()}",
        "tmp_dir": tmp_root,
        "tmp_mount": mount_of(tmp_root),
        "tmp_same_device_as": {work: same_disk},
        "default_tmp": tempfile.gettempdir(),
        "fsync_4k_ms": round(fsync_latency_ms(tmp_root), 3),
    }
