"""``OpenAICatalog``: summary ladders served through an ``openai.AsyncOpenAI`` client.

The only module that imports openai. One Chat Completions call per rung with a strict
``json_schema`` response format (the most widely supported structured-output shape among
OpenAI-compatible servers), ``max_retries=0`` so the ladder is the only retry policy, and no
SDK timeout of its own: the whole summary step runs inside one ``anyio.fail_after``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msgspec import UNSET, UnsetType

from ._summarize import RungReply, SummaryRequest

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAICatalog"]


class OpenAICatalog:
    """A harness ``llm``: ladder name -> ordered model routes, served by ``client``.

    ``client`` stays the caller's: close it when done (``async with`` or ``await
    client.close()``); a client cannot move between event loops.
    """

    def __init__(self, client: openai.AsyncOpenAI, ladders: Mapping[str, Sequence[str]]) -> None:
        import openai

        if not isinstance(client, openai.AsyncOpenAI):
            raise TypeError(f"client must be an openai.AsyncOpenAI, got {type(client).__name__}")
        checked: dict[str, tuple[str, ...]] = {}
        for name, routes in ladders.items():
            if isinstance(routes, str) or not routes:
                raise ValueError(f"ladder {name!r} must be a non-empty sequence of model names")
            if not all(isinstance(r, str) and r for r in routes):
                raise ValueError(f"ladder {name!r} has a route that is not a model name")
            checked[str(name)] = tuple(routes)
        self.client = client
        self._rung_client = client.with_options(max_retries=0)
        self._ladders = checked

    @property
    def ladders(self) -> Mapping[str, tuple[str, ...]]:
        """The ladders, as given."""
        return dict(self._ladders)

    def routes(self, ladder: str) -> tuple[str, ...]:
        """The routes of ``ladder``; ``LookupError`` if there is no such ladder."""
        try:
            return self._ladders[ladder]
        except KeyError:
            known = ", ".join(sorted(self._ladders)) or "none"
            raise LookupError(f"unknown ladder {ladder!r} (known: {known})") from None

    async def aclose(self) -> None:
        """Close ``client``: the sync facade calls this on its loop before stopping it."""
        await self.client.close()

    async def complete(self, route: str, request: SummaryRequest) -> RungReply:
        """One structured completion on ``route``, classified."""
        import openai

        try:
            response = await self._rung_client.chat.completions.create(
                model=route,
                messages=[
                    {"role": "system", "content": request.system},
                    {"role": "user", "content": request.user},
                ],
                response_format={
                    "type": "json_schema",
                    "json_schema": {
                        "name": request.schema_name,
                        "schema": request.json_schema,
                        "strict": True,
                    },
                },
                max_completion_tokens=request.max_output_tokens,
            )
        except openai.APIStatusError as exc:
            return RungReply(outcome="error", detail=f"HTTP {exc.status_code}")
        except openai.APIError as exc:
            return RungReply(outcome="error", detail=type(exc).__name__)
        usage = getattr(response, "usage", None)
        tokens: dict[str, Any] = {
            "input_tokens": _count(getattr(usage, "prompt_tokens", None)),
            "output_tokens": _count(getattr(usage, "completion_tokens", None)),
        }
        choices = getattr(response, "choices", None) or []
        if not choices:
            return RungReply(outcome="error", detail="no choices", **tokens)
        choice = choices[0]
        message = choice.message
        if getattr(message, "refusal", None):
            return RungReply(outcome="refused", **tokens)
        if choice.finish_reason == "length":
            return RungReply(outcome="truncated", **tokens)
        if not isinstance(message.content, str):
            return RungReply(outcome="error", detail="no content", **tokens)
        return RungReply(outcome="ok", text=message.content, **tokens)


def _count(value: object) -> int | UnsetType:
    # The SDK does not type-check usage: only a real, non-negative int is a measurement.
    if type(value) is int and value >= 0:
        return value
    return UNSET
