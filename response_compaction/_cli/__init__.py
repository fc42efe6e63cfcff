"""``response-compaction`` (also ``python -m response_compaction``): the command line.

Every subcommand delegates to the library: ``compact`` and ``read`` call the two coroutines,
``verify`` and ``prune`` call the store's own walk, ``mcp`` serves :mod:`response_compaction.mcp`.
Results go to stdout as JSON, problems to stderr. Exit codes: 0 ok, 1 error, 2 usage,
3 missing, 4 broken.

A model summarizes large inputs when the environment configures one: ``OPENAI_API_KEY``
and/or ``OPENAI_BASE_URL`` (any OpenAI-compatible server) plus a model from ``--model`` or
``RESPONSE_COMPACTION_MODEL``. Otherwise large inputs get the fallback, and stderr says why.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import anyio

from ._commands import (
    COMMANDS,
    DEFAULT_FALLBACK,
    EXIT_ERROR,
    DefaultSummary,
    default_root,
    note,
    read_input,
)
from ._parser import build_parser

__all__ = ("DefaultSummary", "build_parser", "default_root", "main")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "compact":
        if args.summary_schema is not DefaultSummary and args.fallback is None:
            parser.error("--fallback is required with --summary-schema")
        if args.fallback is None:
            args.fallback = DEFAULT_FALLBACK
    backend = getattr(args, "backend", "asyncio")
    closed = _closed_stream(args)
    if closed is not None:  # Python sets it to None: every use was an AttributeError
        note(f"OSError: standard {closed} is closed")
        return EXIT_ERROR
    try:
        if args.command == "compact":
            # Before the loop: reading stdin blocks.
            args.data = read_input(args.file, args.max_input_bytes)
        return anyio.run(COMMANDS[args.command], args, backend=backend)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python's exit-time flush
        # of stdout from complaining again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    except ModuleNotFoundError as exc:
        note(str(exc))
        return EXIT_ERROR
    except (OSError, ValueError, LookupError) as exc:
        note(f"{type(exc).__name__}: {exc}")
        return EXIT_ERROR


def _closed_stream(args: argparse.Namespace) -> str | None:
    """The standard stream ``args``' command needs that the process was started without."""
    if sys.stdout is None:
        return "output"
    reads = args.command in ("mcp", "proxy") or (args.command == "compact" and args.file == "-")
    return "input" if reads and sys.stdin is None else None
