"""`aamp mcp`: the MCP server over stdio, for desktop clients that start it as a command.

It acts, for every tool call, with the one token the CLI would use (`find_credentials`:
AAMP_TOKEN, the login profile, this host's installation token), through the API of the
control plane that token belongs to — so its calls are decided and audited there.
"""

from __future__ import annotations

from aamp.client import find_credentials
from aamp.config import Settings
from aamp.mcp.tools import build_server


def serve_stdio(settings: Settings) -> None:
    url, token = find_credentials(settings)  # refused now, not at the first tool call
    build_server(lambda _ctx: (url, token)).run("stdio")
