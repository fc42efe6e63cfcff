"""A scripted OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1, for tests.

Every request is answered by the behaviour scripted for its ``model``: a JSON reply (any
content, refusal, finish reason and usage), an HTTP error status, a reply held until the test
releases it, or a hang that lasts until the server shuts down. A server made with
``fill_unscripted=True`` answers unscripted models with a value that fills in the requested
schema (for CLI, sync and README tests that only need "a model that works"). It counts TCP
connections, so a test can tell whether a client reused its connection. The server runs in a
background thread (stdlib ``ThreadingHTTPServer``), so it works the same under asyncio and
trio, and it logs every request (parsed JSON body, arrival per model) for the test to inspect.
Nothing here sleeps: a held request waits on a ``threading.Event``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio.to_thread

__all__ = [
    "ABSENT",
    "USAGE",
    "Body",
    "FakeOpenAI",
    "Hang",
    "Held",
    "Reply",
    "Status",
    "Usage",
    "fake_openai",
    "instance_of",
    "summary_reply",
]


class _Absent:
    """The ``usage`` key is left out of the reply altogether."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()
#: A held or hung request gives up after this long, so a broken library fails a test (the
#: hang becomes a dropped connection or a late reply) instead of hanging the run.
HOLD_LIMIT_S = 30.0
Usage = dict[str, Any] | _Absent | None
USAGE: dict[str, Any] = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


@dataclass(frozen=True)
class Reply:
    """A 200 chat completion with exactly this message, finish reason and usage."""

    content: str | None
    refusal: str | None = None
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=lambda: dict(USAGE))
    served: str | None = None  # the ``model`` the reply names (default: the requested one)


@dataclass(frozen=True)
class Status:
    """An HTTP error in OpenAI's error shape; retryable statuses say "retry after 1 ms".

    ``error`` replaces the whole ``error`` object (e.g. llama.cpp's overflow body).
    """

    code: int
    message: str = "scripted failure"
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class Body:
    """A 200 reply whose body is these raw bytes (for bodies that are not a completion)."""

    data: bytes
    content_type: str = "application/json"


@dataclass(frozen=True)
class Hang:
    """Never answer: block until the client hangs up (counted in ``hangups``), the server
    shuts down, or HOLD_LIMIT_S passes; then drop the socket."""


@dataclass(frozen=True)
class Held:
    """Answer with ``then`` once the test calls :meth:`FakeOpenAI.release` (slow-then-valid).

    A hold that is never released ends after HOLD_LIMIT_S.
    """

    then: Reply | Status | Body


Behaviour = Reply | Status | Body | Hang | Held


def summary_reply(value: Any, *, usage: Usage = USAGE, finish_reason: str = "stop") -> Reply:
    """A reply whose content is ``value`` as JSON (``usage=ABSENT`` leaves usage out)."""
    return Reply(content=json.dumps(value), usage=usage, finish_reason=finish_reason)


def instance_of(schema: dict[str, Any], name: str = "value") -> Any:
    """A small value that validates against a strict structured-output JSON schema."""
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    if "anyOf" in schema:
        return instance_of(schema["anyOf"][0], name)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        return {key: instance_of(sub, key) for key, sub in schema.get("properties", {}).items()}
    if kind == "array":
        return [instance_of(schema.get("items", {}), name)]
    return {"string": f"fake {name}", "integer": 1, "number": 1.5, "boolean": True}.get(str(kind))


@dataclass(frozen=True)
class Request:
    """One request as the server saw it."""

    model: str
    path: str
    body: dict[str, Any]
    handled_s: float = 0.0  # filled in by a copy once the reply is written


class FakeOpenAI:
    """The server. ``base_url`` goes to ``openai.AsyncOpenAI(base_url=...)``."""

    def __init__(self, *, fill_unscripted: bool = False) -> None:
        self.fill_unscripted = fill_unscripted
        self.connections = 0
        self.hangups = 0  # hung requests whose client closed the connection
        self._hangup = threading.Event()
        self._hanging = threading.Event()
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Behaviour]] = {}
        self._arrived: dict[str, threading.Event] = {}
        self._release = threading.Event()
        self._closing = threading.Event()
        self._open: set[socket.socket] = set()  # live client connections, woken at close
        self.requests: list[Request] = []
        self.errors: list[BaseException] = []
        self._http = _Server(("127.0.0.1", 0), _handler_for(self))
        self._http.owner = self
        host, port = self._http.server_address[:2]
        self.base_url = f"http://{host!s}:{port}/v1"
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    # -------------------------------------------------------------------- scripting

    def script(self, model: str, *behaviours: Behaviour) -> None:
        """Answer ``model``'s requests with ``behaviours`` in order; the last one repeats."""
        if not behaviours:
            raise ValueError("script at least one behaviour")
        with self._lock:
            self._scripts[model] = list(behaviours)

    def release(self) -> None:
        """Let every :class:`Held` request (now and later) answer."""
        self._release.set()

    # -------------------------------------------------------------------- the log

    def count(self, model: str | None = None) -> int:
        """How many requests arrived (for ``model``, or in all)."""
        with self._lock:
            return sum(1 for r in self.requests if model is None or r.model == model)

    def bodies(self, model: str | None = None) -> list[dict[str, Any]]:
        """The parsed JSON bodies, in arrival order."""
        with self._lock:
            return [r.body for r in self.requests if model is None or r.model == model]

    def arrived(self, model: str) -> threading.Event:
        """Set when the first request for ``model`` has arrived (before it is answered)."""
        with self._lock:
            return self._arrived.setdefault(model, threading.Event())

    async def wait_arrived(self, model: str, within: float = 10.0) -> None:
        """Wait (off the event loop) until a request for ``model`` arrives."""
        event = self.arrived(model)
        if not await anyio.to_thread.run_sync(event.wait, within, abandon_on_cancel=True):
            raise AssertionError(f"no request for {model!r} arrived within {within} s")

    # -------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._thread.start()

    def __enter__(self) -> FakeOpenAI:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Free every blocked handler, stop serving, and wait for the handler threads."""
        self._closing.set()
        self._release.set()
        self._http.shutdown()
        with self._lock:
            idle = list(self._open)
        for sock in idle:  # an idle keep-alive connection would hold its thread for 30 s
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RD)
        self._http.server_close()  # joins the handler threads (block_on_close)
        self._thread.join()

    # -------------------------------------------------------------------- serving

    def _next(self, model: str, body: dict[str, Any]) -> Behaviour | None:
        """The model's next scripted behaviour (called holding the lock)."""
        script = self._scripts.get(model)
        if not script:
            if not self.fill_unscripted:
                return None
            response_format = body.get("response_format") or {}
            schema = response_format.get("json_schema", {}).get("schema", {})
            return summary_reply(instance_of(schema))
        return script.pop(0) if len(script) > 1 else script[0]

    def _arrive(self, request: Request, chat: bool) -> tuple[int, Behaviour | None]:
        """Log ``request`` and take its behaviour under one lock: requests get their scripted
        behaviours in the order they are logged (``requests``), whatever threads interleave."""
        with self._lock:
            self.requests.append(request)
            self._arrived.setdefault(request.model, threading.Event()).set()
            behaviour = self._next(request.model, request.body) if chat else None
            return len(self.requests) - 1, behaviour

    def _hung_up(self) -> None:
        with self._lock:
            self.hangups += 1
        self._hangup.set()

    async def wait_hangup(self, within: float = 10.0) -> None:
        """Wait (off the event loop) until a client drops a hung request's connection."""
        if not await anyio.to_thread.run_sync(self._hangup.wait, within, abandon_on_cancel=True):
            raise AssertionError(f"no client dropped a hung connection within {within} s")

    async def wait_hanging(self, within: float = 10.0) -> None:
        """Wait (off the event loop) until a request is being hung (its client is parked).

        Set once, by the first hung request (or any request after the server began closing).
        """
        if not await anyio.to_thread.run_sync(self._hanging.wait, within, abandon_on_cancel=True):
            raise AssertionError(f"no request was hung within {within} s")

    def _handled(self, index: int, seconds: float) -> None:
        with self._lock:
            old = self.requests[index]
            self.requests[index] = Request(old.model, old.path, old.body, seconds)


def _completion(model: str, reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.refusal is not None:
        message["refusal"] = reply.refusal
    out: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_900_000_000,
        "model": reply.served or model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": reply.finish_reason, "logprobs": None}
        ],
    }
    if not isinstance(reply.usage, _Absent):
        out["usage"] = reply.usage
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    owner: FakeOpenAI

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away (cancelled, timed out) is expected; keep anything else.
        import sys

        exc = sys.exc_info()[1]
        if exc is not None and not isinstance(exc, ConnectionError):
            self.owner.errors.append(exc)


def _handler_for(owner: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in separate writes
        timeout = 30  # a keep-alive connection a test forgot to close cannot pin a thread

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            with owner._lock:
                owner.connections += 1
                owner._open.add(self.connection)

        def finish(self) -> None:
            with owner._lock:
                owner._open.discard(self.connection)
            super().finish()

        def do_POST(self) -> None:
            started = time.perf_counter()
            length = int(self.headers.get("content-length", "0"))
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                self._json(400, {"error": {"message": "body is not JSON"}})
                return
            model = str(body.get("model", ""))
            chat = self.path.endswith("/chat/completions")
            index, behaviour = owner._arrive(Request(model=model, path=self.path, body=body), chat)
            if not chat:
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            if isinstance(behaviour, Held):
                owner._release.wait(HOLD_LIMIT_S)
                behaviour = behaviour.then
            if isinstance(behaviour, Hang) or owner._closing.is_set():
                owner._hanging.set()
                self._wait_for_hangup()
                self.close_connection = True
                return
            if behaviour is None:
                self._json(404, {"error": {"message": f"model {model!r} is not scripted"}})
            elif isinstance(behaviour, Status):
                error = behaviour.error or {
                    "message": behaviour.message,
                    "type": "scripted",
                    "code": None,
                }
                self._json(behaviour.code, {"error": error}, extra={"retry-after-ms": "1"})
            elif isinstance(behaviour, Body):
                self._send(200, behaviour.data, behaviour.content_type)
            else:
                self._json(200, _completion(model, behaviour))
            owner._handled(index, time.perf_counter() - started)

        def _wait_for_hangup(self) -> None:
            # Block until the server closes or the client drops the connection (a cancelled
            # request must close its socket so a real server can stop working on it).
            import select

            deadline = time.monotonic() + HOLD_LIMIT_S
            while not owner._closing.is_set() and time.monotonic() < deadline:
                readable, _, _ = select.select([self.connection], [], [], 0.01)
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    owner._hung_up()
                    return

        def _json(self, code: int, payload: Any, extra: dict[str, str] | None = None) -> None:
            self._send(code, json.dumps(payload).encode(), "application/json", extra)

        def _send(
            self, code: int, data: bytes, content_type: str, extra: dict[str, str] | None = None
        ) -> None:
            self.send_response(code)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextmanager
def fake_openai() -> Iterator[FakeOpenAI]:
    """A started server, closed (every blocked handler freed) on exit."""
    server = FakeOpenAI()
    server.start()
    try:
        yield server
    finally:
        server.close()
