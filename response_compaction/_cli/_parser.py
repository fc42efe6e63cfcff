"""The argument parser: subcommands, their options and help. No behaviour of its own."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, NoReturn, TypeAlias

import msgspec

from .. import __version__
from ._commands import DEFAULTS, EXIT_USAGE, MAX_INPUT_BYTES, DefaultSummary, default_root
from ._flags import add_budget_options, at_least_one, positive

__all__ = ("build_parser", "load_type")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# argparse names no public type for it, and it is subscriptable only for type checkers.
_Sub: TypeAlias = "argparse._SubParsersAction[_Parser]"


def load_type(spec: str) -> Any:
    """``package.module:Name`` -> the object; the working directory is importable."""
    module_name, sep, qualname = spec.partition(":")
    if not sep or not module_name or not qualname:
        raise argparse.ArgumentTypeError(f"expected module:Type, got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot load {spec!r}: {exc}") from None
    return obj


def _json_arg(text: str) -> Any:
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (``--help`` on every subcommand)."""
    parser = _Parser(
        prog="response-compaction",
        description=(
            "Keep large JSON responses exact on disk behind an opaque reference, and hand "
            "back the value, a typed summary from a model, or a fallback."
        ),
        epilog=(
            "Exit codes: 0 ok, 1 error, 2 usage, 3 missing, 4 broken. Store directory: --root, "
            f"default {default_root()} ($RESPONSE_COMPACTION_ROOT, else "
            "$XDG_CACHE_HOME/response-compaction, else ~/.cache/response-compaction)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    root, schema, model = _root_option(), _schema_option(), _model_options()
    _add_compact(sub, [root, schema, model])
    _add_read_and_mcp(sub, root, schema)
    _add_verify_and_prune(sub, root)
    _add_proxy(sub, [root, model])
    _add_demo(sub, model)
    return parser


def _root_option() -> _Parser:
    root = _Parser(add_help=False)
    root.add_argument(
        "--root",
        metavar="DIR",
        default=default_root(),
        help="workspace directory; the store lives in DIR/response-compaction-v1 "
        "(default: %(default)s)",
    )
    return root


def _schema_option() -> _Parser:
    schema = _Parser(add_help=False)
    schema.add_argument(
        "--schema",
        metavar="MODULE:TYPE",
        type=load_type,
        default=Any,
        help="msgspec type the exact value must validate against (default: any JSON)",
    )
    return schema


def _model_options() -> _Parser:
    model = _Parser(add_help=False)
    model.add_argument(
        "--model",
        action="append",
        metavar="MODEL",
        help="a model route; repeat for a ladder of fallbacks, tried in order "
        "(default: $RESPONSE_COMPACTION_MODEL, comma-separated)",
    )
    model.add_argument(
        "--base-url",
        metavar="URL",
        help="OpenAI-compatible API base URL (default: $OPENAI_BASE_URL, else OpenAI's)",
    )
    model.add_argument(
        "--temperature",
        metavar="T",
        type=_temperature,
        default=0.0,
        help="sampling temperature sent with every call, 0 to 2, or 'server' to leave it to "
        "the server (default: %(default)s: the same prompt gives the same summary)",
    )
    model.add_argument(
        "--schema-dialect",
        choices=("auto", "strict", "full"),
        default="auto",
        help="'strict' sends only what OpenAI's strict mode takes; 'full' also sends the "
        "summary schema's bounds (maxLength, maxItems, pattern...), which llama.cpp and vLLM "
        "enforce while generating; 'auto' is 'full' for a --base-url other than OpenAI's "
        "(default: %(default)s)",
    )
    return model


def _temperature(text: str) -> float | None:
    if text == "server":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 2.0:
        raise argparse.ArgumentTypeError(f"must be from 0 to 2: {value}")
    return value


def _add_compact(sub: _Sub, parents: list[_Parser]) -> None:
    compact = sub.add_parser(
        "compact",
        parents=parents,
        help="compact a JSON document; print the output and the receipt",
        description=(
            "Validate the JSON document in FILE (or stdin for '-'), store it exactly, and print "
            '{"output": {"kind": "exact"|"summarized"|"fallback", "value": ...}, "receipt": '
            "{...}}. Documents above --above bytes of canonical JSON are summarized by the "
            "model when one is configured (OPENAI_API_KEY and/or OPENAI_BASE_URL, plus --model "
            "or RESPONSE_COMPACTION_MODEL); otherwise the fallback comes back with "
            "fallback_reason no_llm."
        ),
    )
    compact.add_argument("file", metavar="FILE", help="JSON document to compact, or - for stdin")
    compact.add_argument(
        "--summary-schema",
        metavar="MODULE:TYPE",
        type=load_type,
        default=DefaultSummary,
        help="msgspec Struct the summary must fill in "
        "(default: {overview: str, critical_facts: [str]})",
    )
    compact.add_argument(
        "--fallback",
        metavar="JSON",
        type=_json_arg,
        help="value of the summary schema returned when no valid summary arrives "
        "(required with --summary-schema)",
    )
    compact.add_argument(
        "--above",
        metavar="BYTES",
        type=positive,
        help="summarize above this many bytes of canonical JSON "
        f"(default: {DEFAULTS['summarize_above_bytes']})",
    )
    compact.add_argument("--instructions", metavar="TEXT", help="what the summary should focus on")
    compact.add_argument(
        "--max-input-bytes",
        metavar="BYTES",
        type=positive,
        default=MAX_INPUT_BYTES,
        help="refuse a document larger than this, read no further (default: %(default)s)",
    )
    compact.add_argument(
        "--ladder", metavar="NAME", default="default", help="ladder name (default: %(default)s)"
    )
    add_budget_options(compact)


def _add_read_and_mcp(
    sub: _Sub,
    root: _Parser,
    schema: _Parser,
) -> None:
    read = sub.add_parser(
        "read",
        parents=[root, schema],
        help="print the exact value behind a reference",
        description=(
            "Print the exact value behind REF as canonical JSON, or with --pointer, --start, "
            "--stop or --max-bytes one bounded part of it. Exit 0 when found, 3 when "
            "missing (never stored, expired or evicted), 4 when broken (malformed reference, "
            "tampered or invalid bytes; the detail goes to stderr)."
        ),
    )
    read.add_argument("ref", metavar="REF", help="an exact_ref from a receipt (rc1:<64 hex>)")
    part = read.add_argument_group(
        "reading a part",
        "With any of these, print one bounded, verified part as JSON (pointer, value, "
        "complete, total_bytes, total_items, start, stop, next_start, outline) instead of the "
        "whole value; page on with --start NEXT_START.",
    )
    part.add_argument("--pointer", default=None, help="RFC 6901 pointer to the node to read")
    part.add_argument(
        "--start", type=positive, default=None, help="first item (or character) of the window"
    )
    part.add_argument("--stop", type=positive, default=None, help="end of the window (exclusive)")
    part.add_argument(
        "--max-bytes",
        type=positive,
        default=None,
        help="the most JSON the part may hold (default 65536, at least 256)",
    )

    mcp = sub.add_parser(
        "mcp",
        parents=[root, schema],
        help="serve an MCP read_exact tool on stdio",
        description=(
            "Serve a Model Context Protocol server on stdin/stdout with one tool, read_exact "
            "(exact_ref, pointer, start, stop, max_bytes -> one bounded, verified part). "
            "Needs the mcp extra: pip install 'response-compaction[mcp]'."
        ),
    )
    mcp.add_argument(
        "--max-bytes",
        metavar="N",
        type=positive,
        default=100_000,
        help="the most one reply may hold, text and structured content together "
        "(default: %(default)s)",
    )


def _add_proxy(sub: _Sub, parents: list[_Parser]) -> None:
    proxy = sub.add_parser(
        "proxy",
        parents=parents,
        help="serve an MCP proxy that compacts a stdio MCP server's large results",
        usage="%(prog)s [options] -- CMD [ARGS...]",
        description=(
            "Start CMD as a stdio MCP server and serve its tools on stdin/stdout. Results above "
            "--above bytes are stored exactly and replaced by a short text with the summary "
            "(or fallback) and an exact_ref; the added read_exact tool reads them back in "
            "parts of at most --max-bytes. Needs the mcp extra."
        ),
    )
    proxy.add_argument("upstream", nargs="*", metavar="CMD", help="upstream server command")
    proxy.add_argument(
        "--above",
        metavar="BYTES",
        type=positive,
        help="compact results above this many bytes "
        f"(default: {DEFAULTS['summarize_above_bytes']})",
    )
    proxy.add_argument("--instructions", metavar="TEXT", help="what summaries should focus on")
    proxy.add_argument(
        "--ladder", metavar="NAME", default="default", help="ladder name (default: %(default)s)"
    )
    add_budget_options(proxy)
    proxy.add_argument(
        "--max-bytes",
        metavar="N",
        type=positive,
        default=100_000,
        help="cap on every read_exact reply (default: %(default)s)",
    )
    proxy.add_argument(
        "--text-bytes",
        metavar="N",
        type=positive,
        default=16_000,
        help="cap on the text that replaces a compacted result (default: %(default)s)",
    )
    proxy.add_argument(
        "--pass-env",
        metavar="NAME",
        action="append",
        default=[],
        help="hand this variable on to CMD too: those configuring the proxy's own model and"
        " store (OPENAI_*, RESPONSE_COMPACTION_*) are withheld from it (repeatable)",
    )
    proxy.add_argument(
        "--read-tool",
        metavar="NAME",
        default="read_exact",
        help="the added read tool's name, if the upstream has one of its own called read_exact"
        " (default: %(default)s)",
    )


def _add_verify_and_prune(sub: _Sub, root: _Parser) -> None:
    sub.add_parser(
        "verify",
        parents=[root],
        help="re-check every stored entry against its digest",
        description=(
            "Walk the store, re-hash every entry, and print counts of found, expired, missing "
            "and broken entries. Exit 4 when anything is broken (each one named on stderr)."
        ),
    )

    prune = sub.add_parser(
        "prune",
        parents=[root],
        help="remove expired entries and those beyond the LRU bound",
        description=(
            "Remove expired entries, the least recently used entries beyond --max-entries per "
            "kind, files and temporary files left by crashed writers, and with --broken the "
            "entries verify finds broken; print what was freed."
        ),
    )
    prune.add_argument(
        "--max-entries",
        metavar="N",
        type=at_least_one,
        default=DEFAULTS["max_entries"],
        help="keep at most N live entries of each kind (default: %(default)s)",
    )
    prune.add_argument(
        "--broken",
        action="store_true",
        help="also re-hash every entry and remove those whose bytes no longer match",
    )


def _add_demo(sub: _Sub, model: _Parser) -> None:
    demo = sub.add_parser(
        "demo",
        parents=[model],
        help="compact a large generated response end to end and read it back",
        description=(
            "Generate a large typed response (deterministic), compact it on a local store "
            "(with a model when the environment configures one), print the receipt and the "
            "timings, read it back and check it is equal."
        ),
    )
    demo.add_argument(
        "--root",
        metavar="DIR",
        help="keep the store in DIR (default: a temporary directory, removed afterwards)",
    )
    demo.add_argument(
        "--orders",
        metavar="N",
        type=positive,
        default=100_000,
        help="how many orders to generate, about 330 bytes each (default: %(default)s)",
    )
    demo.add_argument(
        "--backend",
        choices=("asyncio", "trio"),
        default="asyncio",
        help="event loop to run on (trio must be installed) (default: %(default)s)",
    )
