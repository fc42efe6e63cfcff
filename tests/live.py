"""Against a real OpenAI-compatible server: the README model example and the CLI (``nox -s live``).

Not part of the test suite (it needs a server and takes minutes on a CPU model). Reads:

- ``OPENAI_BASE_URL`` (required), ``OPENAI_API_KEY`` (default ``unused``),
- ``RESPONSE_COMPACTION_MODEL`` (default ``smollm2``, what ``local-llm.sh`` serves),
- ``LIVE_TIMEOUT_MS`` (default 120000) and ``LIVE_BYTES`` (default 200000): the budget, and
  the size of the document the CLI compacts.

Prints each run's output, receipt and wall time. Exits 1 when a run does not come back
``summarized``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


_LOGGING = """import logging
logging.basicConfig(format="log: %(message)s")
logging.getLogger("response_compaction").setLevel(logging.DEBUG)
"""


def readme_model_example(timeout_ms: int) -> str:
    """The README's model example, with its budget set to ``timeout_ms``."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", readme, flags=re.MULTILINE | re.DOTALL)
    code = next(b for b in blocks if "OpenAICatalog" in b)
    patched, count = re.subn(r'"timeout_ms": \d+', f'"timeout_ms": {timeout_ms}', code)
    if count != 1:
        raise SystemExit("the README model example has no timeout_ms to set")
    return patched


def log_search(size: int) -> dict[str, object]:
    """A log search result of about ``size`` bytes, with a few ERROR and one FATAL record."""
    hits: list[dict[str, object]] = []
    i, total = 0, 2
    while total < size:  # the length of json.dumps(hits), kept as it grows
        level = "FATAL" if i == 1234 else "ERROR" if i % 37 == 0 else "INFO"
        hit = {"id": i, "level": level, "service": f"svc-{i % 5}", "msg": f"request {i} ok"}
        hits.append(hit)
        total += len(json.dumps(hit)) + (2 if i else 0)
        i += 1
    return {"took_ms": 42, "total": len(hits), "hits": hits}


def run(
    label: str, command: list[str], env: dict[str, str], cwd: str, stdin: bytes | None = None
) -> bool:
    print(f"== {label}", flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, input=stdin, capture_output=True, env=env, cwd=cwd, check=False)
    seconds = time.perf_counter() - started
    sys.stdout.write(done.stdout.decode())
    sys.stdout.write(done.stderr.decode())
    print(f"-- exit {done.returncode}, {seconds:.1f} s wall", flush=True)
    return done.returncode == 0 and "summarized" in done.stdout.decode()


_BOUNDED = """
import asyncio, json, os, sys, time
from typing import Annotated
import msgspec, openai
import response_compaction as rc

class Brief(msgspec.Struct):
    overview: Annotated[str, msgspec.Meta(max_length=300)]
    critical_facts: Annotated[
        list[Annotated[str, msgspec.Meta(max_length=120)]], msgspec.Meta(max_length=5)
    ]

async def main() -> None:
    model = os.environ["RESPONSE_COMPACTION_MODEL"]
    document = msgspec.Raw(sys.stdin.buffer.read())
    async with openai.AsyncOpenAI() as client:
        catalog = rc.OpenAICatalog(client, {"cheap": [model]}, schema_dialect="full")
        harness = rc.Harness(fs=rc.LocalWorkspace("bounded-ws"), llm=catalog)
        options = {"ladder": "cheap", "fallback": Brief(overview="-", critical_facts=[]),
                   "timeout_ms": int(os.environ["LIVE_TIMEOUT_MS"])}
        compacted = await rc.response_compact(harness, document, dict, Brief, options)
    print(compacted.output.kind, msgspec.json.encode(compacted.output.value).decode())
    print(msgspec.json.encode(compacted.receipt).decode())

asyncio.run(main())
"""


def main() -> int:
    if not os.environ.get("OPENAI_BASE_URL"):
        print("set OPENAI_BASE_URL to an OpenAI-compatible /v1 URL", file=sys.stderr)
        return 2
    timeout_ms = int(os.environ.get("LIVE_TIMEOUT_MS", "120000"))
    size = int(os.environ.get("LIVE_BYTES", "200000"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.setdefault("OPENAI_API_KEY", "unused")
    env.setdefault("RESPONSE_COMPACTION_MODEL", "smollm2")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "readme_example.py"
        # The example as written, plus the library's log records (one per model call, no
        # content) on stderr, so a fallback says why.
        script.write_text(_LOGGING + readme_model_example(timeout_ms))
        ok &= run("README model example", [sys.executable, str(script)], env, tmp)
        document = json.dumps(log_search(size)).encode()
        print(f"(CLI document: {len(document)} bytes)")
        command = [sys.executable, "-m", "response_compaction", "compact", "-"]
        command += ["--root", str(Path(tmp) / "ws"), "--timeout-ms", str(timeout_ms)]
        ok &= run("CLI compact", command, env, tmp, stdin=document)
        # The same document, a summary schema with length bounds, schema_dialect="full": the
        # server's grammar then bounds what a small model can write (SmolLM2-135M otherwise
        # repeats itself to the token bound at temperature 0).
        bounded = Path(tmp) / "bounded.py"
        bounded.write_text(_LOGGING + _BOUNDED)
        live_env = {**env, "LIVE_TIMEOUT_MS": str(timeout_ms)}
        run("bounded schema, full dialect", [sys.executable, str(bounded)], live_env, tmp, document)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
