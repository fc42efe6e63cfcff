"""What a host hands its model as a tool result: one bounded text (or JSON) per ``Compacted``.

Pure: no I/O. The text is plain lines a model reads well and a test can pin::

    kind: summarized
    summary: {"critical_facts":[...],"overview":"..."}
    coverage: the summary was made from 96000 of 22345678 bytes (0.4%) of the response
    exact_ref: rc1:... (22345678 bytes of exact JSON kept)
    read more: call read_exact with exact_ref and optional pointer (RFC 6901, ...) ...

The value line is the only one that can be long; it is cut (on a character boundary, with a
marker) so the whole text stays within ``max_bytes`` UTF-8 bytes.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from ._encoding import line_safe
from ._pydantic import plain_hook

__all__ = ["MIN_TEXT_BYTES", "agent_json", "agent_text"]

#: Below this a text cannot hold the fixed lines and some of the value.
MIN_TEXT_BYTES = 1024

# Pydantic schemas give pydantic outputs (also inside lists): shown by alias, as stored.
_ENCODE = msgspec.json.Encoder(order="sorted", enc_hook=plain_hook).encode
_LABELS = {"exact": "value", "summarized": "summary", "fallback": "fallback"}


def _check(read_tool: object, max_bytes: object) -> None:
    """``ValueError`` unless both can be used (checked before any text is made).

    A float ``max_bytes`` failed as a slice index (TypeError) only once a value was cut; a
    tool name with a line break split the read-more line that the value's own text never may.
    """
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool):
        raise ValueError(f"max_bytes must be an int, got {type(max_bytes).__name__}")  # noqa: TRY004 - as read_part's
    if max_bytes < MIN_TEXT_BYTES:
        raise ValueError(f"max_bytes must be >= {MIN_TEXT_BYTES}")
    if not isinstance(read_tool, str) or not read_tool or not read_tool.isprintable():
        raise ValueError("read_tool must be a tool's name: one line of printable text")


def _facts(compacted: Any, read_tool: str) -> dict[str, Any]:
    receipt = compacted.receipt
    kind = compacted.output.kind
    facts: dict[str, Any] = {
        "kind": kind,
        "exact_ref": receipt.exact_ref,
        "exact_bytes": receipt.exact_bytes,
    }
    # covered_bytes (bytes of the response that reached a prompt) is the newer name;
    # shown_bytes said the same before coverage modes existed.
    covered = getattr(receipt, "covered_bytes", UNSET)
    if covered is UNSET:
        covered = getattr(receipt, "shown_bytes", UNSET)
    if kind == "exact":
        covered = receipt.exact_bytes
    if kind != "fallback" and covered is not UNSET:
        facts["covered_bytes"] = covered
    reason = getattr(receipt, "fallback_reason", UNSET)
    if kind == "fallback" and reason is not UNSET:
        facts["fallback_reason"] = reason
    facts["read_more"] = _read_more(read_tool)
    return facts


def _read_more(read_tool: str) -> str:
    return (
        f'call {read_tool} with exact_ref and optional pointer (RFC 6901, e.g. "/rows/0"),'
        " start/stop (a window of array items, object members in key order, or string"
        " characters; each answer gives next_start while more follows) and max_bytes;"
        " a part too large to show comes back as an outline of keys, types and sizes"
    )


def _coverage_line(facts: dict[str, Any]) -> str:
    total = facts["exact_bytes"]
    if facts["kind"] == "exact":
        return "coverage: the value above is the whole response, exact"
    if facts["kind"] == "fallback":
        reason = facts.get("fallback_reason", "unknown")
        return f"coverage: no summary ({reason}); the fallback above is the caller's default"
    covered = facts.get("covered_bytes")
    if covered is None:
        return "coverage: unknown"
    share = 100.0 * covered / total if total else 100.0
    return f"coverage: the summary was made from {covered} of {total} bytes ({share:.1f}%)"


def agent_text(compacted: Any, *, read_tool: str = "read_exact", max_bytes: int = 16000) -> str:
    """One plain text for a tool result, at most ``max_bytes`` UTF-8 bytes.

    Raises ``ValueError`` when ``max_bytes`` is not an int of at least :data:`MIN_TEXT_BYTES`,
    or ``read_tool`` is not one line of printable text.
    """
    _check(read_tool, max_bytes)
    facts = _facts(compacted, read_tool)
    label = _LABELS[facts["kind"]]
    tail = "\n".join(
        (
            _coverage_line(facts),
            f"exact_ref: {facts['exact_ref']} ({facts['exact_bytes']} bytes of exact JSON kept)",
            f"read more: {facts['read_more']}",
        )
    )
    head = f"kind: {facts['kind']}\n{label}: "
    room = max_bytes - len(head.encode()) - 1 - len(tail.encode())
    if room < 64:
        raise ValueError("max_bytes is too small for the reference and the read-more line")
    body = line_safe(_ENCODE(compacted.output.value))  # a value cannot start a line
    if len(body) > room:

        def marker(shown: int) -> str:  # not str.format: the tool's name may hold braces
            return f" …[cut: {shown} of {len(body)} bytes shown; use {read_tool}]"

        keep = room - len(marker(len(body)).encode())
        if keep < 0:  # a long read_tool name: body[:keep] would keep nearly all of it
            raise ValueError("max_bytes is too small for the reference and the read-more line")
        shown = body[:keep].decode("utf-8", "ignore")
        text = shown + marker(len(shown.encode()))
    else:
        text = body.decode()
    return f"{head}{text}\n{tail}"


def agent_json(
    compacted: Any, *, read_tool: str = "read_exact", max_bytes: int = 16000
) -> dict[str, Any]:
    """The same facts as JSON-ready builtins, encoding to at most ``max_bytes`` bytes.

    ``value`` is the output's value when it fits; otherwise it is left out and
    ``value_omitted`` is True (the reference reads it).
    """
    _check(read_tool, max_bytes)
    facts = _facts(compacted, read_tool)
    value = msgspec.to_builtins(compacted.output.value, enc_hook=plain_hook)
    with_value = {**facts, "value": value}
    if len(_ENCODE(with_value)) <= max_bytes:
        return with_value
    without = {**facts, "value_omitted": True}
    if len(_ENCODE(without)) > max_bytes:
        raise ValueError("max_bytes is too small for the reference and the read-more line")
    return without
