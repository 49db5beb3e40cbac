"""`aamp mcp`: the MCP server over stdio (`aamp.mcp.stdio`), for desktop MCP clients; it
acts with the CLI's token (AAMP_TOKEN, the login profile, or this host's installation)."""

from __future__ import annotations

import argparse

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from aamp.config import Settings


def mcp(args: argparse.Namespace, settings: Settings) -> int:
    from aamp.cli.command import CommandError
    from aamp.client import ClientError
    from aamp.mcp import serve_stdio

    try:
        serve_stdio(settings)
    except ClientError as exc:
        raise CommandError(exc.message) from None
    return 0
