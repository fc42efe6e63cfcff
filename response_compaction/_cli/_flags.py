"""The compaction flags ``compact`` and ``proxy`` share: budgets, store bounds, coverage."""

from __future__ import annotations

import argparse

from ._commands import DEFAULTS

__all__ = ("add_budget_options", "at_least_one", "positive")


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def at_least_one(text: str) -> int:
    value = positive(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def add_budget_options(compact: argparse.ArgumentParser) -> None:
    compact.add_argument(
        "--timeout-ms",
        metavar="MS",
        type=positive,
        help=f"whole budget of the summary step (default: {DEFAULTS['timeout_ms']})",
    )
    compact.add_argument(
        "--ttl",
        metavar="SECONDS",
        type=positive,
        help=f"time to live of the stored value (default: {DEFAULTS['ttl_seconds']})",
    )
    compact.add_argument(
        "--max-entries",
        metavar="N",
        type=at_least_one,
        help=f"LRU bound of the store (default: {DEFAULTS['max_entries']})",
    )
    compact.add_argument(
        "--token-bound",
        metavar="N",
        type=positive,
        help=f"most output tokens for the summary (default: {DEFAULTS['token_bound']})",
    )
    _add_coverage_options(compact)


def _add_coverage_options(compact: argparse.ArgumentParser) -> None:
    compact.add_argument(
        "--coverage",
        choices=("head", "sampled", "full"),
        help="what the model is shown: the first bytes, the profile and records sampled "
        "across the document, or every record map-reduced "
        f"(default: {DEFAULTS['coverage']})",
    )
    compact.add_argument(
        "--shown-bytes",
        metavar="BYTES",
        type=positive,
        help="most bytes of the document in one prompt; the model's context may bound it "
        f"further (default: {DEFAULTS['shown_bytes']})",
    )
    compact.add_argument(
        "--context-tokens",
        metavar="N",
        type=positive,
        help="the model's context window in tokens; prompts are sized to fit (default: 8192)",
    )
    compact.add_argument(
        "--rung-timeout-ms",
        metavar="MS",
        type=positive,
        help="budget of one rung of the ladder (default: what is left of --timeout-ms)",
    )
    compact.add_argument(
        "--max-model-calls",
        metavar="N",
        type=positive,
        help=f"most model calls for --coverage full (default: {DEFAULTS['max_model_calls']})",
    )
    compact.add_argument(
        "--ground",
        metavar="FIELD",
        action="append",
        help="a top-level summary field whose identifiers (ids, codes, URLs, quoted names) "
        "must occur in the document or its profile, else the rung is 'ungrounded' and the "
        "ladder moves on; repeat for more fields (default: none)",
    )
