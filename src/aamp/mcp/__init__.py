"""The MCP server (the official `mcp` package): aamp's sandboxes and agent runs as tools for
outside agents, under the caller's own grants, policies and audit.

- `tools` — the tools, each one call (or a few) of the /v1 API through the SDK with the
  caller's token: no second authorisation path (`build_server`);
- `http` — `/mcp` over streamable HTTP beside the API in `aamp up` (`with_mcp`), its tools
  reaching that API in process (`in_process`), their SDK clients kept per token (`clients`);
- `stdio` — `aamp mcp`, over stdio (`serve_stdio`).
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    http: MCP_PATH with_mcp
    stdio: serve_stdio
    tools: build_server
    """,
)
