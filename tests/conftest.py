"""Shared fixtures: both anyio backends for every async test, a harness on a tmp dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import response_compaction as rc
from response_compaction._store import _commit, _indexes
from tests._store_support import store_large

# Every property test: no per-example deadline and no "too slow" health check. Examples take
# 0-20 ms; one stalled by a loaded machine (a GC pause, a preempted thread) is no failure.
settings.register_profile(
    "response_compaction", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("response_compaction")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every ``@pytest.mark.anyio`` test runs once on asyncio and once on trio."""
    return str(request.param)


@pytest.fixture(autouse=True)
def _fresh_naming_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed directory fsync (or a small put failing after its row's COMMIT) makes this
    process stop vouching for its names for good (``_commit``), so a renewal syncs instead of
    committing on the loop: one test's injected failure must not change what the tests after
    it see (it did, by order, before this)."""
    monkeypatch.setattr(_commit, "_naming_failed", [False])


@pytest.fixture(autouse=True)
def _helpers_done() -> Iterator[None]:
    """A test's batches of uses (written by a helper thread, holding ``_indexes``' lock for a
    moment) end with it: one running into the next test could send that test's small reads
    off the event loop, which some tests assert they never leave."""
    yield
    _indexes.wait_for_closes()


class FakeClock:
    """A wall clock the test moves by hand (seconds since the epoch)."""

    def __init__(self, now: float = 1_900_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def workspace(tmp_path: Path, clock: FakeClock) -> rc.LocalWorkspace:
    # A known store key, so tests can name entries (tests._store_support.hex_of) in advance.
    from tests._store_support import seed_key

    seed_key(tmp_path / "ws")
    return rc.LocalWorkspace(tmp_path / "ws", clock=clock)


@pytest.fixture
def harness(workspace: rc.LocalWorkspace) -> rc.Harness:
    return rc.Harness(fs=workspace, llm=None)


@pytest.fixture
async def large(harness: rc.Harness) -> tuple[str, Path]:
    """``LARGE`` stored (about 6 MB): its reference and its entry file (``store_large``)."""
    return await store_large(harness)
