"""What the model is shown: the cut, the request, the prompt version and the summary key.

Pure: no I/O. What the model is shown is bounded: the first ``shown_bytes`` of the canonical
exact JSON (cut back to a UTF-8 boundary), and when that is not all of it the prompt says so
and marks the cut with a line ``[truncated: showing the first N of M bytes]``. Everything that
changes what the model is shown is part of the summary cache identity (:func:`summary_key`),
and :data:`PROMPT_VERSION` sits next to the wording it versions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from ._models import CompactionOptions
from ._schema import schema_name

__all__ = [
    "BYTES_PER_TOKEN",
    "DEFAULT_CONTEXT_TOKENS",
    "PROMPT_VERSION",
    "Head",
    "SummaryRequest",
    "head_text",
    "prompt_bytes",
    "request_for",
    "summary_key",
    "system_prompt",
]

#: Bumped whenever the prompt wording or layout changes what the model is shown.
PROMPT_VERSION = 3
_ENCODER = msgspec.json.Encoder(order="sorted")

_SYSTEM = (
    "You summarize a JSON document for an AI agent that cannot read all of it. Reply with one "
    "JSON object that matches the response schema exactly, and nothing else. Never invent "
    "facts that are not in the document."
)
#: Measured with llama.cpp's /tokenize on SmolLM2 (tests/live.py documents): canonical JSON
#: of short records ran 2.36-2.52 bytes per token, whole prompts 2.38-2.53 (head) and
#: 1.88-2.18 (sampled: the "[i] " indices and digits cost a token each). A first figure of
#: ~3.2 overflowed an 8K context (21.8 KB became 11,613 tokens). Larger tokenizers do better,
#: so this errs small; an overflow still gets one smaller retry.
BYTES_PER_TOKEN = 1.9
#: What a route is assumed to hold when the catalog does not say: an 8K model, the cheap
#: rung a ladder usually starts with.
DEFAULT_CONTEXT_TOKENS = 8192
#: Tokens kept free for the chat template, the schema a server may put into the prompt, and
#: the tokenizer disagreeing with BYTES_PER_TOKEN.
RESERVE_TOKENS = 320
#: The smallest prompt worth sending.
MIN_PROMPT_BYTES = 1024


class SummaryRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One structured completion to ask of one route."""

    system: str
    user: str
    schema_name: str
    json_schema: dict[str, Any]
    max_output_tokens: int


def system_prompt(instructions: str) -> str:
    """The system message: the fixed wording and the caller's instructions."""
    if not instructions:
        return _SYSTEM
    return _SYSTEM + "\n\nInstructions from the caller:\n" + instructions


def prompt_bytes(*, context_tokens: int, token_bound: int, shown_bytes: int, system: str) -> int:
    """How many bytes the user message of one prompt may hold on a route of this context."""
    usable = context_tokens - min(token_bound, context_tokens // 2) - RESERVE_TOKENS
    fit = int(usable * BYTES_PER_TOKEN) - len(system.encode())
    return max(MIN_PROMPT_BYTES, min(shown_bytes, fit))


def head_text(shown: bytes, total_bytes: int) -> str:
    """``coverage="head"``: the first bytes of the document, the cut said and marked."""
    text = shown.decode("utf-8", "ignore")  # drops a character cut in half at the end
    if len(shown) < total_bytes:
        head = (
            f"The document is {total_bytes} bytes of JSON; only its first {len(shown)} bytes "
            "are shown, so it ends mid-value. Say in your summary that it was cut."
        )
        text += f"\n[truncated: showing the first {len(shown)} of {total_bytes} bytes]"
    else:
        head = f"The document is {total_bytes} bytes of JSON, shown in full."
    return f"{head}\n\n{text}"


def request_for(
    *,
    user: str,
    json_schema: dict[str, Any],
    summary_schema: Any,
    instructions: str,
    token_bound: int,
) -> SummaryRequest:
    """A request with this user message."""
    return SummaryRequest(
        system=system_prompt(instructions),
        user=user,
        schema_name=schema_name(summary_schema),
        json_schema=json_schema,
        max_output_tokens=token_bound,
    )


class Head:
    """Keeps the first ``limit`` bytes of a stream of pieces: what the model may be shown."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0

    @classmethod
    def for_options(cls, options: CompactionOptions[Any], *, model: bool) -> Head:
        """What the summary step may need: all of it, unless only the head is ever shown.

        Sampled and full coverage show any part of the value, and grounding and a fallback
        function read all of it; with no model only a fallback function reads anything.
        """
        if callable(options.fallback):
            return cls(1 << 62)
        if not model:
            return cls(0)
        whole = options.coverage != "head" or bool(options.grounded)
        return cls(1 << 62 if whole else options.shown_bytes)

    def watch(self, pieces: Iterable[bytes | memoryview]) -> Iterator[bytes | memoryview]:
        """``pieces``, the head kept as they pass (nothing in between when none is kept)."""
        if self._limit <= 0:
            return iter(pieces)
        return self._watching(pieces)

    def _watching(self, pieces: Iterable[bytes | memoryview]) -> Iterator[bytes | memoryview]:
        for piece in pieces:
            if self._size < self._limit:
                part = bytes(piece[: self._limit - self._size])
                self._parts.append(part)
                self._size += len(part)
            yield piece

    def data(self) -> bytes:
        """The kept bytes, cut back to whole UTF-8 characters (the receipt counts these)."""
        if len(self._parts) != 1:
            self._parts = [b"".join(self._parts)]
        if self._size >= self._limit:  # a cut: it may have landed inside a character
            self._parts = [_whole_characters(self._parts[0])]
        return self._parts[0]


def _whole_characters(data: bytes) -> bytes:
    """``data`` without a UTF-8 character cut in half at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:  # ASCII: the last character is whole
            return data
        if byte >= 0xC0:  # the lead byte of the last character: is all of it here?
            length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= length else data[:-back]
    return data


class _SummaryIdentity(msgspec.Struct, frozen=True, kw_only=True):
    v: int
    exact_digest: str
    summary_schema: Any
    instructions: str
    ladder: str
    routes: tuple[str, ...]
    token_bound: int
    shown_bytes: int
    prompt_version: int
    coverage: str
    context_tokens: tuple[int, ...]
    schema_dialect: str
    temperature: float | None
    max_model_calls: int
    grounded: tuple[str, ...]
    server: str


def summary_key(
    *,
    exact_digest: str,
    summary_json_schema: dict[str, Any],
    instructions: str,
    ladder: str,
    routes: tuple[str, ...],
    token_bound: int,
    shown_bytes: int,
    coverage: str = "head",
    context_tokens: tuple[int, ...] = (),
    schema_dialect: str = "strict",
    temperature: float | None = None,
    max_model_calls: int = 0,
    grounded: tuple[str, ...] = (),
    server: str = "",
) -> str:
    """The hex cache key of a summary: everything that changes what the model is asked.

    ``context_tokens`` are the routes' context limits (they bound the prompts), and the
    prompt version changes whenever the wording or layout does. ``server``: where the routes
    are served (a route's name says little: a llama-server answers any name with its model).
    """
    identity = _SummaryIdentity(
        v=2,
        exact_digest=exact_digest,
        summary_schema=summary_json_schema,
        instructions=instructions,
        ladder=ladder,
        routes=routes,
        token_bound=token_bound,
        shown_bytes=shown_bytes,
        prompt_version=PROMPT_VERSION,
        coverage=coverage,
        context_tokens=context_tokens,
        schema_dialect=schema_dialect,
        temperature=temperature,
        max_model_calls=max_model_calls,
        grounded=grounded,
        server=server,
    )
    return hashlib.sha256(_ENCODER.encode(identity)).hexdigest()
