"""A small stdio MCP server for the proxy tests: tools whose results are 5 MB, and a few others.

Run as a script (``python tests/mcp_big_server.py``); the proxy starts it as its upstream.
"""

from __future__ import annotations

import os
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

RECORDS = 40_000  # about 5 MB of JSON
server = MCPServer("big-upstream", instructions="Tools with large results.")


def records(count: int = RECORDS) -> dict[str, Any]:
    """``{"records": [...]}``: record i is ``{"id": i, "name": ..., "body": ...}``."""
    return {
        "records": [
            {"id": i, "name": f"record {i}", "body": f"{i:08d}" + "x" * 90} for i in range(count)
        ]
    }


@server.tool()
def big_json(count: int = RECORDS) -> str:
    """A large JSON document, as text."""
    import json

    return json.dumps(records(count))


@server.tool()
def big_structured(count: int = RECORDS) -> dict[str, Any]:
    """A large JSON document, as structured content."""
    return records(count)


@server.tool()
def big_text() -> str:
    """Five megabytes of text that is not JSON."""
    return "line of log text\n" * 300_000


@server.tool()
def small() -> str:
    """A small result, passed through unchanged."""
    return '{"ok": true}'


@server.tool()
def fails() -> str:
    """Always fails: the error result must reach the host unchanged."""
    raise ValueError("upstream says no")


@server.tool()
def rpc_error() -> str:
    """Fails as a JSON-RPC error, which must reach the host with its code and message."""
    raise MCPError(-32042, "upstream protocol error")


@server.tool()
def env_names() -> list[str]:
    """The names of this server's environment variables that the proxy may withhold."""
    return sorted(n for n in os.environ if n.startswith(("OPENAI_", "RESPONSE_COMP", "GIVEN_")))


if os.environ.get("UPSTREAM_READ_EXACT"):

    @server.tool(name="read_exact")
    def upstream_read_exact(exact_ref: str = "") -> str:
        """The upstream's own tool named like the proxy's read tool."""
        return f"upstream read_exact of {len(exact_ref)} characters"


if __name__ == "__main__":
    server.run("stdio")
