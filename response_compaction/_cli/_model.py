"""The model side of the CLI: the default summary schema and which model the flags name."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

if TYPE_CHECKING:
    from .._openai import OpenAICatalog  # imported when a model is configured: it loads openai

__all__ = ("DEFAULT_FALLBACK", "DefaultSummary", "GrammarSummary", "ModelConfig", "summary_for")


_OVERVIEW = "what the document is, in about 200 characters"
_FACTS = "at most 3 facts, about 80 characters each"
_RETAINED = "The exact response was retained but not summarized; read it back by exact_ref."


class DefaultSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The summary schema ``compact`` asks for unless ``--summary-schema`` names another.

    Its size is asked for in the descriptions (OpenAI's strict mode sends those, not bounds);
    a server that enforces bounds gets :class:`GrammarSummary` instead.
    """

    overview: Annotated[str, msgspec.Meta(description=_OVERVIEW)]
    critical_facts: Annotated[list[str], msgspec.Meta(description=_FACTS)]


class GrammarSummary(msgspec.Struct, frozen=True, kw_only=True):
    """:class:`DefaultSummary` with hard bounds, for ``schema_dialect="full"`` servers.

    llama.cpp and vLLM turn the bounds into a grammar, which stops a small model that repeats
    itself: SmolLM2-135M at temperature 0 never stops by itself (1,024 tokens, ``truncated``),
    writes one character per token at ~8 tokens/s on a CPU, so ~440 characters is what fits
    beside an 8K prompt in a 120 s budget. A server that enforces them never breaks them; a
    reply that did would be ``invalid``, which is why OpenAI does not get them.
    """

    overview: Annotated[str, msgspec.Meta(max_length=200, description=_OVERVIEW)]
    critical_facts: Annotated[
        list[Annotated[str, msgspec.Meta(max_length=80)]],
        msgspec.Meta(max_length=3, description=_FACTS),
    ]


DEFAULT_FALLBACK = DefaultSummary(overview=_RETAINED, critical_facts=[])
GRAMMAR_FALLBACK = GrammarSummary(overview=_RETAINED, critical_facts=[])


def summary_for(schema: Any, fallback: Any, dialect: str) -> tuple[Any, Any]:
    """The summary schema and fallback to ask for: the default one bounded under "full".

    A ``--fallback`` of the user's own is kept (as the bounded schema's value): it was
    replaced by the default one whenever the server was not OpenAI's.
    """
    if schema is DefaultSummary and dialect == "full":
        if fallback is DEFAULT_FALLBACK:
            return GrammarSummary, GRAMMAR_FALLBACK
        try:
            return GrammarSummary, msgspec.convert(msgspec.to_builtins(fallback), GrammarSummary)
        except msgspec.ValidationError as exc:
            raise ValueError(f"--fallback must fit the bounded summary schema: {exc}") from None
    return schema, fallback


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which model the environment configures, or why there is none."""

    routes: tuple[str, ...]
    base_url: str | None
    api_key: str | None
    ladder: str
    why_not: str | None
    temperature: float | None = 0.0
    schema_dialect: Literal["strict", "full"] = "strict"

    @classmethod
    def from_args(cls, args: argparse.Namespace, ladder: str) -> ModelConfig:
        """From the flags: ``--model``, ``--base-url``, ``--temperature``, ``--schema-dialect``."""
        config = cls.from_env(args.model, args.base_url, ladder)
        dialect = args.schema_dialect
        if dialect == "auto":
            dialect = "full" if _serves_grammars(config.base_url) else "strict"
        return dataclasses.replace(config, temperature=args.temperature, schema_dialect=dialect)

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
    async def catalog(
        self, context_tokens: int | None = None
    ) -> AsyncIterator[OpenAICatalog | None]:
        """An ``OpenAICatalog`` on a client made (and closed) in this event loop, or None."""
        if self.why_not:
            yield None
            return
        # The one place outside _openai.py that touches the SDK: the CLI owns its client.
        import openai

        from .._openai import OpenAICatalog

        # Local OpenAI-compatible servers ignore the key, but the SDK insists on one.
        async with openai.AsyncOpenAI(
            api_key=self.api_key or "unused", base_url=self.base_url
        ) as client:
            yield OpenAICatalog(
                client,
                {self.ladder: self.routes},
                context_tokens=context_tokens,
                temperature=self.temperature,
                schema_dialect=self.schema_dialect,
            )


def _serves_grammars(base_url: str | None) -> bool:
    """Whether ``base_url`` is a server other than OpenAI's own (llama.cpp, vLLM, Ollama...).

    Those turn a JSON schema into a grammar and enforce its bounds while generating; OpenAI's
    strict mode refuses some of the bounds.
    """
    if not base_url:
        return False
    host = urllib.parse.urlsplit(base_url).hostname or ""
    return not (host == "openai.com" or host.endswith(".openai.com"))
