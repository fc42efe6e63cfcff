"""The summary step: prompt, ladder, budget, cache, single flight.

The model side is a small protocol (:class:`SummaryModel`) so any provider can plug in;
``_openai.py`` is the only module that imports openai. What the model is shown is bounded:
the first ``shown_bytes`` of the canonical exact JSON (cut back to a UTF-8 boundary), and when
that is not all of it the prompt says so and marks the cut with a line
``[truncated: showing the first N of M bytes]``. The bound is part of the cache identity and
the receipt's ``shown_bytes`` says how many bytes went in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import anyio
import msgspec
import sniffio
from msgspec import UNSET, UnsetType

from ._canonical import canonical_bytes, decode_exact
from ._errors import StoreError
from ._models import Attempt, AttemptOutcome, CompactionOptions, FallbackReason, Found
from ._refs import summary_key
from ._schema import schema_name
from ._store import Store

__all__ = [
    "RungReply",
    "SummaryModel",
    "SummaryOutcome",
    "SummaryRequest",
    "build_request",
    "summarize",
]

_SYSTEM = (
    "You summarize a JSON document for an AI agent that cannot read all of it. Reply with one "
    "JSON object that matches the response schema exactly, and nothing else. Never invent "
    "facts that are not in the document."
)


class SummaryRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One structured completion to ask of one route."""

    system: str
    user: str
    schema_name: str
    json_schema: dict[str, Any]
    max_output_tokens: int


class RungReply(msgspec.Struct, frozen=True, kw_only=True):
    """What one route answered. ``text`` is the JSON the model wrote when ``outcome == "ok"``.

    Token counts are ``UNSET`` when the provider did not report them as integers.
    """

    outcome: Literal["ok", "error", "refused", "truncated"]
    text: str | None = None
    input_tokens: int | UnsetType = UNSET
    output_tokens: int | UnsetType = UNSET
    detail: str = ""


class SummaryModel(Protocol):
    """What the summary step needs from ``harness.llm``."""

    def routes(self, ladder: str) -> Sequence[str]:
        """The ordered model routes of ``ladder``; ``LookupError`` if there is no such ladder."""

    async def complete(self, route: str, request: SummaryRequest) -> RungReply:
        """Ask ``route`` once, with no retries of its own."""


@dataclass(frozen=True, slots=True)
class SummaryOutcome:
    """What the summary step produced, ready to go into a receipt."""

    value: Any  # the summary, or None for the fallback
    cache: Literal["hit", "stored", "none"]
    attempts: tuple[Attempt, ...] = ()
    route: str | UnsetType = UNSET
    reason: FallbackReason | UnsetType = UNSET
    digest: str | UnsetType = UNSET
    size: int | UnsetType = UNSET


def build_request(
    *,
    shown: bytes,
    total_bytes: int,
    json_schema: dict[str, Any],
    summary_schema: Any,
    instructions: str,
    token_bound: int,
) -> SummaryRequest:
    """The prompt for a document of ``total_bytes`` of which ``shown`` is the start."""
    text = shown.decode("utf-8", "ignore")  # drops a character cut in half at the end
    if len(shown) < total_bytes:
        head = (
            f"The document is {total_bytes} bytes of JSON; only its first {len(shown)} bytes "
            "are shown, so it ends mid-value. Say in your summary that it was cut."
        )
        text += f"\n[truncated: showing the first {len(shown)} of {total_bytes} bytes]"
    else:
        head = f"The document is {total_bytes} bytes of JSON, shown in full."
    system = _SYSTEM
    if instructions:
        system += "\n\nInstructions from the caller:\n" + instructions
    return SummaryRequest(
        system=system,
        user=f"{head}\n\n{text}",
        schema_name=schema_name(summary_schema),
        json_schema=json_schema,
        max_output_tokens=token_bound,
    )


@dataclass(frozen=True, slots=True)
class _LadderResult:
    value: Any
    route: str | UnsetType
    attempts: tuple[Attempt, ...]
    reason: FallbackReason | UnsetType


async def _run_ladder(
    model: SummaryModel,
    routes: Sequence[str],
    request: SummaryRequest,
    summary_schema: Any,
    deadline: float,
) -> _LadderResult:
    attempts: list[Attempt] = []
    route, started = "", 0.0
    reason: FallbackReason = "error"
    try:
        with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
            for route in routes:
                started = time.perf_counter()
                try:
                    reply = await model.complete(route, request)
                except Exception as exc:
                    reply = RungReply(outcome="error", detail=f"{type(exc).__name__}: {exc}")
                outcome: AttemptOutcome = reply.outcome
                value = None
                if outcome == "ok":
                    try:  # decode_exact: msgspec or pydantic, whichever the schema is
                        value = decode_exact((reply.text or "").encode(), summary_schema)
                    except ValueError:
                        outcome = "invalid"
                attempts.append(
                    Attempt(
                        route=route,
                        outcome=outcome,
                        elapsed_ms=_ms_since(started),
                        input_tokens=reply.input_tokens,
                        output_tokens=reply.output_tokens,
                    )
                )
                if outcome == "ok":
                    return _LadderResult(value, route, tuple(attempts), UNSET)
                reason = outcome
    except TimeoutError:
        attempts.append(Attempt(route=route, outcome="timeout", elapsed_ms=_ms_since(started)))
        return _LadderResult(None, UNSET, tuple(attempts), "timeout")
    return _LadderResult(None, UNSET, tuple(attempts), reason)


def _ms_since(started: float) -> int:
    return max(0, round((time.perf_counter() - started) * 1000))


class _Flight:
    def __init__(self) -> None:
        self.done = anyio.Event()
        self.outcome: SummaryOutcome | None = None


_flights: dict[tuple[object, str, str], _Flight] = {}


def _loop_identity() -> object:
    """The running event loop, as a dict key (anyio < 4.11 has no ``current_token``)."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token()
    return asyncio.get_running_loop()


async def summarize(
    *,
    store: Store,
    model: SummaryModel,
    routes: Sequence[str],
    json_schema: dict[str, Any],
    summary_schema: Any,
    options: CompactionOptions[Any],
    exact_digest: str,
    exact_bytes: int,
    shown: bytes,
) -> SummaryOutcome:
    """Return a cached summary, or run the ladder once per identity and cache what validates.

    Concurrent calls in one event loop with the same identity share one ladder run: the first
    becomes the leader (it reads the cache and runs the ladder), the others wait for it within
    their own ``timeout_ms`` and then read its summary from the cache as a ``hit`` (or take its
    fallback, with no attempts of their own). A follower whose budget ends first gets the
    fallback with reason ``timeout``. Caller cancellation propagates; only the budget ends in a
    fallback.
    """
    deadline = anyio.current_time() + options.timeout_ms / 1000
    key = summary_key(
        exact_digest=exact_digest,
        summary_json_schema=json_schema,
        instructions=options.instructions,
        ladder=options.ladder,
        routes=tuple(routes),
        token_bound=options.token_bound,
        shown_bytes=options.shown_bytes,
    )
    flight_key = (_loop_identity(), store.root, key)
    # No await between looking for a flight and registering one: a caller either follows a
    # leader or leads, never reads the cache in a window where the leader finishes unseen.
    while (flight := _flights.get(flight_key)) is not None:
        with anyio.move_on_after(deadline - anyio.current_time()):
            await flight.done.wait()
        if not flight.done.is_set():
            return SummaryOutcome(value=None, cache="none", reason="timeout")
        if flight.outcome is not None and flight.outcome.value is None:
            return SummaryOutcome(value=None, cache="none", reason=flight.outcome.reason)
        # The leader stored a summary (read it as a hit) or was cancelled (lead ourselves).

    flight = _flights[flight_key] = _Flight()
    try:
        cached = await store.get("summary", key, summary_schema)
        if isinstance(cached, Found):
            data = canonical_bytes(cached.value)
            outcome = SummaryOutcome(
                value=cached.value, cache="hit", digest=store.digest_of(data), size=len(data)
            )
        else:
            request = build_request(
                shown=shown,
                total_bytes=exact_bytes,
                json_schema=json_schema,
                summary_schema=summary_schema,
                instructions=options.instructions,
                token_bound=options.token_bound,
            )
            result = await _run_ladder(model, routes, request, summary_schema, deadline)
            outcome = await _keep(store, key, result, summary_schema, options)
        flight.outcome = outcome
        return outcome
    finally:
        del _flights[flight_key]
        flight.done.set()


async def _keep(
    store: Store,
    key: str,
    result: _LadderResult,
    summary_schema: Any,
    options: CompactionOptions[Any],
) -> SummaryOutcome:
    common: dict[str, Any] = {"attempts": result.attempts, "route": result.route}
    if result.value is None:
        return SummaryOutcome(value=None, cache="none", reason=result.reason, **common)
    data = canonical_bytes(result.value)
    try:
        await store.put(
            "summary",
            [data],
            key=key,
            schema=summary_schema,
            ttl_seconds=options.ttl_seconds,
            max_entries=options.max_entries,
            want_value_up_to=0,
        )
    except (StoreError, ValueError):
        # The summary is valid and the exact value is safe; only the cache missed out.
        return SummaryOutcome(
            value=result.value, cache="none", digest=store.digest_of(data), size=len(data), **common
        )
    return SummaryOutcome(
        value=result.value, cache="stored", digest=store.digest_of(data), size=len(data), **common
    )
