"""``OpenAICatalog``: summary ladders served through an ``openai.AsyncOpenAI`` client.

The only module that imports openai. One Chat Completions call per rung with a strict
``json_schema`` response format (the most widely supported structured-output shape among
OpenAI-compatible servers), ``max_retries=0`` so the ladder is the only retry policy, and no
SDK timeout of its own: the whole summary step runs inside one ``anyio.fail_after``. A call
cancelled by that budget (or by ``rung_timeout_ms``) closes its connection, which is how an
HTTP server learns to stop working on it.

Failures are classified without content: ``"HTTP 400 exceed_context_size_error"`` (status and
the server's error type or code), or the exception class name. A context overflow (OpenAI
``context_length_exceeded``, llama.cpp ``exceed_context_size_error``, vLLM's 400 naming the
maximum context length) is flagged so the ladder can retry once with a smaller prompt.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from msgspec import UNSET, UnsetType

from ._ladder import RungReply
from ._prompt import DEFAULT_CONTEXT_TOKENS, SummaryRequest

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAICatalog"]


class OpenAICatalog:
    """A harness ``llm``: ladder name -> ordered model routes, served by ``client``.

    ``client`` stays the caller's: close it when done (``async with`` or ``await
    client.close()``); a client cannot move between event loops.

    ``context_tokens`` is each route's context window in tokens (a mapping route -> tokens,
    or one int for every route); a route not named gets 8192, which fits the small models a
    ladder usually starts with. Prompts are sized to fit it. ``temperature`` is sent with
    every call (0.0 by default: the same prompt gives the same summary; None leaves it to the
    server). ``schema_dialect="full"`` sends the summary schema's value constraints
    (``pattern``, ``minItems``, ``minimum``...) to servers that enforce them while generating
    (llama.cpp, vLLM); ``"strict"`` (the default) sends only what OpenAI's strict mode takes.
    """

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        ladders: Mapping[str, Sequence[str]],
        *,
        context_tokens: Mapping[str, int] | int | None = None,
        temperature: float | None = 0.0,
        schema_dialect: Literal["strict", "full"] = "strict",
    ) -> None:
        import openai

        if not isinstance(client, openai.AsyncOpenAI):
            raise TypeError(f"client must be an openai.AsyncOpenAI, got {type(client).__name__}")
        if not isinstance(ladders, Mapping):
            raise TypeError(
                f"ladders must be a mapping of names to routes, got {type(ladders).__name__}"
            )
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
        self._contexts = _check_contexts(context_tokens)
        if temperature is not None and (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not 0.0 <= temperature <= 2.0
        ):
            raise ValueError("temperature must be a number from 0 to 2, or None")
        if schema_dialect not in ("strict", "full"):
            raise ValueError('schema_dialect must be "strict" or "full"')
        self.temperature = None if temperature is None else float(temperature)
        self.schema_dialect: Literal["strict", "full"] = schema_dialect

    def context_limit(self, route: str) -> int:
        """The context window of ``route`` in tokens (8192 when not configured)."""
        if isinstance(self._contexts, int):
            return self._contexts
        return self._contexts.get(route, DEFAULT_CONTEXT_TOKENS)

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

        extra: dict[str, Any] = {}
        if self.temperature is not None:
            extra["temperature"] = self.temperature
        create = self._rung_client.chat.completions.with_streaming_response.create
        cap = REPLY_BYTES + 64 * request.max_output_tokens
        try:
            async with create(
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
                **extra,
            ) as raw:
                body = await _body(raw, cap)
        except openai.APIStatusError as exc:
            return _status_reply(exc, _Echo(request))
        except openai.APIError as exc:
            return RungReply(outcome="error", detail=type(exc).__name__)
        if isinstance(body, str):
            return RungReply(outcome="error", detail=body)
        response = _completion(body)
        if response is None:
            return RungReply(outcome="error", detail="reply is not a completion")
        usage = getattr(response, "usage", None)
        served = getattr(response, "model", None)
        tokens: dict[str, Any] = {
            "input_tokens": _count(getattr(usage, "prompt_tokens", None)),
            "output_tokens": _count(getattr(usage, "completion_tokens", None)),
            "served_model": served
            if isinstance(served, str)
            and _MODEL_NAME.fullmatch(served)
            and not _Echo(request).holds(served)
            else UNSET,
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


#: A reply's body is read up to this many bytes, plus 64 a token of output asked for: a
#: server streaming one without end (a broken or hostile one) held 1.1 GB after 3 s, and the
#: client reads the whole body before it returns.
REPLY_BYTES = 1 << 20


async def _body(raw: Any, cap: int) -> bytes | str:
    """The body of the reply ``raw``, or why not: longer than ``cap`` bytes, or cut.

    Past the cap the rest is read and dropped, not kept: the budget ends an endless one.
    (Left unread, the client's generators were finalized unexhausted, which trio reports.)
    The HTTP library's errors while reading are named as the client names them when it
    reads the body itself (APIConnectionError, APITimeoutError).
    """
    http = sys.modules.get(type(raw.http_response).__module__.partition(".")[0])
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in raw.iter_bytes():
            size += len(chunk)
            if size <= cap:
                chunks.append(chunk)
    except Exception as exc:
        if http is None or not isinstance(exc, http.HTTPError):
            raise
        return "APITimeoutError" if isinstance(exc, http.TimeoutException) else "APIConnectionError"
    return b"".join(chunks) if size <= cap else f"reply over {cap} bytes"


def _completion(body: bytes) -> Any:
    """The chat completion in ``body``, read as the client reads one; or None.

    ``json.loads`` as the client: a BOM, UTF-16 and NaN pass (msgspec refused them), and the
    completion is built leniently.
    """
    from openai.types.chat import ChatCompletion

    try:
        data = json.loads(body)
    except ValueError:  # not JSON, not text (UnicodeDecodeError is a ValueError)
        return None
    return ChatCompletion.construct(**data) if isinstance(data, dict) else None


#: What an error type or code may look like to be shown (``exceed_context_size_error``,
#: ``context_length_exceeded``, ``invalid_request_error``, vLLM's ``BadRequestError``).
#: Anything else is left out: a server that echoes the prompt into it must not carry
#: response content into the receipt.
_IDENTIFIER = re.compile(r"[a-z][a-z0-9_.-]{0,63}|[A-Z][A-Za-z0-9]{0,50}(?:Error|Exception)")
#: Model names as servers report them (``gpt-4.1-mini-2025-04-14``, ``org/Model-8B``).
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}")

_OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})


class _Echo:
    """Whether a token the server sent back could be an echo of the prompt it was sent.

    A token shaped like a model name or an error code can still hold words of the response
    (an account id, a name): one found in the prompt, in any case, is left out of the
    receipt, and so is one with a word of four or more characters found anywhere in the
    prompt's text (``acct_4821_not_found``), unless it is a word error codes are made of. Not
    matched as whole words: the prompt splits into words its own way (``AcmeCorp``, an
    escaped newline before ``acme``), so ``mini`` in ``minimum`` hides a model name: the safe side.
    """

    def __init__(self, request: SummaryRequest) -> None:
        self._folded = (request.system + "\n" + request.user).casefold()

    def holds(self, token: str) -> bool:
        folded = self._folded
        if token.casefold() in folded:
            return True
        pieces = {p.casefold() for p in _WORD.findall(token) if len(p) >= 4} - _CODE_WORDS
        return any(piece in folded for piece in pieces)


#: Words (CamelCase parts too) and the words error codes and types are made of.
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z0-9]+(?![a-z])")
_CODE_TEXT = """
    error errors exception invalid request requests context length exceeded exceed size rate
    limit quota insufficient server internal timeout model found supported unsupported
    authentication permission denied overloaded unavailable parameter content filter json
    schema value type tokens token maximum service gateway unprocessable entity conflict
    forbidden unauthorized prompt input output format response missing required unknown
"""
_CODE_WORDS = frozenset(_CODE_TEXT.split())


def _status_reply(exc: Any, echo: _Echo) -> RungReply:
    """An HTTP error, classified by status and the server's error type or code (no message)."""
    body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
    inner = body.get("error")
    error: dict[str, Any] = inner if isinstance(inner, dict) else body
    kinds = [v for v in (error.get("type"), error.get("code")) if isinstance(v, str) and v]
    shown = [k for k in kinds if _IDENTIFIER.fullmatch(k) and not echo.holds(k)]
    detail = f"HTTP {exc.status_code}" + "".join(f" {k}" for k in shown[:1])
    message = error.get("message")
    overflow = bool(_OVERFLOW_CODES.intersection(kinds)) or (
        exc.status_code == 400
        and isinstance(message, str)
        and "maximum context length" in message.lower()
    )
    if overflow and not shown:
        detail += " context_length_exceeded"
    shrink: float | UnsetType = UNSET
    needed, limit = error.get("n_prompt_tokens"), error.get("n_ctx")
    if overflow and type(needed) is int and type(limit) is int and needed > 0 < limit:
        shrink = limit / needed  # llama.cpp says how far over it was
    return RungReply(outcome="error", detail=detail, context_overflow=overflow, shrink=shrink)


def _check_contexts(contexts: Mapping[str, int] | int | None) -> Mapping[str, int] | int:
    if contexts is None:
        return {}
    if isinstance(contexts, int) and not isinstance(contexts, bool):
        values: list[object] = [contexts]
    elif isinstance(contexts, Mapping):
        values = list(contexts.values())
    else:
        raise TypeError("context_tokens must be a mapping of route to tokens, or an int")
    if not all(type(v) is int and 1024 <= v <= 10_000_000 for v in values):
        raise ValueError("context_tokens must be whole numbers from 1024 to 10000000")
    return contexts if isinstance(contexts, int) else dict(contexts)


def _count(value: object) -> int | UnsetType:
    # The SDK does not type-check usage: only a real, non-negative int is a measurement.
    if type(value) is int and value >= 0:
        return value
    return UNSET
