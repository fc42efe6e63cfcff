"""``response_compact`` and ``response_compaction_read_exact``.

These coroutines are the one implementation: the sync facade, the CLI and the MCP tool all
delegate to them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from msgspec import UNSET, UnsetType

from ._canonical import DIGEST_PREFIX, Span, iter_canonical, to_exact_value
from ._ladder import Source
from ._models import (
    Broken,
    Compacted,
    ExactOutput,
    FallbackOutput,
    Found,
    Missing,
    Receipt,
    SummarizedOutput,
)
from ._options import resolve_options
from ._prompt import Head
from ._refs import exact_ref_for, parse_exact_ref
from ._schema import strict_json_schema
from ._store import open_store
from ._summary import SummaryOutcome, fallback_value, summarize

__all__ = ["response_compact", "response_compaction_read_exact"]

_WHOLE = 1 << 62


async def response_compact(
    harness: Any,
    exact_response: Any,
    exact_schema: Any,
    summary_schema: Any,
    options: Any,
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
    when the value cannot be retained.
    """
    started = time.perf_counter()
    opts = resolve_options(options, summary_schema)
    llm = harness.llm
    routes: tuple[str, ...] = ()
    json_schema: dict[str, Any] = {}
    if llm is not None:
        routes = tuple(llm.routes(opts.ladder))
        json_schema = strict_json_schema(summary_schema)
    value = to_exact_value(exact_response, exact_schema)
    store = await open_store(harness.fs)
    # The summary step may show any part of the value (and grounding and a fallback function
    # read all of it); only a plain head coverage needs no more than its first bytes.
    whole = opts.coverage != "head" or bool(opts.grounded) or callable(opts.fallback)
    head = Head(_WHOLE if whole else opts.shown_bytes)
    layout: list[Span] = []
    stored = await store.put(
        "exact",
        head.watch(iter_canonical(value, layout=layout)),
        key=None,
        schema=exact_schema,
        ttl_seconds=opts.ttl_seconds,
        max_entries=opts.max_entries,
        want_value_up_to=opts.summarize_above_bytes,
        layout=layout,
    )
    digest = DIGEST_PREFIX + stored.hex_digest
    facts: dict[str, Any] = {
        "exact_ref": exact_ref_for(digest),
        "exact_digest": digest,
        "exact_bytes": stored.size,
        "exact_cache": "reused" if stored.reused else "stored",
    }
    if stored.size <= opts.summarize_above_bytes:
        return Compacted(
            output=ExactOutput(value=stored.value),
            receipt=Receipt(**facts, summary_cache="not_needed", elapsed_ms=_ms(started)),
        )
    source = Source(data=head.data(), layout=layout, total=stored.size)
    if llm is None:
        fallback = await fallback_value(opts, summary_schema, source, None)
        return Compacted(
            output=FallbackOutput(value=fallback),
            receipt=Receipt(
                **facts, summary_cache="none", fallback_reason="no_llm", elapsed_ms=_ms(started)
            ),
        )
    outcome = await summarize(
        store=store,
        model=llm,
        routes=routes,
        json_schema=json_schema,
        summary_schema=summary_schema,
        options=opts,
        exact_digest=digest,
        source=source,
    )
    output: SummarizedOutput[Any] | FallbackOutput[Any] = (
        FallbackOutput(value=await fallback_value(opts, summary_schema, source, outcome.profile))
        if outcome.value is None
        else SummarizedOutput(value=outcome.value)
    )
    return Compacted(
        output=output,
        receipt=Receipt(
            **facts,
            **_summary_facts(outcome),
            ladder=opts.ladder,
            shown_bytes=outcome.shown,
            covered_bytes=outcome.covered,
            elapsed_ms=_ms(started),
        ),
    )


async def response_compaction_read_exact(
    harness: Any, exact_ref: str, exact_schema: Any
) -> Found[Any] | Missing | Broken:
    """Read an exact value back by its reference.

    ``Found(value)`` when present, unexpired, digest-matching and valid against
    ``exact_schema``; ``Missing()`` when never stored, expired or evicted; ``Broken(detail)``
    for a malformed reference, bytes that do not match the digest, or content that does not
    validate. A malformed reference never touches the filesystem. A read counts as a use.
    """
    parsed = parse_exact_ref(exact_ref)
    if isinstance(parsed, str):
        return Broken(detail=parsed)
    store = await open_store(harness.fs)
    return await store.get("exact", parsed.hex, exact_schema)


def _summary_facts(outcome: SummaryOutcome) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "summary_cache": outcome.cache,
        "summary_digest": outcome.digest,
        "summary_bytes": outcome.size,
        "route": outcome.route,
        "fallback_reason": outcome.reason,
        "attempts": outcome.attempts if outcome.cache != "hit" else UNSET,
    }
    if outcome.attempts:
        facts["input_tokens"] = _total(a.input_tokens for a in outcome.attempts)
        facts["output_tokens"] = _total(a.output_tokens for a in outcome.attempts)
    return facts


def _total(counts: Iterable[int | UnsetType]) -> int | UnsetType:
    # A total is a measurement only if every attempt's count was measured.
    total = 0
    for count in counts:
        if isinstance(count, UnsetType):
            return UNSET
        total += count
    return total


def _ms(started: float) -> int:
    return max(0, round((time.perf_counter() - started) * 1000))
