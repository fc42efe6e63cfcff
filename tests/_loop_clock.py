"""An event-loop clock a test moves ahead by hand, on asyncio and on trio.

Budgets (``timeout_ms``) are deadlines on the loop's clock (``anyio.current_time``). A test
that waits for a real budget to run out asserts wall time, which a loaded machine breaks.
Here the loop's clock is real time plus the jumps made so far: a test parks the library at a
hung model call, jumps past the budget, and the budget is spent without waiting for it. Time
still flows, so the HTTP client and the server behave as they do in production.
"""

from __future__ import annotations

import asyncio
from typing import Any

import trio.testing

__all__ = ["LoopClock"]


class _JumpingLoop(asyncio.SelectorEventLoop):
    """The default Linux loop, whose clock also counts the owner's jumps."""

    def __init__(self, owner: LoopClock) -> None:
        super().__init__()
        self._owner = owner

    def time(self) -> float:
        return super().time() + self._owner.jumped


class LoopClock:
    """Made for one backend; :meth:`backend` is what the ``anyio_backend`` fixture returns."""

    def __init__(self, backend: str) -> None:
        self.name = backend
        self.jumped = 0.0
        self._trio = trio.testing.MockClock(rate=1.0)  # real time, plus jump()

    def backend(self) -> tuple[str, dict[str, Any]]:
        if self.name == "trio":
            return "trio", {"clock": self._trio}
        return "asyncio", {"loop_factory": lambda: _JumpingLoop(self)}

    def jump(self, seconds: float) -> None:
        """Move the loop's clock ahead; call it from a task on the loop (timers are rechecked
        when the task next yields)."""
        self.jumped += seconds
        self._trio.jump(seconds)
