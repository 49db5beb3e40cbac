"""A sandbox host's real link in the test's own event loop, for tests that register hosts
over HTTP: `link_app` served by `link_server` (TLS with the certificate `POST /v1/hosts`
issued, only replica client certificates admitted), serving the proof of a registration while
it is in flight — what `aamp host serve` does at registration, without starting a host."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from aamp.fleet.link_server import link_app, link_server
from aamp.sandbox.manager import SandboxManager


@dataclass
class ServedLink:
    host_id: str
    address: str
    proof: str | None = None
    heartbeat_secrets: list[str] = field(default_factory=list)  # one per life, in order

    async def register(
        self, client: httpx.AsyncClient, token: str, facts: dict[str, object]
    ) -> httpx.Response:
        """Register the host with its link, as `SandboxHost.register` does."""
        self.proof = secrets.token_urlsafe(32)
        try:
            response = await client.post(
                f"/v1/hosts/{self.host_id}/register",
                json={**facts, "link": self.address, "proof": self.proof},
                headers={"x-aamp-host-token": token},
            )
        finally:
            self.proof = None
        if response.status_code == 200:
            self.heartbeat_secrets.append(response.json()["heartbeat_secret"])
        return response


@contextlib.asynccontextmanager
async def served_link(
    directory: Path, added: dict[str, str], manager: SandboxManager | None = None
) -> AsyncIterator[ServedLink]:
    """The link of the host `added` (the answer of `POST /v1/hosts`), on a loopback port,
    over `manager` (None: a host that runs nothing, whose link only answers hello)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = []
    for name, key in (("host.crt", "link_cert"), ("host.key", "link_key"), ("ca.crt", "link_ca")):
        (directory / name).write_text(added[key])
        os.chmod(directory / name, 0o600)
        files.append(directory / name)
    link = ServedLink(added["host"]["id"], "")  # type: ignore[index]
    app = link_app(manager, lambda: 0, link.host_id, lambda: link.proof)  # type: ignore[arg-type]
    server = link_server(app, *files, "127.0.0.1", 0)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not serving.done(), "the link server stopped before it started"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        link.address = f"127.0.0.1:{port}"
        yield link
    finally:
        server.should_exit = True
        with contextlib.suppress(BaseException):
            await serving
