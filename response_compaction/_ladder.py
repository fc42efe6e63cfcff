"""The ladder: routes tried in order, each call bounded, classified and recorded.

``coverage="head"`` and ``"sampled"`` ask one prompt per rung, sized to the rung's context;
a context overflow gets one smaller retry on the same rung (its own attempt, ``call="retry"``).
``"full"`` maps record-aligned chunks (at most ``max_model_calls`` calls in all, a few at a
time) and reduces the part summaries that arrived; when the map phase runs out of its share
of the budget the reduce says which records no part covered (no record fits a map prompt:
one sampled prompt). Every call is one ``Attempt``;
a call cut off by ``rung_timeout_ms`` or the budget is recorded as ``timeout``. One record per
call goes to the ``response_compaction`` logger at DEBUG, without content.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import anyio
import msgspec
from msgspec import UNSET, UnsetType

from ._canonical import Span, canonical_bytes, decode_exact
from ._grounding import missing_detail, ungrounded
from ._models import Attempt, AttemptOutcome, CompactionOptions, FallbackReason
from ._profile import Profile, ProfiledValue, decode_canonical, profile_value, render_profile
from ._prompt import (
    DEFAULT_CONTEXT_TOKENS,
    MIN_PROMPT_BYTES,
    SummaryRequest,
    head_text,
    prompt_bytes,
    request_for,
    system_prompt,
)
from ._views import Chunk, View, chunks, covered_bytes, first_half, reduce_view, sampled_view

__all__ = ["LadderResult", "RungReply", "Source", "SummaryModel", "context_limit", "run_ladder"]

log = logging.getLogger("response_compaction")
log.addHandler(logging.NullHandler())  # a library does not print: records go nowhere unset
T = TypeVar("T")
#: Map calls in flight at once under ``coverage="full"``.
MAP_CONCURRENCY = 4
#: Values smaller than this are profiled and sampled on the event loop (about 10 ms).
INLINE_BYTES = 96_000
#: Bytes of wording around the head of a value (205 for 11-digit sizes): budgets leave room.
HEAD_WORDING = 224
#: The share of what is left of the budget the map phase may use; the reduce gets the rest.
MAP_SHARE = 0.7


class RungReply(msgspec.Struct, frozen=True, kw_only=True):
    """What one route answered. ``text`` is the JSON the model wrote when ``outcome == "ok"``.

    Token counts are ``UNSET`` when the provider did not report them as integers. ``detail``
    is a content-free cause for an error (it becomes ``Attempt.error``). ``context_overflow``
    says the prompt did not fit the route; ``shrink`` is the factor it should shrink by when
    the server said.
    """

    outcome: Literal["ok", "error", "refused", "truncated"]
    text: str | None = None
    input_tokens: int | UnsetType = UNSET
    output_tokens: int | UnsetType = UNSET
    detail: str = ""
    served_model: str | UnsetType = UNSET
    context_overflow: bool = False
    shrink: float | UnsetType = UNSET


class SummaryModel(Protocol):
    """What the summary step needs from ``harness.llm``.

    Optional, looked up when present: ``context_limit(route) -> int`` (tokens; 8192
    otherwise), ``temperature`` and ``schema_dialect`` (``"strict"`` or ``"full"``).
    """

    def routes(self, ladder: str) -> Sequence[str]:
        """The ordered model routes of ``ladder``; ``LookupError`` if there is no such ladder."""

    async def complete(self, route: str, request: SummaryRequest) -> RungReply:
        """Ask ``route`` once, with no retries of its own."""


@dataclass(frozen=True, slots=True)
class Source:
    """The canonical bytes the step may show, their array layout, and the whole size.

    ``data`` is only the head under ``coverage="head"`` (unless grounding or a fallback
    function needs the whole value).
    """

    data: bytes
    layout: Sequence[Span]
    total: int


@dataclass(slots=True)
class LadderResult:
    value: Any = None
    route: str | UnsetType = UNSET
    attempts: list[Attempt] = field(default_factory=list)
    reason: FallbackReason | UnsetType = UNSET
    covered: int | UnsetType = UNSET
    shown: int | UnsetType = UNSET
    profile: Profile | None = None


@dataclass(slots=True)
class _Run:
    model: SummaryModel
    routes: Sequence[str]
    json_schema: dict[str, Any]
    summary_schema: Any
    options: CompactionOptions[Any]
    source: Source
    result: LadderResult
    pv: ProfiledValue | None = None
    haystacks: list[bytes] = field(default_factory=list)
    calls: int = 0

    def request(self, user: str) -> SummaryRequest:
        return request_for(
            user=user,
            json_schema=self.json_schema,
            summary_schema=self.summary_schema,
            instructions=self.options.instructions,
            token_bound=self.options.token_bound,
        )

    def budget(self, route: str) -> int:
        head = self.options.coverage == "head"  # room for its wording beside shown_bytes
        return prompt_bytes(
            context_tokens=context_limit(self.model, route),
            token_bound=self.options.token_bound,
            shown_bytes=self.options.shown_bytes + (HEAD_WORDING if head else 0),
            system=system_prompt(self.options.instructions),
        )


def context_limit(model: Any, route: str) -> int:
    """The route's context in tokens, as the model says, else the default for an 8K model."""
    limit = getattr(model, "context_limit", None)
    value = limit(route) if callable(limit) else None
    return value if type(value) is int and value > 0 else DEFAULT_CONTEXT_TOKENS


def profile_source(source: Source) -> ProfiledValue:
    """Decode and profile the whole canonical value (in a worker thread)."""
    return profile_value(decode_canonical(source.data, source.layout), source.total)


async def off_loop(function: Callable[..., T], *args: Any, size: int = -1) -> T:
    """Run pure work in a worker thread, unless the value is small enough to do it here.

    Under :data:`INLINE_BYTES` the work takes a few milliseconds, less than a thread hop
    costs the loop, and it leaves no idle worker thread behind.
    """
    if size < 0:
        size = getattr(args[0], "total", INLINE_BYTES)
    if size < INLINE_BYTES:
        return function(*args)
    return await anyio.to_thread.run_sync(function, *args, abandon_on_cancel=True)


async def run_ladder(
    model: SummaryModel,
    routes: Sequence[str],
    json_schema: dict[str, Any],
    summary_schema: Any,
    options: CompactionOptions[Any],
    source: Source,
    deadline: float,
) -> LadderResult:
    """Run the ladder within ``deadline`` (anyio clock); never raises for a model failure."""
    run = _Run(model, routes, json_schema, summary_schema, options, source, LadderResult())
    reason: FallbackReason = "error"
    try:
        with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
            if options.coverage != "head" or options.grounded:
                run.pv = await off_loop(profile_source, source)
                run.result.profile = run.pv.profile
            if options.grounded and run.pv is not None:  # (grounded: profiled just above)
                run.haystacks = [source.data, render_profile(run.pv.profile, 1 << 30).encode()]
            full = options.coverage == "full" and options.max_model_calls > 1
            if full and run.pv is not None and run.pv.records is not None:
                reason = await _full(run, run.pv, deadline)
            else:
                reason = await _one_prompt(run)
    except TimeoutError:
        reason = "timeout"
    if run.result.value is None:
        run.result.reason = reason
    return run.result


async def _one_prompt(run: _Run) -> FallbackReason:
    reason: FallbackReason = "error"
    for route in run.routes:
        if run.calls >= run.options.max_model_calls:
            break
        budget = run.budget(route)
        retried = False
        with _rung_scope(run.options) as scope:
            while True:
                view = await _view(run, budget)
                outcome, reply, _ = await _ask(run, route, view, "retry" if retried else UNSET)
                if outcome == "ok":
                    return "error"  # unused: the value is set
                reason = _reason(outcome)
                factor = reply.shrink if isinstance(reply.shrink, float) else 0.5
                smaller = max(1024, int(budget * min(0.9, factor * 0.85)))  # == budget: floor
                if retried or not reply.context_overflow or smaller >= budget:
                    break
                if run.calls >= run.options.max_model_calls:
                    break
                retried, budget = True, smaller
        if scope.cancelled_caught:
            reason = "timeout"
    return reason


def _rung_scope(options: CompactionOptions[Any]) -> anyio.CancelScope:
    """``rung_timeout_ms`` around one rung (None: no bound of its own)."""
    ms = options.rung_timeout_ms
    return anyio.move_on_after(ms / 1000) if ms is not None else anyio.CancelScope()


async def _view(run: _Run, budget: int) -> View:
    source = run.source
    if run.options.coverage == "head" or run.pv is None:
        # shown_bytes is the bound unless the route's context is tighter (the budget has
        # room for the wording around the cut).
        limit = min(run.options.shown_bytes, max(0, budget - HEAD_WORDING))
        shown = source.data[: min(limit, len(source.data))]
        if len(shown) < source.total:
            shown = shown[: len(shown.decode("utf-8", "ignore").encode())]
        return View(head_text(shown, source.total), len(shown))
    if budget < run.options.shown_bytes:
        # The route's context bounds the prompt, not shown_bytes: fill three quarters of it.
        # Past the profile (exact counts) and a few dozen whole records, more records add
        # little, while a CPU server's prompt time grows faster than linearly (SmolLM2 on
        # llama.cpp: 2K tokens 16 s, 4K 39 s, 6K 69 s) and sampled views tokenize worse
        # than BYTES_PER_TOKEN (1.79 bytes per token measured on a log search).
        budget = max(MIN_PROMPT_BYTES, budget * 3 // 4)
    return await off_loop(sampled_view, run.pv, source.data, budget, size=len(source.data))


def _reason(outcome: AttemptOutcome) -> FallbackReason:
    if outcome == "ungrounded":
        return "invalid"
    if outcome == "ok":
        return "error"
    return outcome


async def _ask(
    run: _Run,
    route: str,
    view: View,
    call: Literal["retry", "map", "reduce"] | UnsetType,
    *,
    final: bool = True,
) -> tuple[AttemptOutcome, RungReply, Any]:
    """One call, recorded as one attempt. ``final`` calls set the result when they succeed."""
    run.calls += 1
    started = anyio.current_time()  # the clock budgets are kept on
    try:
        reply = await run.model.complete(route, run.request(view.text))
    except anyio.get_cancelled_exc_class():
        _record(run, Attempt(route=route, outcome="timeout", elapsed_ms=_ms(started), call=call))
        raise
    except Exception as exc:  # a custom model's failure is a failed rung, never a crash
        reply = RungReply(outcome="error", detail=type(exc).__name__)
    outcome: AttemptOutcome = reply.outcome
    error: str | UnsetType = reply.detail or UNSET if outcome == "error" else UNSET
    value = None
    if outcome == "ok":
        try:
            # msgspec or pydantic, whichever the schema is (the message may quote the reply:
            # only the class reaches the attempt); canonical JSON refuses pydantic's 1e999.
            value = decode_exact((reply.text or "").encode(), run.summary_schema)
            canonical_bytes(value)
        except Exception as exc:  # the schema's own code may raise anything (a KeyError)
            outcome, error = "invalid", type(exc).__name__
    if value is not None and final and run.options.grounded:
        size = sum(map(len, run.haystacks))  # a few KB are checked here, as off_loop's work is
        missing = await off_loop(ungrounded, value, run.options.grounded, run.haystacks, size=size)
        if missing:
            outcome, error = "ungrounded", missing_detail(missing)
    _record(
        run,
        Attempt(
            route=route,
            outcome=outcome,
            elapsed_ms=_ms(started),
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            error=error,
            served_model=reply.served_model,
            call=call,
        ),
    )
    if outcome == "ok":
        if final:
            run.result.value, run.result.route = value, route
            run.result.covered = view.covered
        shown = run.result.shown if isinstance(run.result.shown, int) else 0
        # A reduce prompt holds part summaries: its covered bytes were in the map prompts.
        run.result.shown = shown if call == "reduce" else max(view.covered, shown)
    return outcome, reply, value


def _record(run: _Run, attempt: Attempt) -> None:
    run.result.attempts.append(attempt)
    log.debug(
        "summary call: route=%s outcome=%s elapsed_ms=%d%s",
        attempt.route,
        attempt.outcome,
        attempt.elapsed_ms,
        f" error={attempt.error}" if isinstance(attempt.error, str) else "",
    )


def _ms(started: float) -> int:
    return max(0, round((anyio.current_time() - started) * 1000))


async def _full(run: _Run, pv: ProfiledValue, deadline: float) -> FallbackReason:
    """Map record-aligned chunks, then reduce what arrived, rung by rung."""
    budget = min(run.budget(r) for r in run.routes)
    if pv.profile.exact_bytes <= budget * 6 // 10:  # all of it fits one prompt, profile too
        return await _one_prompt(run)
    calls, size = run.options.max_model_calls - 1, pv.profile.exact_bytes
    if not (planned := (await off_loop(chunks, pv, budget, calls, size=size))[0]):
        return await _one_prompt(run)
    parts: dict[int, tuple[Chunk, bytes]] = {}
    reason: FallbackReason = "error"
    for route in run.routes:
        map_until = anyio.current_time() + (deadline - anyio.current_time()) * MAP_SHARE
        with anyio.move_on_after(max(0.0, map_until - anyio.current_time())):
            await _map(run, pv, route, planned, parts)
        if not parts and run.result.attempts:  # why nothing arrived: a cut share is "timeout"
            reason = _reason(run.result.attempts[-1].outcome)
        if not parts or run.calls >= run.options.max_model_calls:
            continue
        done = [parts[i] for i in sorted(parts)]
        missing = [c for i, c in enumerate(planned) if i not in parts]
        view = reduce_view(pv, done, missing, budget)
        with _rung_scope(run.options) as scope:
            outcome, _, _ = await _ask(run, route, view, "reduce")
            if outcome == "ok":
                return "error"
            reason = _reason(outcome)
        if scope.cancelled_caught:
            reason = "timeout"
    return reason


async def _map(
    run: _Run,
    pv: ProfiledValue,
    route: str,
    planned: list[Chunk],
    parts: dict[int, tuple[Chunk, bytes]],
) -> None:
    limiter = anyio.CapacityLimiter(MAP_CONCURRENCY)

    async def one(index: int, chunk: Chunk) -> None:
        async with limiter:
            with _rung_scope(run.options):
                await _map_one(run, pv, route, index, chunk, parts)

    async with anyio.create_task_group() as group:
        for index, chunk in enumerate(planned):
            if index not in parts:
                group.start_soon(one, index, chunk)


async def _map_one(
    run: _Run,
    pv: ProfiledValue,
    route: str,
    index: int,
    chunk: Chunk,
    parts: dict[int, tuple[Chunk, bytes]],
) -> None:
    """One map call, and one retry on the first half of its records after an overflow."""
    call: Literal["map", "retry"] = "map"
    while run.calls < run.options.max_model_calls - 1:  # one call is kept for the reduce
        view = View(chunk.text, covered_bytes(pv, 0, chunk.items))
        outcome, reply, value = await _ask(run, route, view, call, final=False)
        if outcome == "ok":
            parts[index] = (chunk, canonical_bytes(value))
        if call == "retry" or not reply.context_overflow or len(chunk.items) < 2:
            return
        chunk, call = first_half(pv, chunk), "retry"
