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

from ._schema import schema_name

__all__ = ["PROMPT_VERSION", "Head", "SummaryRequest", "build_request", "summary_key"]

#: Bumped whenever the prompt wording or layout changes what the model is shown.
PROMPT_VERSION = 1
_ENCODER = msgspec.json.Encoder(order="sorted")

_SYSTEM = (
    "You summarize a JSON document for an AI agent that cannot read all of it. Reply with one "
    "JSON object that matches the response schema exactly, and nothing else. Never invent "
    "facts that are not in the document."
)


class SummaryRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One structured completion to ask of one route."""

    system: str
    user: str
    schema_name: str
    json_schema: dict[str, Any]
    max_output_tokens: int


def build_request(
    *,
    shown: bytes,
    total_bytes: int,
    json_schema: dict[str, Any],
    summary_schema: Any,
    instructions: str,
    token_bound: int,
) -> SummaryRequest:
    """The prompt for a document of ``total_bytes`` of which ``shown`` is the start."""
    text = shown.decode("utf-8", "ignore")  # drops a character cut in half at the end
    if len(shown) < total_bytes:
        head = (
            f"The document is {total_bytes} bytes of JSON; only its first {len(shown)} bytes "
            "are shown, so it ends mid-value. Say in your summary that it was cut."
        )
        text += f"\n[truncated: showing the first {len(shown)} of {total_bytes} bytes]"
    else:
        head = f"The document is {total_bytes} bytes of JSON, shown in full."
    system = _SYSTEM
    if instructions:
        system += "\n\nInstructions from the caller:\n" + instructions
    return SummaryRequest(
        system=system,
        user=f"{head}\n\n{text}",
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

    def watch(self, pieces: Iterable[bytes | memoryview]) -> Iterator[bytes | memoryview]:
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


def summary_key(
    *,
    exact_digest: str,
    summary_json_schema: dict[str, Any],
    instructions: str,
    ladder: str,
    routes: tuple[str, ...],
    token_bound: int,
    shown_bytes: int,
) -> str:
    """The hex cache key of a summary: everything that changes what the model is asked."""
    identity = _SummaryIdentity(
        v=1,
        exact_digest=exact_digest,
        summary_schema=summary_json_schema,
        instructions=instructions,
        ladder=ladder,
        routes=routes,
        token_bound=token_bound,
        shown_bytes=shown_bytes,
        prompt_version=PROMPT_VERSION,
    )
    return hashlib.sha256(_ENCODER.encode(identity)).hexdigest()
