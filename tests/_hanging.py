"""A summary model that never answers, for the sync facade's exit and Ctrl-C scripts."""

from __future__ import annotations

import threading

import anyio

from response_compaction import RungReply, SummaryRequest


class HangingModel:
    """Sets ``started`` when asked, then waits forever; sets ``cancelled`` when cancelled."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()

    def routes(self, ladder: str) -> tuple[str, ...]:
        return ("never-answers",)

    async def complete(self, route: str, request: SummaryRequest) -> RungReply:
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable")  # pragma: no cover


#: Options that send a ``big_exact(100)`` value to the model and wait for it up to 10 minutes.
HANG_OPTIONS = {"ladder": "x", "summarize_above_bytes": 100, "timeout_ms": 600000}
