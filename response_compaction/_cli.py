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
import contextlib
import importlib
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import anyio
import msgspec

from . import __version__
from ._compact import response_compact, response_compaction_read_exact
from ._demo import run as _demo_run
from ._harness import Harness, LocalWorkspace
from ._models import CompactionOptions, Found, Missing
from ._store import open_store

__all__ = ("DefaultSummary", "default_root", "main")

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_MISSING, EXIT_BROKEN = 0, 1, 2, 3, 4
#: Inputs at least this large get a progress line on stderr (when stderr is a terminal).
PROGRESS_BYTES = 4 << 20
_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in msgspec.structs.fields(CompactionOptions) if f.required is False
}


class DefaultSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The summary schema ``compact`` asks for unless ``--summary-schema`` names another."""

    overview: str
    critical_facts: list[str]


DEFAULT_FALLBACK = DefaultSummary(
    overview="The exact response was retained but not summarized; read it back by exact_ref.",
    critical_facts=[],
)


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


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which model the environment configures, or why there is none."""

    routes: tuple[str, ...]
    base_url: str | None
    api_key: str | None
    ladder: str
    why_not: str | None

    @classmethod
    def from_env(
        cls, models: Sequence[str] | None, base_url: str | None, ladder: str
    ) -> ModelConfig:
        """``--model``/``RESPONSE_COMPACTION_MODEL``, ``--base-url``/``OPENAI_BASE_URL``, key."""
        env_models = os.environ.get("RESPONSE_COMPACTION_MODEL", "")
        routes = tuple(models or [m.strip() for m in env_models.split(",") if m.strip()])
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        api_key = os.environ.get("OPENAI_API_KEY") or None
        why_not = None
        if not routes:
            why_not = "no model named: set RESPONSE_COMPACTION_MODEL or pass --model"
        elif not (api_key or base_url):
            why_not = "no endpoint: set OPENAI_API_KEY and/or OPENAI_BASE_URL (or --base-url)"
        return cls(routes, base_url, api_key, ladder, why_not)

    def describe(self) -> str:
        """One line for a human."""
        if self.why_not:
            return f"none; {self.why_not}"
        return f"{', '.join(self.routes)} at {self.base_url or 'https://api.openai.com/v1'}"

    @contextlib.asynccontextmanager
    async def catalog(self) -> AsyncIterator[Any]:
        """An ``OpenAICatalog`` on a client made (and closed) in this event loop, or None."""
        if self.why_not:
            yield None
            return
        # The one place outside _openai.py that touches the SDK: the CLI owns its client.
        import openai

        from ._openai import OpenAICatalog

        # Local OpenAI-compatible servers ignore the key, but the SDK insists on one.
        async with openai.AsyncOpenAI(
            api_key=self.api_key or "unused", base_url=self.base_url
        ) as client:
            yield OpenAICatalog(client, {self.ladder: self.routes})


# ----------------------------------------------------------------------------- helpers


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


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def _emit(value: Any) -> None:
    data = msgspec.json.encode(value)
    if sys.stdout.isatty():
        data = msgspec.json.format(data, indent=2)
    sys.stdout.buffer.write(data + b"\n")
    sys.stdout.flush()


def _note(message: str) -> None:
    print(f"response-compaction: {message}", file=sys.stderr, flush=True)


def _harness(args: argparse.Namespace, llm: Any = None) -> Harness:
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
    options: dict[str, Any] = {"fallback": args.fallback, "ladder": args.ladder}
    for key, attr in (
        ("summarize_above_bytes", "above"),
        ("instructions", "instructions"),
        ("timeout_ms", "timeout_ms"),
        ("ttl_seconds", "ttl"),
        ("max_entries", "max_entries"),
        ("token_bound", "token_bound"),
    ):
        if getattr(args, attr) is not None:
            options[key] = getattr(args, attr)
    model = ModelConfig.from_env(args.model, args.base_url, args.ladder)
    show = len(data) >= PROGRESS_BYTES and sys.stderr.isatty()
    async with model.catalog() as llm:
        with _progress(f"compacting {len(data) / 1e6:.1f} MB", show):
            compacted = await response_compact(
                _harness(args, llm), msgspec.Raw(data), args.schema, args.summary_schema, options
            )
    if compacted.receipt.fallback_reason == "no_llm":
        _note(f"no model configured, so the fallback was returned ({model.why_not})")
    _emit(compacted)
    return EXIT_OK


async def _read(args: argparse.Namespace) -> int:
    result = await response_compaction_read_exact(_harness(args), args.ref, args.schema)
    if isinstance(result, Found):
        sys.stdout.buffer.write(msgspec.json.encode(result.value, order="sorted") + b"\n")
        sys.stdout.flush()
        return EXIT_OK
    if isinstance(result, Missing):
        _note(f"missing: {args.ref} was never stored here, has expired, or was evicted")
        return EXIT_MISSING
    _note(f"broken: {result.detail}")
    return EXIT_BROKEN


async def _verify(args: argparse.Namespace) -> int:
    store = await open_store(LocalWorkspace(args.root))
    reports = await store.verify()
    counts = dict.fromkeys(("found", "expired", "missing", "broken"), 0)
    broken = []
    for report in reports:
        counts[report.state] += 1
        if report.state == "broken":
            name = f"rc1:{report.key}" if report.kind == "exact" else report.key
            broken.append({"kind": report.kind, "key": name, "detail": report.detail})
            _note(f"broken {report.kind} entry {name}: {report.detail}")
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
    from .mcp import serve_stdio  # imported here: the mcp extra is optional

    await serve_stdio(_harness(args), exact_schema=args.schema, max_bytes=args.max_bytes)
    return EXIT_OK


async def _proxy(args: argparse.Namespace) -> int:
    from ._proxy import ProxyConfig, serve_proxy  # imported here: the mcp extra is optional

    if not args.upstream:
        raise ValueError("proxy needs the upstream server's command after --: proxy -- CMD")
    options = {"fallback": DEFAULT_FALLBACK, "ladder": args.ladder}
    if args.above is not None:
        options["summarize_above_bytes"] = args.above
    model = ModelConfig.from_env(args.model, args.base_url, args.ladder)
    async with model.catalog() as llm:
        config = ProxyConfig(
            harness=_harness(args, llm),
            options=options,
            summary_schema=DefaultSummary,
            max_bytes=args.max_bytes,
            text_bytes=args.text_bytes,
        )
        await serve_proxy(args.upstream[0], args.upstream[1:], config)
    return EXIT_OK


async def _demo(args: argparse.Namespace) -> int:
    model = ModelConfig.from_env(args.model, args.base_url, "demo")
    async with model.catalog() as llm:
        return await _demo_run(args, llm, model.describe())


# ----------------------------------------------------------------------------- parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


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

    root = _Parser(add_help=False)
    root.add_argument(
        "--root",
        metavar="DIR",
        default=default_root(),
        help="workspace directory; the store lives in DIR/response-compaction-v1 "
        "(default: %(default)s)",
    )
    schema = _Parser(add_help=False)
    schema.add_argument(
        "--schema",
        metavar="MODULE:TYPE",
        type=load_type,
        default=Any,
        help="msgspec type the exact value must validate against (default: any JSON)",
    )
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

    compact = sub.add_parser(
        "compact",
        parents=[root, schema, model],
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
        type=_positive,
        help="summarize above this many bytes of canonical JSON "
        f"(default: {_DEFAULTS['summarize_above_bytes']})",
    )
    compact.add_argument("--instructions", metavar="TEXT", help="what the summary should focus on")
    compact.add_argument(
        "--ladder", metavar="NAME", default="default", help="ladder name (default: %(default)s)"
    )
    compact.add_argument(
        "--timeout-ms",
        metavar="MS",
        type=_positive,
        help=f"whole budget of the summary step (default: {_DEFAULTS['timeout_ms']})",
    )
    compact.add_argument(
        "--ttl",
        metavar="SECONDS",
        type=_positive,
        help=f"time to live of the stored value (default: {_DEFAULTS['ttl_seconds']})",
    )
    compact.add_argument(
        "--max-entries",
        metavar="N",
        type=_positive,
        help=f"LRU bound of the store (default: {_DEFAULTS['max_entries']})",
    )
    compact.add_argument(
        "--token-bound",
        metavar="N",
        type=_positive,
        help=f"most output tokens for the summary (default: {_DEFAULTS['token_bound']})",
    )

    read = sub.add_parser(
        "read",
        parents=[root, schema],
        help="print the exact value behind a reference",
        description=(
            "Print the exact value behind REF as canonical JSON. Exit 0 when found, 3 when "
            "missing (never stored, expired or evicted), 4 when broken (malformed reference, "
            "tampered or invalid bytes; the detail goes to stderr)."
        ),
    )
    read.add_argument("ref", metavar="REF", help="an exact_ref from a receipt (rc1:<64 hex>)")

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
        type=_positive,
        default=_DEFAULTS["max_entries"],
        help="keep at most N live entries of each kind (default: %(default)s)",
    )
    prune.add_argument(
        "--broken",
        action="store_true",
        help="also re-hash every entry and remove those whose bytes no longer match",
    )

    mcp = sub.add_parser(
        "mcp",
        parents=[root, schema],
        help="serve an MCP read_exact tool on stdio",
        description=(
            "Serve a Model Context Protocol server on stdin/stdout with one tool, read_exact "
            "(exact_ref, pointer, start, stop, max_bytes -> a bounded, verified part). Needs "
            "the mcp extra: pip install 'response-compaction[mcp]'."
        ),
    )
    mcp.add_argument(
        "--max-bytes",
        metavar="N",
        type=_positive,
        default=100_000,
        help="the most one reply may hold, text and structured content together "
        "(default: %(default)s)",
    )

    _add_proxy(sub, [root, model])

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
        type=_positive,
        default=100_000,
        help="how many orders to generate, about 330 bytes each (default: %(default)s)",
    )
    demo.add_argument(
        "--backend",
        choices=("asyncio", "trio"),
        default="asyncio",
        help="event loop to run on (trio must be installed) (default: %(default)s)",
    )
    return parser


def _add_proxy(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
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
        type=_positive,
        help="compact results above this many bytes "
        f"(default: {_DEFAULTS['summarize_above_bytes']})",
    )
    proxy.add_argument(
        "--ladder", metavar="NAME", default="default", help="ladder name (default: %(default)s)"
    )
    proxy.add_argument(
        "--max-bytes",
        metavar="N",
        type=_positive,
        default=100_000,
        help="cap on every read_exact reply (default: %(default)s)",
    )
    proxy.add_argument(
        "--text-bytes",
        metavar="N",
        type=_positive,
        default=16_000,
        help="cap on the text that replaces a compacted result (default: %(default)s)",
    )


_COMMANDS: dict[str, Callable[[argparse.Namespace], Awaitable[int]]] = {
    "compact": _compact,
    "read": _read,
    "verify": _verify,
    "prune": _prune,
    "mcp": _mcp,
    "proxy": _proxy,
    "demo": _demo,
}


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
    try:
        if args.command == "compact":
            args.data = _read_input(args.file)  # before the loop: reading stdin blocks
        return anyio.run(_COMMANDS[args.command], args, backend=backend)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python's exit-time flush
        # of stdout from complaining again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    except ModuleNotFoundError as exc:
        _note(str(exc))
        return EXIT_ERROR
    except (OSError, ValueError, LookupError) as exc:
        _note(f"{type(exc).__name__}: {exc}")
        return EXIT_ERROR


def _read_input(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    with open(path, "rb") as file:
        return file.read()
