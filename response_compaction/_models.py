"""Public value types: outputs, read results, receipts and options. Pure data, no I/O."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, TypeAlias, TypeVar

from msgspec import UNSET, Meta, Struct, UnsetType

from ._agent_text import agent_json, agent_text

if TYPE_CHECKING:
    from ._profile import Profile

__all__ = [
    "Attempt",
    "Broken",
    "Compacted",
    "CompactionOptions",
    "ExactOutput",
    "FallbackOutput",
    "Found",
    "Missing",
    "ReadResult",
    "Receipt",
    "SummarizedOutput",
]

E = TypeVar("E")
S = TypeVar("S")

FallbackReason: TypeAlias = Literal["timeout", "invalid", "refused", "truncated", "error", "no_llm"]
AttemptOutcome: TypeAlias = Literal[
    "ok", "timeout", "error", "refused", "truncated", "invalid", "ungrounded"
]
Coverage: TypeAlias = Literal["head", "sampled", "full"]


class ExactOutput(Struct, Generic[E], frozen=True, kw_only=True, tag_field="kind", tag="exact"):
    """The response was small enough: ``value`` is the validated exact value."""

    value: E

    @property
    def kind(self) -> Literal["exact"]:
        """Always ``"exact"``."""
        return "exact"


class SummarizedOutput(
    Struct, Generic[S], frozen=True, kw_only=True, tag_field="kind", tag="summarized"
):
    """``value`` is a model summary that validated against the summary schema."""

    value: S

    @property
    def kind(self) -> Literal["summarized"]:
        """Always ``"summarized"``."""
        return "summarized"


class FallbackOutput(
    Struct, Generic[S], frozen=True, kw_only=True, tag_field="kind", tag="fallback"
):
    """No valid summary arrived: ``value`` is the caller's fallback, unchanged."""

    value: S

    @property
    def kind(self) -> Literal["fallback"]:
        """Always ``"fallback"``."""
        return "fallback"


class Found(Struct, Generic[E], frozen=True, kw_only=True, tag_field="state", tag="found"):
    """The exact value is present, unexpired, digest-matching and schema-valid."""

    value: E

    @property
    def state(self) -> Literal["found"]:
        """Always ``"found"``."""
        return "found"


class Missing(Struct, frozen=True, kw_only=True, tag_field="state", tag="missing"):
    """Never stored, expired, or evicted. Never an empty success."""

    @property
    def state(self) -> Literal["missing"]:
        """Always ``"missing"``."""
        return "missing"


class Broken(Struct, frozen=True, kw_only=True, tag_field="state", tag="broken"):
    """A malformed reference, bytes that do not match the digest, or invalid content."""

    detail: str

    @property
    def state(self) -> Literal["broken"]:
        """Always ``"broken"``."""
        return "broken"


ReadResult: TypeAlias = Found[E] | Missing | Broken


class Attempt(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One rung of the ladder tried once: which route, how it ended, how long, what it cost.

    ``input_tokens`` and ``output_tokens`` are what the provider reported; a reported 0 is
    kept and a count that was not reported is ``UNSET`` (omitted when encoded), never 0.
    ``error`` is the content-free cause of a failed call (``"HTTP 400 exceed_context_size_error"``
    or an exception class name); ``served_model`` is the model the server says answered. An
    error code or model name that occurs in the prompt sent, or holds a word of four or more
    characters found in its text (other than the words error codes are made of), is left
    out: a server echoing the prompt would carry response content into the receipt.
    ``call`` says what the call was for when it was not the plain one-prompt summary:
    ``"retry"`` (a smaller prompt after a context overflow), ``"map"`` or ``"reduce"``
    (``coverage="full"``).
    """

    route: str
    outcome: AttemptOutcome
    elapsed_ms: int
    input_tokens: int | UnsetType = UNSET
    output_tokens: int | UnsetType = UNSET
    error: str | UnsetType = UNSET
    served_model: str | UnsetType = UNSET
    call: Literal["retry", "map", "reduce"] | UnsetType = UNSET


class Receipt(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What happened, without any response or summary content.

    Fields that do not apply are ``UNSET`` and omitted when encoded. ``shown_bytes`` is how
    many bytes of the canonical exact JSON the largest single prompt held; ``covered_bytes``
    how many bytes of it reached any prompt (all of them for a ``"full"`` coverage that
    finished in time).
    """

    exact_ref: str
    exact_digest: str
    exact_bytes: int
    exact_cache: Literal["stored", "reused"]
    summary_cache: Literal["not_needed", "hit", "stored", "none"]
    elapsed_ms: int
    summary_digest: str | UnsetType = UNSET
    summary_bytes: int | UnsetType = UNSET
    ladder: str | UnsetType = UNSET
    route: str | UnsetType = UNSET
    attempts: tuple[Attempt, ...] | UnsetType = UNSET
    fallback_reason: FallbackReason | UnsetType = UNSET
    shown_bytes: int | UnsetType = UNSET
    covered_bytes: int | UnsetType = UNSET
    input_tokens: int | UnsetType = UNSET
    output_tokens: int | UnsetType = UNSET


class Compacted(Struct, Generic[E, S], frozen=True, kw_only=True):
    """The result of ``response_compact``: what to hand the agent, and the receipt."""

    output: ExactOutput[E] | SummarizedOutput[S] | FallbackOutput[S]
    receipt: Receipt

    def to_agent_text(self, *, read_tool: str = "read_exact", max_bytes: int = 16000) -> str:
        """One plain text to return as the tool result, at most ``max_bytes`` UTF-8 bytes.

        Lines: the kind; the value, summary or fallback as compact JSON (cut with a marker
        if it does not fit); how much of the response the summary was made from; the
        ``exact_ref`` and its size; how to read more with ``read_tool`` (pointer, start,
        stop, max_bytes). Raises ``ValueError`` when ``max_bytes < 1024``.
        """
        return agent_text(self, read_tool=read_tool, max_bytes=max_bytes)

    def to_agent_json(
        self, *, read_tool: str = "read_exact", max_bytes: int = 16000
    ) -> dict[str, Any]:
        """The facts of :meth:`to_agent_text` as JSON-ready builtins for structured results.

        Keys: ``kind``, ``value`` (or ``value_omitted: true`` when it does not fit
        ``max_bytes``), ``exact_ref``, ``exact_bytes``, ``covered_bytes`` (when known),
        ``fallback_reason`` (for a fallback), ``read_more``.
        """
        return agent_json(self, read_tool=read_tool, max_bytes=max_bytes)


class CompactionOptions(Struct, Generic[S], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to compact. A mapping with the same keys is accepted wherever this is.

    ``fallback`` (a value of the summary schema, or a callable that receives the
    :class:`~response_compaction.Profile` of the exact value and returns one) and ``ladder``
    (a catalog ladder name) are required. ``shown_bytes`` bounds how much of the canonical
    exact JSON goes into one prompt (the route's context may bound it further).
    ``coverage`` says what the model is shown: ``"head"`` the first bytes, ``"sampled"`` the
    profile and whole items from across the value, ``"full"`` every item, map-reduced in at
    most ``max_model_calls`` calls. ``rung_timeout_ms`` bounds one rung (None: what is left
    of ``timeout_ms``). ``grounded`` names top-level summary fields whose identifiers must
    occur in the exact bytes or the profile (else the rung is ``ungrounded``).

    With a fallback function, spell the summary type for a type checker (mypy infers nothing
    from ``S | Callable[[Profile], S]`` given a function):
    ``CompactionOptions[Summary](fallback=make_summary, ladder="cheap")``.
    """

    if TYPE_CHECKING:
        fallback: S | Callable[[Profile], S]
    else:  # msgspec validates the value form; a callable is set aside before conversion
        fallback: S
    ladder: str
    summarize_above_bytes: Annotated[int, Meta(ge=0)] = 32000
    instructions: str = ""
    timeout_ms: Annotated[int, Meta(ge=1, le=600_000)] = 20000
    ttl_seconds: Annotated[int, Meta(ge=1)] = 86400
    max_entries: Annotated[int, Meta(ge=1)] = 256
    token_bound: Annotated[int, Meta(ge=1, le=1_000_000)] = 1024
    shown_bytes: Annotated[int, Meta(ge=1024, le=16_000_000)] = 96_000
    coverage: Coverage = "sampled"
    rung_timeout_ms: Annotated[int, Meta(ge=1, le=600_000)] | None = None
    max_model_calls: Annotated[int, Meta(ge=1, le=10_000)] = 16
    grounded: tuple[str, ...] = ()
