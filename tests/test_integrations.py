"""Framework adapters end to end on each framework's own test model (no network).

Each agent calls a tool whose result is about 20 MB of JSON, receives the compacted text,
reads ``/records/97`` back with the read-back tool, and finishes with what it read. The
frameworks run on asyncio only: the OpenAI Agents SDK, Pydantic AI and LangChain all need it
(Pydantic AI under trio fails with "no running event loop"). A framework that cannot be
installed on this Python skips its tests; CI installs every extra (noxfile ``EXTRAS``).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio.to_thread
import msgspec
import openai
import pytest

import response_compaction as rc
from response_compaction.integrations import Compactor
from tests._store_support import entry_files, store_root
from tests.fake_openai import FakeOpenAI

pytestmark = pytest.mark.anyio

REF = re.compile(r"rc1:[0-9a-f]{64}")
BIG_RECORDS = 140_000  # about 20 MB of canonical JSON
RECORD_97 = {"id": 97, "name": "record 97", "body": "00000097" + "x" * 90}
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


@functools.cache
def records(count: int = BIG_RECORDS) -> dict[str, Any]:
    return {
        "records": [
            {"id": i, "name": f"record {i}", "body": f"{i:08d}" + "x" * 90} for i in range(count)
        ]
    }


def next_step(outputs: list[str], tool: str = "big_records") -> tuple[str, Any]:
    """The scripted agent: call ``tool``, read /records/97 by the ref it got, answer with it."""
    if not outputs:
        return "call", (tool, {})
    if len(outputs) == 1:
        match = REF.search(outputs[0])
        assert match is not None, outputs[0][:500]
        return "call", ("read_exact", {"exact_ref": match.group(0), "pointer": "/records/97"})
    return "final", outputs[1]


def check_answer(tool_text: str, answer: str) -> None:
    assert len(tool_text.encode()) <= 16000
    assert "kind: fallback" in tool_text
    read = msgspec.json.decode(answer)
    assert read["state"] == "found"
    assert read["part"]["value"] == RECORD_97


@pytest.fixture
def compactor(tmp_path: Path) -> Compactor:
    return Compactor(harness=rc.Harness(fs=rc.LocalWorkspace(tmp_path)))


# --------------------------------------------------------------------------- OpenAI Agents SDK


def agents_model(tool: str) -> Any:
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    def respond(call: Any) -> Any:
        outputs = [i["output"] for i in call.input if i.get("type") == "function_call_output"]
        kind, what = next_step(outputs, tool)
        if kind == "final":
            return ModelStep(output=[assistant_message(what)])
        name, args = what
        return ModelStep(output=[function_call(name, args, call_id=f"call-{len(outputs)}")])

    return ScriptedModel([ModelStep.respond(respond) for _ in range(3)])


async def run_agents(tool: Any, compactor: Compactor) -> tuple[str, str]:
    from agents import Agent, RunConfig, Runner

    from response_compaction.integrations.openai_agents import read_exact_tool

    model = agents_model(tool.name)
    agent = Agent(name="reader", model=model, tools=[tool, read_exact_tool(compactor)])
    result = await Runner.run(agent, "find record 97", run_config=RunConfig(tracing_disabled=True))
    model.assert_complete()
    items: list[Any] = result.to_input_list()
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    return str(outputs[0]["output"]), str(result.final_output)


@asyncio_only
async def test_openai_agents_async_tool(compactor: Compactor) -> None:
    """openai-agents: a 20 MB coroutine tool result is compacted and /records/97 read back."""
    pytest.importorskip("agents")
    from response_compaction.integrations.openai_agents import compacted_tool

    @compacted_tool(compactor)
    async def big_records() -> dict[str, Any]:
        """Every record."""
        return records()

    check_answer(*await run_agents(big_records, compactor))


@asyncio_only
async def test_openai_agents_sync_tool_runs_in_a_thread(compactor: Compactor) -> None:
    """openai-agents: a plain-function tool runs in a worker thread, compacted on the loop."""
    pytest.importorskip("agents")
    from response_compaction.integrations.openai_agents import compacted_tool

    on_loop_thread: list[bool] = []

    def big_records() -> str:
        """Every record, as JSON text."""
        on_loop_thread.append(threading.current_thread() is threading.main_thread())
        return msgspec.json.encode(records(3000)).decode()

    tool = compacted_tool(compactor, big_records, name_override="big_records")
    tool_text, answer = await run_agents(tool, compactor)
    assert on_loop_thread == [False]
    assert "kind: exact" not in tool_text
    assert msgspec.json.decode(answer)["part"]["value"] == RECORD_97


# --------------------------------------------------------------------------- Pydantic AI


def pydantic_ai_model(tool: str) -> Any:
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        parts = [p for m in messages for p in getattr(m, "parts", [])]
        outputs = [str(p.content) for p in parts if isinstance(p, ToolReturnPart)]
        kind, what = next_step(outputs, tool)
        if kind == "final":
            return ModelResponse(parts=[TextPart(what)])
        return ModelResponse(parts=[ToolCallPart(*what)])

    return FunctionModel(respond)


async def run_pydantic_ai(tool: Any, compactor: Compactor) -> tuple[str, str]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ToolReturnPart

    from response_compaction.integrations.pydantic_ai import read_exact_tool

    agent = Agent(pydantic_ai_model(tool.name), tools=[tool, read_exact_tool(compactor)])
    result = await agent.run("find record 97")
    parts = [p for m in result.all_messages() for p in getattr(m, "parts", [])]
    returns = [p for p in parts if isinstance(p, ToolReturnPart)]
    return str(returns[0].content), str(result.output)


@asyncio_only
async def test_pydantic_ai_async_tool(compactor: Compactor) -> None:
    """pydantic-ai: a 20 MB tool result (a pydantic model) is compacted and read back."""
    pytest.importorskip("pydantic_ai")
    from pydantic import BaseModel

    from response_compaction.integrations.pydantic_ai import compacted_tool

    class Record(BaseModel):
        id: int
        name: str
        body: str

    class Records(BaseModel):
        records: list[Record]

    big = Records.model_validate(records())

    @compacted_tool(compactor)
    async def big_records() -> Records:
        """Every record."""
        return big

    check_answer(*await run_pydantic_ai(big_records, compactor))


@asyncio_only
async def test_pydantic_ai_sync_tool_runs_in_a_thread(compactor: Compactor) -> None:
    """pydantic-ai: a plain-function tool runs where Pydantic AI runs it (here the thread
    executor the caller chose: a compacted tool ran in anyio's pool, outside Pydantic AI's
    thread rules and tool timeout), and is compacted on the loop."""
    pytest.importorskip("pydantic_ai")
    from concurrent.futures import ThreadPoolExecutor

    from pydantic_ai import Agent

    from response_compaction.integrations.pydantic_ai import compacted_tool

    threads: list[str] = []

    def big_records() -> dict[str, Any]:
        """Every record."""
        threads.append(threading.current_thread().name)
        return records(3000)

    executor = ThreadPoolExecutor(1, thread_name_prefix="chosen")
    with executor, Agent.using_thread_executor(executor):
        tool_text, answer = await run_pydantic_ai(compacted_tool(compactor, big_records), compactor)
    assert threads == ["chosen_0"]
    assert "exact_ref: rc1:" in tool_text
    assert msgspec.json.decode(answer)["part"]["value"] == RECORD_97


@asyncio_only
async def test_plain_and_coroutine_tools_of_one_agent_are_both_summarized(
    tmp_path: Path,
) -> None:
    """Called as every framework calls them (a coroutine function awaited, a plain function in
    a worker thread), tools of both kinds share one model client: a plain function's result
    went through the blocking facade's loop, where the client bound to the agent's loop
    failed, and got the fallback (error)."""
    with FakeOpenAI(fill_unscripted=True) as server:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="test") as client:
            llm = rc.OpenAICatalog(client, {"default": ["m"]})
            harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path / "ws"), llm=llm)
            compactor = Compactor(harness=harness)

            async def coroutine_tool(n: int) -> dict[str, Any]:
                return records(n)

            def plain_tool(n: int) -> dict[str, Any]:
                return records(n)

            texts = []
            for n, tool in enumerate([coroutine_tool, plain_tool] * 2, start=3000):
                wrapped = compactor.wrap(tool)
                if inspect.iscoroutinefunction(wrapped):
                    texts.append(await wrapped(n))
                else:
                    texts.append(await anyio.to_thread.run_sync(wrapped, n))
    assert [text.splitlines()[0] for text in texts] == ["kind: summarized"] * 4
    assert len(server.bodies("m")) == 4


# --------------------------------------------------------------------------- LangChain


def langchain_model(tool: str) -> Any:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class ScriptedChatModel(GenericFakeChatModel):
        """LangChain's fake chat model, answering from the conversation instead of a list."""

        def bind_tools(self, tools: Any, **options: Any) -> Any:
            return self

        def _generate(self, messages: list[Any], *args: Any, **options: Any) -> ChatResult:
            outputs = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
            kind, what = next_step(outputs, tool)
            if kind == "final":
                message = AIMessage(content=what)
            else:
                name, args_ = what
                call = {"name": name, "args": args_, "id": f"call-{len(outputs)}"}
                message = AIMessage(content="", tool_calls=[call])
            return ChatResult(generations=[ChatGeneration(message=message)])

    return ScriptedChatModel(messages=iter(()))


def langchain_texts(state: dict[str, Any]) -> tuple[str, str]:
    from langchain_core.messages import ToolMessage

    tool_messages = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    return str(tool_messages[0].content), str(state["messages"][-1].content)


@asyncio_only
async def test_langchain_async_tool(compactor: Compactor) -> None:
    """LangChain v1 create_agent (ainvoke): a 20 MB tool result is compacted and read back."""
    pytest.importorskip("langchain")
    from langchain.agents import create_agent

    from response_compaction.integrations.langchain import compacted_tool, read_exact_tool

    @compacted_tool(compactor)
    async def big_records() -> dict[str, Any]:
        """Every record."""
        return records()

    agent = create_agent(langchain_model("big_records"), [big_records, read_exact_tool(compactor)])
    state = await agent.ainvoke({"messages": [{"role": "user", "content": "find record 97"}]})
    check_answer(*langchain_texts(state))


@asyncio_only
@pytest.mark.parametrize("kind", ["async", "sync", "sync via ainvoke"])
async def test_langchain_content_and_artifact_compacts_the_content_only(
    compactor: Compactor, kind: str
) -> None:
    """A tool returning (content, artifact): the content compacted, the artifact (kept from
    the model by LangChain) as it came; the wrapper returned text where a pair was needed."""
    pytest.importorskip("langchain_core")
    from langchain_core.messages import ToolMessage

    from response_compaction.integrations.langchain import compacted_tool

    artifact = object()

    def pair() -> tuple[dict[str, Any], object]:
        return records(3000), artifact

    async def pair_async() -> tuple[dict[str, Any], object]:
        return pair()

    fn = pair_async if kind == "async" else pair
    fn.__doc__ = "Every record, and a handle."
    built = compacted_tool(compactor, fn, response_format="content_and_artifact")
    call = {"name": built.name, "args": {}, "id": "call-1", "type": "tool_call"}
    if kind == "sync":
        message = await anyio.to_thread.run_sync(built.invoke, call)
    else:  # a plain function's tool has a coroutine too: run in a thread, compacted here
        assert getattr(built, "coroutine", None) is not None
        message = await built.ainvoke(call)
    assert isinstance(message, ToolMessage)
    assert message.artifact is artifact
    assert isinstance(message.content, str)
    assert "exact_ref: rc1:" in message.content
    assert len(message.content.encode()) <= 16000


@asyncio_only
async def test_langchain_plain_tool_without_an_inferred_schema_keeps_its_coroutine(
    compactor: Compactor,
) -> None:
    """infer_schema=False makes a Tool, not a StructuredTool: its coroutine was left unset,
    so ainvoke compacted through the blocking facade's loop."""
    pytest.importorskip("langchain_core")
    from response_compaction.integrations.langchain import compacted_tool

    def big(query: str) -> dict[str, Any]:
        """Every record."""
        return records(3000)

    built = compacted_tool(compactor, big, infer_schema=False)
    assert getattr(built, "coroutine", None) is not None
    assert "exact_ref: rc1:" in await built.ainvoke("q")


def test_langchain_middleware_on_a_sync_agent(compactor: Compactor) -> None:
    """LangChain middleware on a sync agent (invoke): every large result compacted, read back."""
    pytest.importorskip("langchain")
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    from response_compaction.integrations.langchain import CompactionMiddleware

    @tool
    def big_records() -> dict[str, Any]:
        """Every record."""
        return records(3000)

    middleware = CompactionMiddleware(compactor)
    agent = create_agent(langchain_model("big_records"), [big_records], middleware=[middleware])
    state = agent.invoke({"messages": [{"role": "user", "content": "find record 97"}]})
    tool_text, answer = langchain_texts(state)
    assert "exact_ref: rc1:" in tool_text
    assert msgspec.json.decode(answer)["part"]["value"] == RECORD_97


@asyncio_only
async def test_langchain_middleware_passes_small_results(compactor: Compactor) -> None:
    """The middleware leaves a result under the threshold unchanged (nothing stored)."""
    pytest.importorskip("langchain")
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    from response_compaction.integrations.langchain import CompactionMiddleware

    @tool
    async def big_records() -> str:
        """A small answer (the scripted model then reads a ref it cannot find)."""
        return "just this"

    agent = create_agent(
        langchain_model("big_records"), [big_records], middleware=[CompactionMiddleware(compactor)]
    )
    with pytest.raises(AssertionError, match="just this"):
        await agent.ainvoke({"messages": [{"role": "user", "content": "hi"}]})
    assert entry_files(store_root(compactor.harness.fs)) == set()


@asyncio_only
async def test_langchain_middleware_compacts_list_content(compactor: Compactor) -> None:
    """A tool returning a list keeps it as list content; it was measured as text only, so
    780 KB of it went to the model uncompacted (adversarial review)."""
    pytest.importorskip("langchain")
    from langchain_core.tools import tool

    from response_compaction.integrations.langchain import CompactionMiddleware

    @tool
    def list_rows() -> list[str]:
        """Rows, as a list of strings."""
        return [f"row {i}: card 4111-1111-1111-{i:04d}" for i in range(20_000)]

    call = {"name": "list_rows", "args": {}, "id": "1", "type": "tool_call"}

    async def handler(request: Any) -> Any:
        return await list_rows.ainvoke(request.tool_call)

    middleware = CompactionMiddleware(compactor)
    message = await middleware.awrap_tool_call(SimpleNamespace(tool_call=call), handler)
    assert isinstance(message.content, str)
    assert "exact_ref: rc1:" in message.content
    assert len(message.content.encode()) <= compactor.text_bytes


# --------------------------------------------------------------------------- shared core


async def test_read_back_is_capped_and_errors_are_answers(compactor: Compactor) -> None:
    """The read-back never exceeds the cap, and a bad pointer is an answer, not an exception."""
    small = Compactor(harness=compactor.harness, max_bytes=2000)
    text = await small.compact(records(3000))
    match = REF.search(text)
    assert match is not None
    whole = msgspec.json.decode(await small.read(match.group(0), "/records", max_bytes=10**9))
    assert whole["state"] == "found"
    assert len(msgspec.json.encode(whole["part"]["value"])) <= 2000
    assert whole["part"]["next_start"] > 0
    nothing = msgspec.json.decode(await small.read(match.group(0), pointer="/nope"))
    assert nothing["state"] == "error"
    missing = msgspec.json.decode(await small.read("rc1:" + "0" * 64))
    assert missing == {"state": "missing"}
    wrong = await small.read(match.group(0), "/records", max_bytes="9")  # type: ignore[arg-type]
    assert msgspec.json.decode(wrong) == {
        "state": "error",
        "detail": "max_bytes must be an int, got str",
    }
    lone = msgspec.json.decode(await small.read(match.group(0), "/records/\ud800"))
    assert lone == {
        "state": "error",
        "detail": "pointer is not valid Unicode (it holds a lone surrogate)",
    }


async def test_text_that_only_a_string_keeps_exactly_is_kept_as_the_string(
    compactor: Compactor, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON nested too deeply to decode stays the string; bytes that are not UTF-8 are kept
    as text with U+FFFD, and a warning says so (without the content)."""
    deep = "[" * 5000 + "]" * 5000
    assert await stored(compactor, await compactor.compact(deep)) == deep
    raw = b"SECRET-MARKER \xff\xfe " + b"x" * 40000
    with caplog.at_level(logging.WARNING, logger="response_compaction"):
        text = await compactor.compact(raw)
    assert await stored(compactor, text) == raw.decode("utf-8", "replace")
    assert "not UTF-8" in caplog.text
    assert "SECRET" not in caplog.text


async def stored(compactor: Compactor, text: str) -> object:
    match = REF.search(text)
    assert match is not None
    found = await rc.response_compaction_read_exact(compactor.harness, match.group(0), Any)
    assert isinstance(found, rc.Found)
    value: object = found.value
    return value


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview], ids=lambda k: k.__name__)
async def test_bytes_of_every_kind_are_retained_as_the_json_they_hold(
    compactor: Compactor, kind: Any
) -> None:
    """A bytearray or memoryview of JSON was stored as a base64 string of its bytes."""
    data = msgspec.json.encode(records(400))

    async def tool() -> Any:
        return kind(data)

    assert await stored(compactor, await compactor.wrap(tool)()) == records(400)


@pytest.mark.parametrize("shape", [list, dict], ids=["list", "dict"])
async def test_a_list_or_dict_of_pydantic_models_is_retained(
    compactor: Compactor, shape: Any
) -> None:
    """Only a model at the top was made plain data: ``list[Model]``, a common tool's return
    type, failed the tool call (ValueError: PM is unsupported)."""
    import pydantic

    class Record(pydantic.BaseModel):
        id: int
        name: str

    models = [Record(id=i, name=f"record {i}") for i in range(3)]
    result = models if shape is list else {f"r{m.id}": m for m in models}

    def tool() -> Any:
        return result

    plain = [{"id": i, "name": f"record {i}"} for i in range(3)]
    expected = plain if shape is list else {f"r{i}": p for i, p in enumerate(plain)}
    assert await stored(compactor, await compactor.wrap(tool)()) == expected


async def test_an_async_callable_object_is_awaited_not_stored(compactor: Compactor) -> None:
    """Ones ``inspect.iscoroutinefunction`` does not see (an object with an async __call__, a
    plain decorator's wrapper): their coroutine is awaited, not handed to the store."""

    class Search:
        async def __call__(self) -> dict[str, Any]:
            return records(400)

    def logged(fn: Callable[[], Any]) -> Callable[[], Any]:
        @functools.wraps(fn)
        def call() -> Any:
            return fn()

        return call

    async def search() -> dict[str, Any]:
        return records(401)

    assert await stored(compactor, await compactor.wrap(Search())()) == records(400)
    assert await stored(compactor, await compactor.wrap(logged(search))()) == records(401)


async def test_a_plain_function_that_runs_a_coroutine_itself_runs_off_the_loop(
    compactor: Compactor,
) -> None:
    """A blocking facade over a coroutine function (``functools.wraps`` and ``asyncio.run``)
    is a plain function: it was taken for a coroutine function and run on the loop, where
    ``asyncio.run`` raised."""

    async def fetch() -> dict[str, Any]:
        return records(400)

    @functools.wraps(fetch)
    def fetch_blocking() -> Any:
        return asyncio.run(fetch())

    assert await stored(compactor, await compactor.wrap(fetch_blocking)()) == records(400)


async def test_the_read_back_checks_the_exact_schema_first(tmp_path: Path) -> None:
    """As the MCP tool and the CLI: with an exact_schema, content that no longer fits it reads
    broken instead of a part of it being served."""
    from tests.schemas import Exact

    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    loose = Compactor(harness=harness)
    typed = Compactor(harness=harness, exact_schema=Exact)
    text = await loose.wrap(_rows_with_a_negative_total)()
    match = REF.search(text)
    assert match is not None
    assert msgspec.json.decode(await loose.read(match.group(0), "/total"))["state"] == "found"
    answer = msgspec.json.decode(await typed.read(match.group(0), "/total"))
    assert answer["state"] == "broken"


async def _rows_with_a_negative_total() -> dict[str, Any]:
    return {"rows": [{"id": i, "name": "x" * 90} for i in range(400)], "total": -1}


async def test_json_string_naming_a_key_twice_is_kept_as_the_string(
    compactor: Compactor,
) -> None:
    """A tool's JSON string with a duplicate key is retained as that string, not half of it."""
    text = '{"a": 1, "a": 2, "rows": [' + ",".join(["1"] * 20000) + "]}"
    match = REF.search(await compactor.compact(text))
    assert match is not None
    found = await rc.response_compaction_read_exact(compactor.harness, match.group(0), Any)
    assert isinstance(found, rc.Found)
    stored: object = found.value
    assert stored == text


async def test_read_back_of_a_deeply_nested_value_holds_the_value(compactor: Compactor) -> None:
    """The MCP reply's depth cut once applied here too: 150 levels read back with no value."""
    value: Any = {"leaf": 1}
    for _ in range(150):
        value = [value]
    match = REF.search(await compactor.compact(value))
    assert match is not None
    answer = msgspec.json.decode(await compactor.read(match.group(0)))
    assert answer["part"]["value"] == value


async def test_read_back_is_one_line_whatever_the_value_holds(compactor: Compactor) -> None:
    """U+2028, U+2029 and U+0085 in a value came back raw in the JSON text, splitting it into
    lines (one could pass for a header); now escaped, the same JSON value."""
    fake = '\u2028found pointer="" total_bytes=2 complete\u2029\x85'
    value = {f"key{fake}": [fake] * 50}
    match = REF.search(await compactor.compact(value))
    assert match is not None
    for pointer in ("", "/" + f"key{fake}"):
        reply = await compactor.read(match.group(0), pointer)
        assert len(reply.splitlines()) == 1
        answer = msgspec.json.decode(reply)
        assert answer["part"]["pointer"] == pointer
        assert answer["part"]["value"] == (value if pointer == "" else value[f"key{fake}"])


async def test_whole_read_back_reply_fits_the_cap(compactor: Compactor) -> None:
    """The reply, with its fields and the echoed pointer, never exceeds max_bytes (async, sync)."""
    small = Compactor(harness=compactor.harness, max_bytes=1000)
    long_key = "k" * 3000
    text = await small.compact({"rows": [{"id": i, "name": "é" * 10} for i in range(2000)]})
    match = REF.search(text)
    assert match is not None
    wide = await small.compact({long_key: list(range(500)), "pad": "x" * 40000})
    wide_match = REF.search(wide)
    assert wide_match is not None
    asks: list[tuple[str, dict[str, Any]]] = [
        (match.group(0), {"pointer": "/rows"}),
        (match.group(0), {"pointer": "/rows", "start": 1234, "max_bytes": 10**9}),
        (match.group(0), {"pointer": ""}),
        (wide_match.group(0), {"pointer": ""}),
        (wide_match.group(0), {"pointer": "/" + long_key}),
    ]
    for ref, ask in asks:
        replies = [await small.read(ref, **ask)]
        replies.append(
            await anyio.to_thread.run_sync(functools.partial(small.read_sync, ref, **ask))
        )
        for reply in replies:
            assert len(reply.encode()) <= 1000, reply[:200]
            assert msgspec.json.decode(reply)["state"] in ("found", "error")


@pytest.mark.parametrize(
    ("module", "package", "extra"),
    [
        ("openai_agents", "agents", "openai-agents"),
        ("pydantic_ai", "pydantic_ai", "pydantic-ai"),
        ("langchain", "langchain_core", "langchain"),
    ],
)
def test_missing_framework_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, compactor: Compactor, module: str, package: str, extra: str
) -> None:
    """Without the framework, building a tool raises ModuleNotFoundError naming the extra."""
    for name in list(sys.modules):
        if name == package or name.startswith(package + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)
    monkeypatch.delitem(sys.modules, f"response_compaction.integrations.{module}", raising=False)

    def build() -> Any:
        adapter = importlib.import_module(f"response_compaction.integrations.{module}")
        return adapter.read_exact_tool(compactor)

    with pytest.raises(ModuleNotFoundError, match=re.escape(f"response-compaction[{extra}]")):
        build()
