"""A tiny OpenAI-compatible chat completions server on 127.0.0.1, for tests and README runs.

It answers every ``POST .../chat/completions`` with a JSON value that fills in the requested
``response_format`` schema (or a fixed ``summary``), speaks HTTP/1.1 keep-alive, and counts
requests and TCP connections, so a test can tell whether a client reused its connection. Run
it as a script to serve until stdin closes (it prints its base URL on the first line).
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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


class FakeOpenAI:
    """The server; ``base_url`` is what to hand ``openai.AsyncOpenAI(base_url=...)``."""

    def __init__(self, summary: dict[str, Any] | None = None) -> None:
        self.summary = summary
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with owner._lock:
                    owner.connections += 1

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with owner._lock:
                    owner.requests.append(body)
                if not self.path.endswith("/chat/completions"):
                    self._reply(404, {"error": {"message": "not found"}})
                    return
                self._reply(
                    200,
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", "fake"),
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {
                                    "role": "assistant",
                                    "content": json.dumps(owner._answer(body)),
                                },
                            }
                        ],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
                    },
                )

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _answer(self, body: dict[str, Any]) -> Any:
        if self.summary is not None:
            return self.summary
        schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
        return instance_of(schema)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


if __name__ == "__main__":
    with FakeOpenAI() as server:
        print(server.base_url, flush=True)
        sys.stdin.read()  # serve until stdin closes
