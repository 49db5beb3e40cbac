"""Raw HTTP clients over the proxy's Unix socket: tests speak bytes, as a hostile guest would."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Response:
    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def rule(self) -> str | None:
        return self.headers.get("x-aamp-egress-rule")


async def read_response(reader: asyncio.StreamReader, *, head_only: bool = False) -> Response:
    """Read one response (Content-Length, chunked, or until close)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].decode("latin-1").split("\r\n")
    _version, status, *reason = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    response = Response(int(status), reason[0] if reason else "", headers)
    if head_only or response.status in (101, 204, 304) or 100 <= response.status < 200:
        return response
    if "content-length" in headers:
        response.body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        response.body = bytes(body)
    else:
        response.body = await reader.read()
    return response


async def send(sock: Path, data: bytes, *, timeout: float = 10.0) -> Response:
    """Open a connection, send `data`, read one response, close."""
    reader, writer = await asyncio.open_unix_connection(str(sock))
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):  # the proxy may answer and close first
            await writer.drain()
        async with asyncio.timeout(timeout):
            return await read_response(reader)
    finally:
        writer.close()


async def get(sock: Path, url: str, *, host: str | None = None, extra: str = "") -> Response:
    authority = url.split("/", 3)[2]
    request = f"GET {url} HTTP/1.1\r\nHost: {host or authority}\r\n{extra}\r\n"
    return await send(sock, request.encode("latin-1"))


async def connect(
    sock: Path, target: str
) -> tuple[Response, asyncio.StreamReader, asyncio.StreamWriter]:
    """Send CONNECT; return the response and the open streams (caller closes the writer)."""
    reader, writer = await asyncio.open_unix_connection(str(sock))
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode("latin-1"))
    await writer.drain()
    async with asyncio.timeout(10):
        response = await read_response(reader, head_only=True)
    if response.status != 200:
        length = int(response.headers.get("content-length", "0"))
        response.body = await reader.readexactly(length)
    return response, reader, writer


async def exchange(sock: Path, data: bytes) -> dict:
    """Send `data` on a fresh connection; the answer as {status, rule, body} (status 0 if the
    connection failed), CONNECT answers read head-only."""
    reader, writer = await asyncio.open_unix_connection(str(sock))
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(10):
            is_connect = data.startswith(b"CONNECT ")
            response = await read_response(reader, head_only=is_connect)
            if is_connect and response.status != 200:
                length = int(response.headers.get("content-length", "0"))
                response.body = await reader.readexactly(length)
        return {"status": response.status, "rule": response.rule, "body": response.body.decode()}
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        return {"status": 0, "rule": None, "body": f"connection failed: {exc!r}"}
    finally:
        writer.close()
