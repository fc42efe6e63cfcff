"""The summary step: ladder, budget, single flight, summary cache.

The model side is a small protocol (:class:`SummaryModel`) so any provider can plug in;
``_openai.py`` is the only module that imports openai. What the model is shown is decided in
``_prompt.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import msgspec
import sniffio
from msgspec import UNSET, UnsetType

from ._canonical import canonical_bytes
from ._errors import StoreError
from ._ladder import (
    LadderResult,
    Source,
    SummaryModel,
    context_limit,
    off_loop,
    profile_source,
    run_ladder,
)
from ._messages import content_free
from ._models import Attempt, CompactionOptions, FallbackReason, Found
from ._profile import Profile
from ._prompt import summary_key
from ._pydantic import is_pydantic_schema, pydantic_fallback_value
from ._schema import strict_json_schema
from ._store import Store

__all__ = ["SummaryOutcome", "fallback_value", "summarize"]

log = logging.getLogger("response_compaction")


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
    covered: int | UnsetType = UNSET
    shown: int | UnsetType = UNSET
    profile: Profile | None = None


def _key(
    model: SummaryModel,
    routes: Sequence[str],
    json_schema: dict[str, Any],
    options: CompactionOptions[Any],
    exact_digest: str,
    dialect: object,
) -> str:
    """The summary cache key: everything that changes what any model call is shown."""
    temperature = getattr(model, "temperature", None)
    return summary_key(
        exact_digest=exact_digest,
        summary_json_schema=json_schema,
        instructions=options.instructions,
        ladder=options.ladder,
        routes=tuple(routes),
        token_bound=options.token_bound,
        shown_bytes=options.shown_bytes,
        coverage=options.coverage,
        context_tokens=tuple(context_limit(model, r) for r in routes),
        schema_dialect=dialect if dialect in ("strict", "full") else "strict",
        temperature=temperature if isinstance(temperature, float) else None,
        max_model_calls=options.max_model_calls if options.coverage == "full" else 0,
        grounded=options.grounded,
        server=_server(model),
    )


def _server(model: SummaryModel) -> str:
    """Where ``model`` is served: an OpenAICatalog's client's base URL; else unknown ("")."""
    base_url = getattr(getattr(model, "client", None), "base_url", None)
    return str(base_url) if base_url is not None else ""


class _Flight:
    def __init__(self, deadline: float) -> None:
        self.done = anyio.Event()
        self.outcome: SummaryOutcome | None = None
        self.deadline = deadline  # the leader's: its fallback is not a longer budget's


_flights: dict[tuple[object, str, str], _Flight] = {}


def _loop_identity() -> object:
    """The running event loop, as a dict key (anyio < 4.11 has no ``current_token``)."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token()
    import asyncio  # here, not at the top: already loaded when asyncio runs; 20-30 ms otherwise

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
    source: Source,
) -> SummaryOutcome:
    """Return a cached summary, or run the ladder once per identity and cache what validates.

    Concurrent calls in one event loop with the same identity share one ladder run: the first
    becomes the leader (it reads the cache and runs the ladder), the others wait for it within
    their own ``timeout_ms`` and then read its summary from the cache as a ``hit`` (or take its
    fallback, with no attempts of their own). A follower whose budget ends first gets the
    fallback with reason ``timeout``; one with half its budget left when the leader's budget
    ended the leader's run runs the ladder itself. Caller cancellation propagates; only the
    budget ends in a fallback.
    """
    deadline = anyio.current_time() + options.timeout_ms / 1000
    dialect = getattr(model, "schema_dialect", "strict")
    key = _key(model, routes, json_schema, options, exact_digest, dialect)
    flight_key = (_loop_identity(), store.root, key)
    # No await between looking for a flight and registering one: a caller either follows a
    # leader or leads, never reads the cache in a window where the leader finishes unseen.
    while (flight := _flights.get(flight_key)) is not None:
        log.debug("summary: waiting for the ladder run in flight")
        with anyio.move_on_after(deadline - anyio.current_time()):
            await flight.done.wait()
        if not flight.done.is_set():
            return SummaryOutcome(value=None, cache="none", reason="timeout")
        outcome = flight.outcome
        own = _own_budget_left(flight, deadline, options.timeout_ms / 1000)
        if outcome is not None and outcome.value is None and not own:
            return SummaryOutcome(value=None, cache="none", reason=outcome.reason)
        # The leader stored a summary (read it as a hit), was cancelled, or ran out of a
        # budget shorter than ours: lead ourselves (or follow whoever leads now).

    flight = _flights[flight_key] = _Flight(deadline)
    try:
        cached = await store.get("summary", key, summary_schema)
        if isinstance(cached, Found):
            data = canonical_bytes(cached.value)
            outcome = SummaryOutcome(
                value=cached.value, cache="hit", digest=store.digest_of(data), size=len(data)
            )
        else:
            if dialect == "full":
                json_schema = strict_json_schema(summary_schema, "full")
            result = await run_ladder(
                model, routes, json_schema, summary_schema, options, source, deadline
            )
            outcome = await _keep(store, key, result, summary_schema, options)
        flight.outcome = outcome
        return outcome
    finally:
        del _flights[flight_key]
        flight.done.set()


def _own_budget_left(flight: _Flight, deadline: float, budget: float) -> bool:
    """Whether the leader's fallback came from its own budget ending, and half of ours is left.

    Half: callers of one budget a few ms apart each leading in turn with what little each had
    left made one model call apiece, each cut off (4 callers 50 ms apart: 4 calls).
    """
    now = anyio.current_time()
    reason = flight.outcome.reason if flight.outcome is not None else None
    return reason == "timeout" and flight.deadline <= now and deadline - now >= budget / 2


async def _keep(
    store: Store,
    key: str,
    result: LadderResult,
    summary_schema: Any,
    options: CompactionOptions[Any],
) -> SummaryOutcome:
    common: dict[str, Any] = {
        "attempts": tuple(result.attempts),
        "route": result.route,
        "covered": result.covered,
        "shown": result.shown,
        "profile": result.profile,
    }
    if result.value is None:
        log.warning(
            "summary ladder %r ended in the fallback: %s after %d calls",
            options.ladder,
            result.reason,
            len(result.attempts),
        )
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


async def fallback_value(
    options: CompactionOptions[Any],
    summary_schema: Any,
    source: Source,
    profile: Profile | None,
) -> Any:
    """The caller's fallback: the value, or what their function makes of the profile.

    The profile is computed here (in a worker thread) when the summary step has none, e.g.
    with no model or when the budget ended first. What the function returns must be a value
    of the summary schema (``ValueError`` otherwise); what it raises propagates.
    """
    fallback = options.fallback
    if not callable(fallback) or isinstance(fallback, msgspec.Struct | type):
        return fallback
    if profile is None:
        profile = (await off_loop(profile_source, source)).profile
    made = fallback(profile)
    if is_pydantic_schema(summary_schema, "summary_schema"):
        return pydantic_fallback_value(made, summary_schema)
    try:
        return msgspec.convert(
            msgspec.to_builtins(made) if isinstance(made, msgspec.Struct) else made,
            summary_schema,
        )
    except msgspec.ValidationError as exc:  # content_free: the profile holds response values
        raise ValueError(
            f"the fallback function's result is not a summary: {content_free(exc)}"
        ) from None
    except TypeError:
        raise ValueError(
            f"the fallback function's result is not a summary: a {type(made).__name__}"
        ) from None
