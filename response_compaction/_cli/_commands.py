"""What each subcommand does: every one delegates to the library (coroutines or the store)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import msgspec

from .._compact import response_compact, response_compaction_read_exact
from .._harness import Harness, LocalWorkspace
from .._ladder import SummaryModel
from .._models import Broken, CompactionOptions, Found, Missing, Receipt
from .._part import Part
from .._pydantic import plain_hook
from .._read import response_compaction_read_part
from .._refs import MalformedRefError, parse_exact_ref
from .._store import open_store
from .._store._paths import ROOT_NAME
from ._model import DEFAULT_FALLBACK, DefaultSummary, ModelConfig, summary_for

__all__ = (
    "COMMANDS",
    "DEFAULTS",
    "DEFAULT_FALLBACK",
    "EXIT_BROKEN",
    "EXIT_ERROR",
    "EXIT_MISSING",
    "EXIT_OK",
    "EXIT_USAGE",
    "MAX_INPUT_BYTES",
    "DefaultSummary",
    "ModelConfig",
    "default_root",
    "note",
    "read_input",
)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_MISSING, EXIT_BROKEN = 0, 1, 2, 3, 4
#: Inputs at least this large get a progress line on stderr (when stderr is a terminal).
PROGRESS_BYTES = 4 << 20
#: The largest document ``compact`` reads unless --max-input-bytes says otherwise.
MAX_INPUT_BYTES = 1 << 30
DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in msgspec.structs.fields(CompactionOptions) if f.required is False
}


def default_root() -> str:
    """Where the CLI keeps its store unless ``--root`` says otherwise.

    ``$RESPONSE_COMPACTION_ROOT``, else ``$XDG_CACHE_HOME/response-compaction``, else
    ``~/.cache/response-compaction``.
    """
    explicit = os.environ.get("RESPONSE_COMPACTION_ROOT")
    if explicit:
        return explicit
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "response-compaction")


def _emit(value: Any) -> None:
    data = msgspec.json.encode(value, enc_hook=plain_hook)
    if sys.stdout.isatty():
        data = msgspec.json.format(data, indent=2)
    sys.stdout.buffer.write(data + b"\n")
    sys.stdout.flush()


def note(message: str) -> None:
    print(f"response-compaction: {message}", file=sys.stderr, flush=True)


def _harness(args: argparse.Namespace, llm: SummaryModel | None = None) -> Harness:
    return Harness(fs=LocalWorkspace(args.root), llm=llm)


@contextlib.contextmanager
def _progress(label: str, show: bool) -> Iterator[None]:
    """A live elapsed-time line on stderr while the body runs (a thread: the loop may be busy)."""
    if not show:
        yield
        return
    stop = threading.Event()
    started = time.perf_counter()

    def tick() -> None:
        while True:
            sys.stderr.write(f"\r\x1b[K{label} {time.perf_counter() - started:.1f} s")
            sys.stderr.flush()
            if stop.wait(0.2):
                return

    thread = threading.Thread(target=tick, name="response-compaction-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()


# ----------------------------------------------------------------------------- subcommands


async def _compact(args: argparse.Namespace) -> int:
    data: bytes = args.data
    model = ModelConfig.from_args(args, args.ladder)
    schema, fallback = summary_for(args.summary_schema, args.fallback, model.schema_dialect)
    options = _options(args, fallback)
    show = len(data) >= PROGRESS_BYTES and sys.stderr.isatty()
    async with model.catalog(args.context_tokens) as llm:
        with _progress(f"compacting {len(data) / 1e6:.1f} MB", show):
            compacted = await response_compact(
                _harness(args, llm), msgspec.Raw(data), args.schema, schema, options
            )
    if compacted.receipt.fallback_reason == "no_llm":
        note(f"no model configured, so the fallback was returned ({model.why_not})")
    _note_failures(compacted.receipt)
    _emit(compacted)
    return EXIT_OK


def _options(args: argparse.Namespace, fallback: Any) -> dict[str, Any]:
    """Compaction options from the flags ``compact`` and ``proxy`` share."""
    options: dict[str, Any] = {"fallback": fallback, "ladder": args.ladder}
    for key, attr in (
        ("summarize_above_bytes", "above"),
        ("instructions", "instructions"),
        ("timeout_ms", "timeout_ms"),
        ("ttl_seconds", "ttl"),
        ("max_entries", "max_entries"),
        ("token_bound", "token_bound"),
        ("shown_bytes", "shown_bytes"),
        ("coverage", "coverage"),
        ("rung_timeout_ms", "rung_timeout_ms"),
        ("max_model_calls", "max_model_calls"),
    ):
        if getattr(args, attr) is not None:
            options[key] = getattr(args, attr)
    if args.ground:
        options["grounded"] = tuple(args.ground)
    return options


def _note_failures(receipt: Receipt) -> None:
    """One stderr line per failed model call, and one for a fallback the model side caused."""
    for attempt in receipt.attempts or ():
        if attempt.outcome == "ok":
            continue
        call = f" {attempt.call}" if isinstance(attempt.call, str) else ""
        why = f": {attempt.error}" if isinstance(attempt.error, str) else ""
        note(f"rung {attempt.route}{call} {attempt.outcome}{why} ({attempt.elapsed_ms} ms)")
    reason = receipt.fallback_reason
    if isinstance(reason, str) and reason != "no_llm":
        note(f"the fallback was returned: {reason}")


def _no_store(args: argparse.Namespace) -> bool:
    """Whether ``--root`` holds no store, said on stderr.

    ``verify``, ``read`` and ``prune`` do not make one: a mistyped root passed ``verify``
    empty, and was created as a side effect.
    """
    if os.path.isdir(os.path.join(args.root, ROOT_NAME)):
        return False
    note(f"no store at {args.root}")
    return True


async def _read_result(args: argparse.Namespace) -> Found[Any] | Missing | Broken:
    try:
        parse_exact_ref(args.ref)  # broken as it is wherever it is read
    except MalformedRefError as exc:
        return Broken(detail=str(exc))
    if _no_store(args):
        return Missing()
    whole = all(option is None for option in (args.pointer, args.start, args.stop, args.max_bytes))
    result: Found[Any] | Missing | Broken = Found(value=None)
    if whole or args.schema is not Any:
        # As the MCP tool: a --schema is checked against the whole value before a part is cut.
        result = await response_compaction_read_exact(_harness(args), args.ref, args.schema)
    if not whole and isinstance(result, Found):
        result = await response_compaction_read_part(
            _harness(args),
            args.ref,
            pointer=args.pointer or "",
            start=args.start,
            stop=args.stop,
            max_bytes=65536 if args.max_bytes is None else args.max_bytes,
        )
    return result


async def _read(args: argparse.Namespace) -> int:
    result = await _read_result(args)
    if isinstance(result, Found):
        if isinstance(result.value, Part):
            # The part's fields, its value once (not again as a JSON string).
            shown = {k: v for k, v in msgspec.to_builtins(result.value).items() if k != "json"}
            _emit(shown)
            return EXIT_OK
        data = msgspec.json.encode(result.value, order="sorted", enc_hook=plain_hook)
        sys.stdout.buffer.write(data + b"\n")
        sys.stdout.flush()
        return EXIT_OK
    if isinstance(result, Missing):
        note(f"missing: {args.ref} was never stored here, has expired, or was evicted")
        return EXIT_MISSING
    note(f"broken: {result.detail}")
    return EXIT_BROKEN


async def _verify(args: argparse.Namespace) -> int:
    if _no_store(args):
        return EXIT_ERROR
    store = await open_store(LocalWorkspace(args.root))
    reports = await store.verify()
    counts = dict.fromkeys(("found", "expired", "missing", "broken"), 0)
    broken = []
    for report in reports:
        counts[report.state] += 1
        if report.state == "broken":
            name = f"rc1:{report.key}" if report.kind == "exact" else report.key
            broken.append({"kind": report.kind, "key": name, "detail": report.detail})
            note(f"broken {report.kind} entry {name}: {report.detail}")
    _emit({"root": store.root, **counts, "broken_entries": broken})
    return EXIT_BROKEN if broken else EXIT_OK


def _disk_usage(root: str) -> int:
    total = 0
    for sub in ("exact", "summary", "tmp"):
        for dirpath, _, files in os.walk(os.path.join(root, sub)):
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(os.path.join(dirpath, name), follow_symlinks=False).st_size
    return total


async def _prune(args: argparse.Namespace) -> int:
    if _no_store(args):
        return EXIT_ERROR
    store = await open_store(LocalWorkspace(args.root))
    before = await anyio.to_thread.run_sync(_disk_usage, store.root)
    removed = 0
    if args.broken:
        for report in await store.verify():
            if report.state == "broken":
                await store.remove(report.kind, report.key)
                removed += 1
    removed += await store.prune(args.max_entries)
    after = await anyio.to_thread.run_sync(_disk_usage, store.root)
    _emit(
        {
            "root": store.root,
            "removed": removed,
            "freed_bytes": max(0, before - after),
            "remaining": await store.counts(),
        }
    )
    return EXIT_OK


async def _mcp(args: argparse.Namespace) -> int:
    from ..mcp import serve_stdio  # imported here: the mcp extra is optional

    await serve_stdio(_harness(args), exact_schema=args.schema, max_bytes=args.max_bytes)
    return EXIT_OK


async def _proxy(args: argparse.Namespace) -> int:
    from .._proxy import ProxyConfig, serve_proxy  # imported here: the mcp extra is optional

    if not args.upstream:
        raise ValueError("proxy needs the upstream server's command after --: proxy -- CMD")
    model = ModelConfig.from_args(args, args.ladder)
    schema, fallback = summary_for(DefaultSummary, DEFAULT_FALLBACK, model.schema_dialect)
    async with model.catalog(args.context_tokens) as llm:
        config = ProxyConfig(
            harness=_harness(args, llm),
            options=_options(args, fallback),
            summary_schema=schema,
            read_tool=args.read_tool,
            max_bytes=args.max_bytes,
            text_bytes=args.text_bytes,
            pass_env=tuple(args.pass_env),
        )
        await serve_proxy(args.upstream[0], args.upstream[1:], config)
    return EXIT_OK


async def _demo(args: argparse.Namespace) -> int:
    from ._demo import run  # imported here: only the demo needs the generator and its timers

    model = ModelConfig.from_args(args, "demo")
    async with model.catalog() as llm:
        return await run(args, llm, model.describe())


COMMANDS: dict[str, Callable[[argparse.Namespace], Awaitable[int]]] = {
    "compact": _compact,
    "read": _read,
    "verify": _verify,
    "prune": _prune,
    "mcp": _mcp,
    "proxy": _proxy,
    "demo": _demo,
}


def read_input(path: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The document at ``path`` (``-``: stdin); ``ValueError`` past ``limit`` bytes."""
    # Read one byte past the limit, never more: an endless stdin must not grow memory forever.
    if path == "-":
        data = sys.stdin.buffer.read(limit + 1)
    else:
        with open(path, "rb") as file:
            data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"the document is larger than --max-input-bytes ({limit} bytes)")
    return data
