"""A replica's end of the link to one sandbox host: `LinkClient` (create, describe, list,
destroy) and `LinkChannel`, which does for a sandbox on that host what `GuestChannel` does for
a local one (exec, run, put, get, browser) — through the host, never to the guest.

Every connection is TLS with the replica's client certificate from the link CA, and the
host must present the certificate issued for exactly the host id the replica means
(`link_name`, checked as the server name): a host holding someone else's certificate, or a
certificate from another CA, fails the handshake and is never sent a byte.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from aamp.errors import AampError
from aamp.fleet.link_ca import link_name
from aamp.sandbox.channel.errors import GuestError, GuestTimeout
from aamp.sandbox.channel.exec_session import ExecResult, Output
from aamp.sandbox.channel.guest_channel import RunsToEnd
from aamp.sandbox.manager import CreateRequest, SandboxUnavailable


class LinkError(AampError, code="host_unreachable", status=502):
    """The sandbox's host could not be reached over the link, or refused the replica."""


class LinkAnswer(AampError):
    """An error the host answered; `code` and `status` are the host's."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def _raise_for(response: httpx.Response, body: bytes) -> None:
    if response.status_code < 400:
        return
    try:
        answer = json.loads(body)
        code, message, kind = answer["code"], answer["message"], answer.get("kind", "aamp")
    except (ValueError, KeyError, TypeError):
        raise LinkError(f"the host answered {response.status_code} without an error") from None
    if kind == "timeout":
        raise GuestTimeout(message)
    if kind == "guest":
        raise GuestError(message, code)
    raise LinkAnswer(response.status_code, code, message)


class LinkClient:
    """The link to host `host_id` at `address` (`HOST:PORT`)."""

    def __init__(self, host_id: str, address: str, tls: ssl.SSLContext, timeout: float = 60):
        self.host_id, self.address = host_id, address
        self._http = httpx.AsyncClient(
            base_url=f"https://{address}", verify=tls, timeout=timeout, trust_env=False
        )
        self._sni = {"sni_hostname": link_name(host_id)}

    async def close(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, extensions=self._sni, **kw)
        except httpx.HTTPError as exc:
            raise LinkError(f"host {self.host_id} at {self.address}: {exc!r}") from None
        _raise_for(response, response.content)
        return response

    async def stream(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A response whose body is read later (the caller closes it)."""
        req = self._http.build_request(method, path, extensions=self._sni, **kw)
        try:
            response = await self._http.send(req, stream=True)
        except httpx.HTTPError as exc:
            raise LinkError(f"host {self.host_id} at {self.address}: {exc!r}") from None
        if response.status_code >= 400:
            body = await response.aread()
            await response.aclose()
            _raise_for(response, body)
        return response

    async def hello(self) -> dict[str, Any]:
        return (await self.request("GET", "/link/hello")).json()

    async def create(self, request: CreateRequest, epoch: int, actor: str) -> dict[str, Any]:
        body = {
            "image": request.image,
            "driver": request.driver,
            "ttl": request.ttl,
            "idle": request.idle,
            "resources": dataclasses.asdict(request.resources),
            # What its host's egress proxy enforces; a service's credential is asked for
            # call by call over the link (`host_outbox.py`), never sent here.
            "egress": request.egress.to_dict(),
            "services": [s.to_dict() for s in request.services],
            "epoch": epoch,
            "actor": actor,
        }
        try:
            return (await self.request("POST", "/link/sandboxes", json=body)).json()
        except LinkError as exc:
            raise SandboxUnavailable(str(exc)) from None

    async def describe(self, sandbox_id: str) -> dict[str, Any]:
        return (await self.request("GET", f"/link/sandboxes/{sandbox_id}")).json()

    async def list(self) -> list[dict[str, Any]]:
        return (await self.request("GET", "/link/sandboxes")).json()

    async def destroy(self, sandbox_id: str, reason: str, actor: str) -> None:
        params = {"reason": reason, "actor": actor}
        await self.request("DELETE", f"/link/sandboxes/{sandbox_id}", params=params)

    def channel(self, sandbox_id: str) -> LinkChannel:
        return LinkChannel(self, sandbox_id)


class LinkExecSession:
    """A command running on the host's sandbox: iterate it for output, then `result`."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._lines = response.aiter_lines()
        self.result: ExecResult | None = None

    async def __aenter__(self) -> LinkExecSession:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._response.aclose()

    def __aiter__(self) -> LinkExecSession:
        return self

    async def __anext__(self) -> Output:
        if self.result is not None:
            raise StopAsyncIteration
        try:
            line = await anext(self._lines)
        except StopAsyncIteration:
            raise GuestError("the host's exec stream ended without a result", "link") from None
        except httpx.HTTPError as exc:
            raise GuestError(f"the link to the host broke: {exc!r}", "link") from None
        item = json.loads(line)
        if "stream" in item:
            return Output(item["stream"], base64.b64decode(item["data"]))
        if item.get("error") == "guest_timeout":
            raise GuestTimeout(item.get("message", "the guest timed out"))
        self.result = ExecResult(
            item["exit_code"],
            item["signal"],
            item["timed_out"],
            item["duration"],
            truncated=item.get("truncated", False),
        )
        raise StopAsyncIteration


class LinkGetStream:
    def __init__(self, response: httpx.Response, size: int) -> None:
        self._response, self.size = response, size
        self._chunks = response.aiter_raw()

    def __aiter__(self) -> LinkGetStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await anext(self._chunks)
        except httpx.HTTPError as exc:
            raise GuestError(f"the link to the host broke: {exc!r}", "link") from None

    async def read_all(self) -> bytes:
        return b"".join([c async for c in self])

    async def aclose(self) -> None:
        await self._response.aclose()


class LinkChannel(RunsToEnd):
    """`GuestChannel`'s operations for a sandbox on another host, through its link."""

    def __init__(self, link: LinkClient, sandbox_id: str) -> None:
        self.link, self.sandbox_id = link, sandbox_id
        self._path = f"/link/sandboxes/{sandbox_id}"

    async def exec(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> LinkExecSession:
        body = {
            "argv": list(argv),
            "env": dict(env or {}),
            "cwd": cwd,
            "stdin_b64": base64.b64encode(stdin).decode() if stdin is not None else None,
            "timeout": timeout,
        }
        link_timeout = httpx.Timeout(60, read=(timeout or 3600) + 60)
        response = await self.link.stream(
            "POST", self._path + "/exec", json=body, timeout=link_timeout
        )
        return LinkExecSession(response)

    async def put(self, guest_path: str, source: AsyncIterator[bytes] | bytes, size: int) -> None:
        await self.link.request(
            "PUT",
            self._path + "/files",
            params={"path": guest_path},
            content=source,
            headers={"content-length": str(size)},
        )

    async def put_file(self, guest_path: str, host_file: Path) -> int:
        data = host_file.read_bytes()
        await self.put(guest_path, data, len(data))
        return len(data)

    async def get(self, guest_path: str) -> LinkGetStream:
        response = await self.link.stream("GET", self._path + "/files", params={"path": guest_path})
        return LinkGetStream(response, int(response.headers.get("content-length", "0")))

    async def browser(self, request: dict[str, Any], *, timeout: float, max_answer: int) -> bytes:
        body = {"request": request, "timeout": timeout, "max_answer": max_answer}
        answer = await self.link.request(
            "POST", self._path + "/browser", json=body, timeout=timeout + 30
        )
        return answer.content
