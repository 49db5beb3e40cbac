"""A small real HTTP/1.1 server for egress tests and the benchmark (asyncio, keep-alive).

Routes: `/` and anything else → `hello from ADDR:PORT` plus the Host it was asked for;
`/bytes/N` → N bytes; `/chunked/N` → N bytes in chunked encoding; `/echo` → the request body;
`/close` → a response without length, ended by closing; `/ws` → a websocket echo (RFC 6455
handshake, text frames). Every request is counted in `requests` so tests can tell whether a
packet reached it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib

_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_BLOCK = b"x" * (1024 * 1024)


class UpstreamServer:
    def __init__(self, host: str, port: int = 0):
        self.host = host
        self.port = port
        self.requests: list[tuple[str, str, str]] = []  # (method, target, host header)
        self.connections = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> UpstreamServer:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> UpstreamServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                    return
                lines = head[:-4].decode("latin-1").split("\r\n")
                method, target, _version = lines[0].split(" ")
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                self.requests.append((method, target, headers.get("host", "")))
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                elif headers.get("transfer-encoding", "").lower() == "chunked":
                    while True:
                        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                        if size == 0:
                            await reader.readuntil(b"\r\n")
                            break
                        body += await reader.readexactly(size)
                        await reader.readexactly(2)
                if not await self._respond(method, target, headers, body, reader, writer):
                    return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _respond(self, method, target, headers, body, reader, writer) -> bool:
        if target.startswith("/bytes/"):
            size = int(target.split("/")[2])
            writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
            if method != "HEAD":
                remaining = size
                while remaining:
                    piece = _BLOCK[: min(remaining, len(_BLOCK))]
                    writer.write(piece)
                    remaining -= len(piece)
                    await writer.drain()
            await writer.drain()
            return True
        if target.startswith("/chunked/"):
            size = int(target.split("/")[2])
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            remaining = size
            while remaining:
                piece = min(remaining, 1000)
                writer.write(f"{piece:x}\r\n".encode() + b"y" * piece + b"\r\n")
                remaining -= piece
            writer.write(b"0\r\nX-Trailer: done\r\n\r\n")
            await writer.drain()
            return True
        if target == "/echo":
            writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            return True
        if target == "/close":
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil-close")
            await writer.drain()
            return False
        if target == "/ws" and headers.get("upgrade", "").lower() == "websocket":
            accept = base64.b64encode(
                hashlib.sha1(headers["sec-websocket-key"].encode() + _WS_GUID).digest()
            ).decode()
            writer.write(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Accept: {accept}\r\n\r\n".encode()
            )
            await writer.drain()
            while True:
                try:
                    text = await ws_read_frame(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return False
                writer.write(ws_frame(("echo: " + text).encode(), mask=False))
                await writer.drain()
        sockname = writer.get_extra_info("sockname")
        text = f"hello from {sockname[0]}:{sockname[1]} host={headers.get('host', '')}"
        payload = text.encode()
        writer.write(
            f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(payload)}\r\n"
            "\r\n".encode()
            + (payload if method != "HEAD" else b"")
        )
        await writer.drain()
        return True


def ws_frame(payload: bytes, *, mask: bool) -> bytes:
    """One unfragmented text frame (payload < 126 bytes)."""
    assert len(payload) < 126
    if not mask:
        return bytes([0x81, len(payload)]) + payload
    key = b"\x01\x02\x03\x04"
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return bytes([0x81, 0x80 | len(payload)]) + key + masked


async def ws_read_frame(reader: asyncio.StreamReader) -> str:
    first, second = await reader.readexactly(2)
    assert first & 0x0F == 1, "text frames only"
    length = second & 0x7F
    key = await reader.readexactly(4) if second & 0x80 else None
    data = await reader.readexactly(length)
    if key:
        data = bytes(b ^ key[i % 4] for i, b in enumerate(data))
    return data.decode()
