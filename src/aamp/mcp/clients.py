"""The SDK clients `/mcp`'s tool calls act through: one per API token, kept, bounded, never
shared between tokens.

A tool call acts with its request's own token through the API (see `tools`). A new client
for every call would pay for a new connection to the API each time; so the client (and its
keep-alive connections) is kept per token instead — found by the token's digest, so two
tokens, and so two users, never share one; at most `limit` are kept (the least recently used
is closed first), each is closed after `idle_seconds` unused, and `drop` closes a token's
client at once when `/mcp` finds the token refused (revoked, expired, its user disabled).
Keeping a client grants nothing: the API authenticates and decides every request it sends.

Given `app` (the site app of this process, as `/mcp` does), a client's requests reach it in
process (`in_process.AsgiConnection`) instead of over a loopback socket: the same app, guard
and audit, without the second HTTP hop.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from functools import partial
from typing import Any

from aamp.client import AsyncClient
from aamp.mcp.in_process import AsgiConnection

MAX_CLIENTS = 64
IDLE_SECONDS = 300.0
CALL_TIMEOUT_SECONDS = 600.0  # a tool may wait this long for the API (a run's end, a big exec)


def _key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenClients:
    def __init__(
        self,
        api_url: str,
        *,
        app: Any = None,
        limit: int = MAX_CLIENTS,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self.api_url = api_url
        self.app = app
        self.limit = limit
        self.idle_seconds = idle_seconds
        self._kept: OrderedDict[str, tuple[AsyncClient, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    async def get(self, token: str) -> AsyncClient:
        """The client acting with `token` (kept, or new)."""
        await self._close_idle()
        key = _key(token)
        kept = self._kept.pop(key, None)
        client = kept[0] if kept else self._new(token)
        self._kept[key] = (client, time.monotonic())
        while len(self._kept) > self.limit:
            _, (oldest, _) = self._kept.popitem(last=False)
            await oldest.close()
        return client

    def _new(self, token: str) -> AsyncClient:
        if self.app is None:
            return AsyncClient(self.api_url, token, timeout=CALL_TIMEOUT_SECONDS)
        in_process = partial(AsgiConnection, self.app)
        return AsyncClient(self.api_url, token, timeout=CALL_TIMEOUT_SECONDS, connection=in_process)

    async def drop(self, token: str) -> None:
        """Close the client of a token that was refused (nothing happens if none is kept)."""
        kept = self._kept.pop(_key(token), None)
        if kept is not None:
            await kept[0].close()

    async def close(self) -> None:
        kept, self._kept = self._kept, OrderedDict()
        for client, _ in kept.values():
            await client.close()

    async def _close_idle(self) -> None:
        cutoff = time.monotonic() - self.idle_seconds
        while self._kept:
            key, (client, used) = next(iter(self._kept.items()))
            if used > cutoff:
                return
            del self._kept[key]
            await client.close()
