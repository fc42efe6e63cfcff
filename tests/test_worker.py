"""The verification workers: the library's own entry, never the caller's ``__main__``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest

from response_compaction import _described, _pool
from response_compaction._store._aside import MAX_THREADS, Aside
from tests.schemas import Exact, Row

REPO = Path(__file__).resolve().parent.parent

# An agent script as the README's quickstart writes it: no ``if __name__ == "__main__"``.
# Every run of its body appends a line to the marker file.
_SCRIPT = """
import sys
from typing import Annotated
import response_compaction as rc
from response_compaction import _pool
from tests.schemas import FALLBACK, Exact, Row, Summary, big_exact
import msgspec

with open(sys.argv[1], "a") as marker:
    marker.write("ran\\n")

class Local(msgspec.Struct):
    rows: list[Row]
    total: Annotated[int, msgspec.Meta(ge=0)]

OPTIONS = {"fallback": FALLBACK, "ladder": "cheap", "summarize_above_bytes": 1000}

async def main():
    harness = rc.Harness(fs=rc.LocalWorkspace(sys.argv[2]), llm=None)
    await rc.response_compact(harness, FALLBACK, Summary, Summary, OPTIONS)
    while _pool.POOL.ready_count() < 1:  # the pool starts in the background
        await SLEEP(0.01)
    # Over 2 MiB: streamed, so even a value stored alone is verified by a pool worker.
    good = await rc.response_compact(harness, big_exact(50_000), Exact, Summary, OPTIONS)
    print("good", good.receipt.exact_cache, _pool.POOL.calls)
    # An instance is taken as it is; only its canonical bytes show total=-1 breaks ge=0.
    bad = Exact(rows=big_exact(50_000).rows, total=-1)
    for schema in (Exact, Local):
        value = bad if schema is Exact else Local(rows=bad.rows, total=-1)
        try:
            await rc.response_compact(harness, value, schema, Summary, OPTIONS)
            print("accepted", schema.__name__)
        except ValueError:
            print("refused", schema.__name__)
    local = await rc.response_compact(harness, Local(rows=big_exact(50_001).rows, total=1),
                                      Local, Summary, OPTIONS)
    print("local", local.receipt.exact_cache)

RUN
"""

_RUNNERS = {
    "asyncio": ("import asyncio; SLEEP = asyncio.sleep", "asyncio.run(main())"),
    "trio": ("import trio; SLEEP = trio.sleep", "trio.run(main)"),
}


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_unguarded_main_runs_once_and_large_values_are_verified(tmp_path: Path, loop: str) -> None:
    """An unguarded asyncio.run/trio.run script compacts a large value once, never re-run by a
    worker, and a value whose bytes break the schema is refused, in the worker or the caller."""
    prelude, run = _RUNNERS[loop]
    script = tmp_path / "agent.py"
    script.write_text(prelude + "\n" + textwrap.dedent(_SCRIPT).replace("RUN", run))
    marker = tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script), str(marker), str(tmp_path / "ws")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "ran\n"
    lines = done.stdout.splitlines()
    assert lines[0] == "good stored 1"  # verified by a worker
    assert lines[1:] == ["refused Exact", "refused Local", "local stored"]


class _Nested(msgspec.Struct):
    rows: list[Row]


SCHEMAS: list[Any] = [
    Exact,
    list[Row],
    dict[str, list[int]],
    Row | None,
    Any,
    Literal["a", 1, None],
    tuple[int, ...],
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=repr)
def test_schemas_travel_by_reference(schema: Any) -> None:
    """Module-level types and generics over them are described and resolved to equal schemas."""
    described = _described.describe(schema)
    assert described is not None
    assert _described.resolve(msgspec.json.decode(msgspec.json.encode(described))) == schema


def test_schemas_in_main_or_functions_are_verified_by_the_caller() -> None:
    """A schema in ``__main__`` or a function has no description: never imported by a worker."""

    class Inner(msgspec.Struct):
        a: int

    main_type = type("Main", (msgspec.Struct,), {"__module__": "__main__"})
    assert _described.describe(Inner) is None
    assert _described.describe(main_type) is None
    assert _described.describe(list[Inner]) is None
    with pytest.raises(LookupError):
        _described.resolve(["ref", "__main__", "Main"])


def test_a_factory_made_schema_under_another_object_s_name_is_verified_by_the_caller() -> None:
    """``defstruct("Row", module=...)`` is not what that module's ``Row`` names: a worker
    importing the name would check the bytes against the module's ``Row`` instead."""
    impostor = msgspec.defstruct("Row", [("id", str)], module=Row.__module__)
    assert (impostor.__module__, impostor.__qualname__) == (Row.__module__, Row.__qualname__)
    assert _described.describe(impostor) is None
    assert _described.describe(list[impostor]) is None  # type: ignore[valid-type]
    assert _described.describe(Row) == ["ref", Row.__module__, "Row"]


_PLANTED = """
import pathlib
pathlib.Path("imported-by").write_text("a process with its working directory on sys.path")
raise ImportError("planted")
"""

_STARTS_WORKERS = """
from response_compaction import _pool
_pool.POOL.start()
assert _pool.POOL.wait_ready(lambda idle: idle >= 1, 60), "no worker became ready"
print("ready")
"""


def test_workers_never_import_from_the_working_directory(tmp_path: Path) -> None:
    """A ``msgspec.py`` planted where the caller runs (an agent's project directory) is not
    imported by the workers: the caller, a script elsewhere, never had that directory on its
    path either."""
    (tmp_path / "msgspec.py").write_text(_PLANTED)
    script = tmp_path / "app" / "main.py"
    script.parent.mkdir()
    script.write_text(_STARTS_WORKERS)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "ready\n"), done.stderr
    assert not (tmp_path / "imported-by").exists()


# The same kind of script, reading a part of a large entry stored without a layout (a plain
# dict under schema ``Any``): the part is cut by a pool worker, never by a process that
# imports this script again.
_PART_SCRIPT = """
import os
from typing import Any
import msgspec
import response_compaction as rc
from response_compaction import _pool
from response_compaction._part import part_of
from tests.schemas import FALLBACK, Summary

# Paths from the script's own place, not argv: a process that re-runs this file (as
# multiprocessing-style workers do) has other arguments, and must still leave its mark.
HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "marker"), "a") as marker:
    marker.write("ran\\n")

ROWS = [{"id": i, "name": "n" * 40, "tags": ["a", "b"]} for i in range(150_000)]
OPTIONS = {"fallback": FALLBACK, "ladder": "cheap"}

async def main():
    harness = rc.Harness(fs=rc.LocalWorkspace(os.path.join(HERE, "ws")), llm=None)
    value = {"rows": ROWS, "total": len(ROWS)}
    ref = (await rc.response_compact(harness, value, Any, Summary, OPTIONS)).receipt.exact_ref
    while _pool.POOL.ready_count() < 1:  # the pool starts in the background
        await SLEEP(0.01)
    calls = _pool.POOL.calls
    got = await rc.response_compaction_read_part(
        harness, ref, pointer="/rows", start=149_998, max_bytes=4096
    )
    print(len(msgspec.json.encode(value)) > 8 << 20, _pool.POOL.calls - calls)
    canonical = msgspec.json.encode(value, order="sorted")
    expected = part_of(canonical, "/rows", start=149_998, max_bytes=4096)
    print(got == rc.Found(value=expected), got.value.value == ROWS[149_998:])

RUN
"""


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_unguarded_main_runs_once_when_reading_a_part_of_a_large_entry(
    tmp_path: Path, loop: str
) -> None:
    """An unguarded script reading a part of a >= 8 MiB layout-less entry runs its body once
    and gets the right part, cut by the library's own worker."""
    prelude, run = _RUNNERS[loop]
    script = tmp_path / "agent.py"
    script.write_text(prelude + "\n" + textwrap.dedent(_PART_SCRIPT).replace("RUN", run))
    marker = tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "ran\n"
    assert done.stdout.splitlines() == ["True 1", "True True"]


def test_a_discarded_worker_is_reaped_by_a_helper_not_by_its_caller() -> None:
    """``discard`` kills the worker and returns; waiting for its exit (tens of ms for one
    holding a large value) is a helper's job, not the event loop's."""
    pool = _pool.Pool()
    pool.start()
    try:
        assert pool.wait_ready(lambda idle: idle >= 1, 60)
        worker = pool.checkout()
        assert worker is not None
        release = threading.Event()
        busy = [Aside(release.wait, 30, pool="reap") for _ in range(MAX_THREADS)]
        pool.discard(worker)  # its reaping now waits behind the busy helpers
        assert worker.proc.returncode is None  # nobody has waited for it
        release.set()
        assert all(job.wait() for job in busy)
        assert worker.proc.wait(30) == -signal.SIGKILL
    finally:
        pool.close()


def test_a_worker_that_dies_starting_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose interpreter cannot start is dropped from the pool, not kept as one."""
    monkeypatch.setenv("PYTHONIOENCODING", "no-such-codec")  # its interpreter fails at once
    pool = _pool.Pool()
    pool.start()
    try:
        for thread in list(pool._threads):  # the starters: each gives up on its worker
            thread.join(60)
        assert (pool.worker_count(), pool.ready_count()) == (0, 0)
    finally:
        pool.close()
