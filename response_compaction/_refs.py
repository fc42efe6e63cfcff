"""The exact reference format and the summary cache identity. Pure: no I/O.

An exact reference is ``"rc1:" + 64 lowercase hex``: the version tag of this format and the
store's keyed digest (HMAC-SHA256, see ``_digest``) of the canonical bytes. It names content,
never a place, so nothing a caller puts in it can steer a read outside the store; the store
derives every path from the hex alone, and a read checks the bytes against it.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec

from ._digest import DIGEST_PREFIX

__all__ = [
    "MalformedRefError",
    "ParsedRef",
    "exact_ref_for",
    "hex_of_digest",
    "parse_exact_ref",
    "summary_key",
]

_REF_PREFIX = "rc1:"
_REF = re.compile(r"rc1:([0-9a-f]{64})")
_HEX = re.compile(r"[0-9a-f]{64}")
_ENCODER = msgspec.json.Encoder(order="sorted")
#: Bumped whenever the prompt wording or layout changes what the model is shown.
PROMPT_VERSION = 1


class ParsedRef(msgspec.Struct, frozen=True):
    """A well-formed reference: the hex keyed digest of the canonical bytes."""

    hex: str


def exact_ref_for(digest: str) -> str:
    """The reference for a ``"sha256:..."`` digest."""
    return _REF_PREFIX + hex_of_digest(digest)


def hex_of_digest(digest: str) -> str:
    """The 64 hex characters of a ``"sha256:..."`` digest."""
    hex_part = digest.removeprefix(DIGEST_PREFIX)
    if not digest.startswith(DIGEST_PREFIX) or _HEX.fullmatch(hex_part) is None:
        raise ValueError(f"not a {DIGEST_PREFIX[:-1]} digest: {digest!r}")
    return hex_part


class MalformedRefError(ValueError):
    """A reference that is not ``"rc1:" + 64 lowercase hex``; the message says why."""


def parse_exact_ref(ref: object) -> ParsedRef:
    """Parse a reference; raise :class:`MalformedRefError` when it is malformed."""
    if not isinstance(ref, str):
        raise MalformedRefError(f"exact_ref must be a str, got {type(ref).__name__}")
    match = _REF.fullmatch(ref)
    if match is None:
        shown = ref if len(ref) <= 80 else ref[:77] + "..."
        raise MalformedRefError(
            f"malformed exact_ref {shown!r}: expected 'rc1:' followed by 64 lowercase hex"
        )
    return ParsedRef(match.group(1))


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
