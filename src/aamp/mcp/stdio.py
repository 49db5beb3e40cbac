"""`aamp mcp`: the MCP server over stdio, for desktop clients that start it as a command.

It acts, for every tool call, with the one token the CLI would use (`find_credentials`:
AAMP_TOKEN, the login profile, this host's installation token), through the API of the
control plane that token belongs to — so its calls are decided and audited there. One SDK
client serves the whole session.
"""

from __future__ import annotations

from aamp.client import AsyncClient, find_credentials
from aamp.config import Settings
from aamp.mcp.clients import CALL_TIMEOUT_SECONDS
from aamp.mcp.tools import build_server


def serve_stdio(settings: Settings) -> None:
    url, token = find_credentials(settings)  # refused now, not at the first tool call
    client = AsyncClient(url, token, timeout=CALL_TIMEOUT_SECONDS)

    async def client_for(_ctx: object) -> AsyncClient:
        return client

    build_server(client_for).run("stdio")
