"""``response_compact`` and ``response_compaction_read_exact``.

These coroutines are the one implementation: the sync facade, the CLI and the MCP tool all
delegate to them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar, overload

import anyio.lowlevel
import anyio.to_thread
import msgspec
from msgspec import UNSET, UnsetType

from ._canonical import Span, iter_canonical
from ._convert import convert_exact, release
from ._digest import DIGEST_PREFIX
from ._errors import HIDDEN_CONTEXT_DROPPED
from ._harness import HarnessLike
from ._ladder import Source
from ._models import (
    Broken,
    Compacted,
    CompactionOptions,
    ExactOutput,
    FallbackOutput,
    FallbackReason,
    Found,
    Missing,
    ReadResult,
    Receipt,
    SummarizedOutput,
)
from ._nulls import nulls_left_to_schema
from ._options import resolve_options
from ._prompt import Head
from ._pydantic import is_pydantic_schema
from ._raws import NodeBudgetSpentError, canonical_raws, may_hold_raw
from ._refs import MalformedRefError, exact_ref_for, parse_exact_ref
from ._refusals import first_problem, is_refusal, refused
from ._schema import strict_json_schema
from ._store import Store, Stored, open_store
from ._store._turns import cpu_turn, next_turn
from ._summary import SummaryOutcome, fallback_value, summarize

__all__ = ["response_compact", "response_compaction_read_exact"]

#: JSON text inside a value is made canonical on the loop up to this many nodes (well under a
#: millisecond), beyond that in a worker thread.
_INLINE_NODES = 2_000

E = TypeVar("E")
S = TypeVar("S")


@overload
async def response_compact(
    harness: HarnessLike,
    exact_response: object,
    exact_schema: type[E],
    summary_schema: type[S],
    options: CompactionOptions[S] | Mapping[str, Any],
) -> Compacted[E, S]: ...
@overload
async def response_compact(
    harness: HarnessLike,
    exact_response: object,
    exact_schema: object,
    summary_schema: object,
    options: CompactionOptions[Any] | Mapping[str, Any],
) -> Compacted[Any, Any]: ...
async def response_compact(
    harness: HarnessLike,
    exact_response: object,
    exact_schema: object,
    summary_schema: object,
    options: CompactionOptions[Any] | Mapping[str, Any],
) -> Compacted[Any, Any]:
    """Retain ``exact_response`` exactly, then hand back the value, a summary, or the fallback.

    The exact value is validated against ``exact_schema``, written atomically below
    ``harness.fs.workspace_temp_dir()``, read back, digest-checked and schema-validated before
    any model call. ``output.kind`` is ``"exact"`` when its canonical JSON is at most
    ``summarize_above_bytes``, else ``"summarized"`` (a schema-valid summary from the
    ``ladder``, within ``timeout_ms``) or ``"fallback"`` (the caller's fallback; the receipt
    says why). ``receipt.exact_ref`` reads the exact value back with
    :func:`response_compaction_read_exact`.

    Raises ``ValueError`` for bad options or a value that does not validate (nothing stored,
    no model call), ``LookupError`` for an unknown ladder, :class:`SchemaError` for a summary
    schema strict structured output cannot express, and :class:`StoreError` (an ``OSError``)
    when the value cannot be retained. No exception raised, nor any it was raised from,
    holds content of the response.
    """
    started = anyio.current_time()  # the clock budgets are kept on
    with HIDDEN_CONTEXT_DROPPED:
        opts = resolve_options(options, summary_schema)
        schemas = (exact_schema, summary_schema)
        return await _compact(harness, exact_response, schemas, opts, started)


async def _compact(
    harness: HarnessLike, exact_response: object, schemas: tuple[object, object],
    opts: CompactionOptions[Any], started: float,
) -> Compacted[Any, Any]:  # fmt: skip
    exact_schema, summary_schema = schemas
    llm = harness.llm
    # Checked with or without a model, so a test on llm=None refuses what production would.
    json_schema = strict_json_schema(summary_schema)
    routes = () if llm is None else tuple(llm.routes(opts.ladder))
    value, owned = await _converted(exact_response, exact_schema)
    store = await open_store(harness.fs)
    head = Head.for_options(opts, model=llm is not None)
    layout: list[Span] = []
    stored = await _store_exact(store, value, exact_schema, opts, head, layout)
    if owned is not None and stored.size > opts.summarize_above_bytes:
        await release(owned, anyio.lowlevel.checkpoint)  # not handed back: free it gradually
    exact = _ExactFacts(DIGEST_PREFIX + stored.hex_digest, stored.size, reused=stored.reused)
    if stored.size <= opts.summarize_above_bytes:
        return Compacted(output=ExactOutput(value=stored.value), receipt=exact.receipt(started))
    source = Source(data=head.data(), layout=layout, total=stored.size)
    if llm is None:
        return Compacted(
            output=FallbackOutput(value=await fallback_value(opts, summary_schema, source, None)),
            receipt=exact.receipt(started, summary_cache="none", fallback_reason="no_llm"),
        )
    outcome = await summarize(
        store=store,
        model=llm,
        routes=routes,
        json_schema=json_schema,
        summary_schema=summary_schema,
        options=opts,
        exact_digest=exact.digest,
        source=source,
    )
    output: SummarizedOutput[Any] | FallbackOutput[Any] = (
        FallbackOutput(value=await fallback_value(opts, summary_schema, source, outcome.profile))
        if outcome.value is None
        else SummarizedOutput(value=outcome.value)
    )
    return Compacted(output=output, receipt=_summary_receipt(exact, outcome, opts.ladder, started))


@overload
async def response_compaction_read_exact(
    harness: HarnessLike, exact_ref: str, exact_schema: type[E]
) -> Found[E] | Missing | Broken: ...
@overload
async def response_compaction_read_exact(
    harness: HarnessLike, exact_ref: str, exact_schema: object
) -> Found[Any] | Missing | Broken: ...
async def response_compaction_read_exact(
    harness: HarnessLike, exact_ref: str, exact_schema: object
) -> ReadResult[Any]:
    """Read an exact value back by its reference.

    ``Found(value)`` when present, unexpired, digest-matching and valid against
    ``exact_schema``; ``Missing()`` when never stored, expired or evicted; ``Broken(detail)``
    for a malformed reference, bytes that do not match the digest, or content that does not
    validate. A malformed reference never touches the filesystem. A read counts as a use.
    """
    try:
        parsed = parse_exact_ref(exact_ref)
    except MalformedRefError as error:
        return Broken(detail=str(error))
    with HIDDEN_CONTEXT_DROPPED:
        store = await open_store(harness.fs)
        return await store.get("exact", parsed.hex, exact_schema)


async def _converted(response: object, schema: object) -> tuple[Any, list[Any] | None]:
    """:func:`convert_exact` as a CPU-bound step of this event loop (see ``_store._turns``).

    32 compactions started together then take turns instead of all converting in one pass
    of the loop.
    """
    async with cpu_turn():
        value, owned = await convert_exact(response, schema, next_turn)
    return await _raws_canonical(response, value, schema), owned


async def _raws_canonical(response: object, value: Any, schema: object) -> Any:
    """``value`` with the JSON text inside it canonical (``_raws``); off the loop when big."""
    if is_pydantic_schema(schema) or not may_hold_raw(
        schema, raw_input=isinstance(response, msgspec.Raw)
    ):
        return value
    try:
        return canonical_raws(value, budget=_INLINE_NODES)
    except NodeBudgetSpentError:
        return await anyio.to_thread.run_sync(canonical_raws, value)


async def _store_exact(
    store: Store,
    value: object,
    schema: object,
    opts: CompactionOptions[Any],
    head: Head,
    layout: list[Span],
) -> Stored:
    """Write the canonical bytes (the head keeping what the model may be shown).

    Where the schema refuses ``null`` (everywhere, or everywhere but places looked at
    first: ``_nulls``), a NaN is not looked for while encoding: it is written as ``null`` and
    the read-back refuses it (nothing published); only then is the value walked, to name
    what it holds as the encoder would have.
    """
    scan_nulls = not nulls_left_to_schema(value, schema)
    try:
        return await store.put(
            "exact",
            head.watch(iter_canonical(value, layout=layout, scan_nulls=scan_nulls)),
            key=None,
            schema=schema,
            ttl_seconds=opts.ttl_seconds,
            max_entries=opts.max_entries,
            want_value_up_to=opts.summarize_above_bytes,
            layout=layout,
        )
    except ValueError as exc:
        if scan_nulls or is_refusal(exc):  # the encoder's own words
            raise
        problem = await anyio.to_thread.run_sync(first_problem, value)
        if problem is None:
            raise
        raise refused(problem) from None


class _ExactFacts:
    """What the receipt says about the exact value, whatever happens to the summary."""

    __slots__ = ("digest", "ref", "reused", "size")

    def __init__(self, digest: str, size: int, *, reused: bool) -> None:
        self.digest = digest
        self.ref = exact_ref_for(digest)
        self.size = size
        self.reused = reused

    def receipt(
        self,
        started: float,
        *,
        summary_cache: Literal["not_needed", "none"] = "not_needed",
        fallback_reason: FallbackReason | UnsetType = UNSET,
    ) -> Receipt:
        """The receipt of a call that asked no model: exact, or the ``no_llm`` fallback."""
        return Receipt(
            exact_ref=self.ref,
            exact_digest=self.digest,
            exact_bytes=self.size,
            exact_cache="reused" if self.reused else "stored",
            summary_cache=summary_cache,
            fallback_reason=fallback_reason,
            elapsed_ms=_ms(started),
        )


def _summary_receipt(
    exact: _ExactFacts, outcome: SummaryOutcome, ladder: str, started: float
) -> Receipt:
    """The receipt of a call that went to the summary step (a cache hit, a summary, or not)."""
    attempts = outcome.attempts
    return Receipt(
        exact_ref=exact.ref,
        exact_digest=exact.digest,
        exact_bytes=exact.size,
        exact_cache="reused" if exact.reused else "stored",
        summary_cache=outcome.cache,
        summary_digest=outcome.digest,
        summary_bytes=outcome.size,
        ladder=ladder,
        route=outcome.route,
        attempts=attempts if outcome.cache != "hit" else UNSET,
        fallback_reason=outcome.reason,
        shown_bytes=outcome.shown,
        covered_bytes=outcome.covered,
        input_tokens=_total(a.input_tokens for a in attempts) if attempts else UNSET,
        output_tokens=_total(a.output_tokens for a in attempts) if attempts else UNSET,
        elapsed_ms=_ms(started),
    )


def _total(counts: Iterable[int | UnsetType]) -> int | UnsetType:
    # A total is a measurement only if every attempt's count was measured.
    total = 0
    for count in counts:
        if isinstance(count, UnsetType):
            return UNSET
        total += count
    return total


def _ms(started: float) -> int:
    return max(0, round((anyio.current_time() - started) * 1000))
