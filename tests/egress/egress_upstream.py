"""A small real HTTP/1.1 server for egress tests and the benchmark (asyncio, keep-alive).

Routes: `/` and anything else → `hello from ADDR:PORT` plus the Host it was asked for;
`/bytes/N` → N bytes; `/chunked/N` → N bytes in chunked encoding; `/echo` → the request body;
`/close` → a response without length, ended by closing; `/ws` → a websocket echo (RFC 6455
handshake, text frames). Every request is counted in `requests` (and its headers kept in `seen`)
so tests can tell whether a packet reached it and what it carried.

For credential-injection tests it plays a careless service that echoes what it was given:
`/whoami` → the Authorization and X-Api-Key headers it got, in a JSON body and in response
headers; `/leak/FRAMING/K` → the credential it got (bearer token, or basic's base64 token,
decoded pair and password, or X-Api-Key) in a body sent in two TLS records split K bytes into
it, framed `chunked`, `length` or `close`; `/leak/gzip/0` → the same, gzip-encoded;
`/reflect/CODING/K[/PAD]` → every form of every credential part it got (`reflected_forms`: raw,
case-changed, URL-encoded, JSON-escaped, hex, base64 and base64url of the parts and of the
whole header value, inside longer base64 strings at each alignment, the whole request head
in base64), in response headers (one a header *name*) and in a body encoded with CODING
(identity, gzip, deflate, br), after PAD bytes of plain text, and sent chunked in chunks of
K bytes, each its own write, so that forms are split across reads; the forms sent are kept
in `reflected`.
Pass `ssl=` to serve HTTPS.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import hashlib
import json
import re
import ssl as ssl_module
import urllib.parse
import zlib

import brotli

_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_BLOCK = b"x" * (1024 * 1024)


class UpstreamServer:
    def __init__(self, host: str, port: int = 0, *, ssl: ssl_module.SSLContext | None = None):
        self.host = host
        self.port = port
        self.ssl = ssl
        self.requests: list[tuple[str, str, str]] = []  # (method, target, host header)
        self.seen: list[list[tuple[str, str]]] = []  # every request's header lines, in order
        self.connections = 0
        self.reflected: list[dict[str, bytes]] = []  # /reflect: the forms each answer carried
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> UpstreamServer:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, ssl=self.ssl)
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
                pairs = []
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                    pairs.append((name.strip().lower(), value.strip()))
                self.requests.append((method, target, headers.get("host", "")))
                self.seen.append(pairs)
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
        if target.startswith("/bigchunked/"):  # chunks big enough for the proxy to splice
            size = int(target.split("/")[2])
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            remaining = size
            while remaining:
                piece = min(remaining, 256 * 1024)
                writer.write(f"{piece:x}\r\n".encode() + _BLOCK[:piece] + b"\r\n")
                remaining -= piece
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        if target.startswith("/eofbytes/"):  # no length: the body ends when the upstream closes
            size = int(target.split("/")[2])
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            remaining = size
            while remaining:
                piece = _BLOCK[: min(remaining, len(_BLOCK))]
                writer.write(piece)
                remaining -= len(piece)
                await writer.drain()
            return False
        if target == "/whoami":
            auth = headers.get("authorization", "")
            key = headers.get("x-api-key", "")
            payload = json.dumps({"authorization": auth, "x-api-key": key}).encode()
            writer.write(
                f"HTTP/1.1 200 OK\r\nX-Echo-Authorization: {auth}\r\nX-Echo-Key: {key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
            return True
        if target.startswith("/leak/"):
            return await leak_response(target, headers, writer)
        if target.startswith("/reflect/"):
            forms = reflected_forms(headers)
            self.reflected.append(forms)
            await reflect_response(target, forms, writer)
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


def credential_parts(headers: dict[str, str]) -> list[bytes]:
    """Every form of the credential a careless service might echo back."""
    auth = headers.get("authorization", "")
    parts: list[bytes] = []
    if auth.startswith("Bearer "):
        parts.append(auth[7:].encode())
    elif auth.startswith("Basic "):
        token = auth[6:].encode()
        pair = base64.b64decode(token)
        parts += [token, pair, pair.split(b":", 1)[1]]
    if headers.get("x-api-key"):
        parts.append(headers["x-api-key"].encode())
    return parts


async def leak_response(target: str, headers: dict[str, str], writer: asyncio.StreamWriter) -> bool:
    """`/leak/FRAMING/K`; returns whether the connection stays open."""
    _, _, framing, split = target.split("/")
    body = b"before " + b" | ".join(credential_parts(headers)) + b" after"
    if framing == "gzip":
        data = gzip.compress(body)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        return True
    k = 7 + int(split)  # K bytes into the first credential form
    first, second = body[:k], body[k:]
    if framing == "chunked":
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(f"{len(first):x}\r\n".encode() + first + b"\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # a separate TLS record and a separate read at the proxy
        writer.write(f"{len(second):x}\r\n".encode() + second + b"\r\n0\r\n\r\n")
        await writer.drain()
        return True
    if framing == "length":
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + first)
    else:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + first)
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.write(second)
    await writer.drain()
    return framing == "length"


def reflected_forms(headers: dict[str, str]) -> dict[str, bytes]:
    """Every way a careless service could write back the credential it got, by name."""
    texts = {f"part{i}": part for i, part in enumerate(credential_parts(headers))}
    for name in ("authorization", "x-api-key"):
        if headers.get(name):
            texts[name] = headers[name].encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
    forms = {"head-b64": base64.b64encode(b"GET / HTTP/1.1\r\n" + head)}
    for label, raw in texts.items():
        text = raw.decode()
        quoted = urllib.parse.quote(text, safe="")
        variants = {
            "raw": raw,
            "upper": raw.upper(),
            "lower": raw.lower(),
            "swapcase": raw.swapcase(),
            "url": quoted.encode(),
            "url-lower": re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), quoted).encode(),
            "url-plus": urllib.parse.quote_plus(text).encode(),
            "json": json.dumps(text)[1:-1].encode(),
            "json-slash": json.dumps(text)[1:-1].replace("/", "\\/").encode(),
            "hex": raw.hex().encode(),
            "hex-upper": raw.hex().upper().encode(),
        }
        for offset in range(4):  # 0..2 inside a longer string; 3: the text alone
            data = raw if offset == 3 else b"<" * offset + raw + b">"
            std, url = base64.b64encode(data), base64.urlsafe_b64encode(data)
            variants[f"b64-{offset}"] = std
            variants[f"b64-{offset}-bare"] = std.rstrip(b"=")
            variants[f"b64url-{offset}"] = url.rstrip(b"=")
            variants[f"b64-{offset}-url"] = urllib.parse.quote(std, safe="").encode()
            variants[f"b64-{offset}-json"] = std.replace(b"/", b"\\/")
        forms.update({f"{label}-{kind}": form for kind, form in variants.items()})
    return forms


def reflect_parts(forms: dict[str, bytes], coding: str, pad: int = 0) -> tuple[list[str], bytes]:
    """The header lines and the CODING-encoded body of an answer that reflects `forms`:
    one header per form (and one whose name is the first part, if it can be a name), and a
    body of `pad` bytes of text, then one `NAME=[FORM]` line per form."""
    body = (b"lorem ipsum dolor sit amet, " * 4096)[:pad]
    body += b"".join(b"\n%s=[%s]" % (name.encode(), form) for name, form in forms.items())
    encode = {
        "identity": lambda b: b,
        "gzip": gzip.compress,
        "deflate": zlib.compress,
        "br": brotli.compress,
    }[coding]
    lines = ["Content-Type: text/plain"]
    if coding != "identity":
        lines.append(f"Content-Encoding: {coding}")
    lines += [f"X-Reflect-{i}: [{form.decode()}]" for i, form in enumerate(forms.values())]
    token = forms.get("part0-raw", b"")
    if re.fullmatch(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+", token):  # a valid header name
        lines.append(f"X-Echo-{token.decode()}: named")
    return lines, encode(body)


async def reflect_response(target: str, forms: dict[str, bytes], writer) -> None:
    """`/reflect/CODING/K[/PAD]`: `reflect_parts` in K-byte chunks, each its own write."""
    _, _, coding, size, *pad = target.split("/")
    lines, data = reflect_parts(forms, coding, int(pad[0]) if pad else 0)
    head = ["HTTP/1.1 200 OK", "Transfer-Encoding: chunked", *lines]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    step = int(size)
    for at in range(0, len(data), step):
        piece = data[at : at + step]
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


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


class RecordingUpstream:
    """A TCP server that keeps every byte each connection sent it, to prove what reached an
    upstream (or that nothing did). It answers `200 ok` when what a connection sent so far
    ends with `answer_after` (if given), and otherwise only listens. `received[i]` is the
    i-th connection's bytes; `ended[i]` whether that connection was closed by the proxy."""

    def __init__(self, host: str, port: int = 0, *, answer_after: bytes | None = None):
        self.host = host
        self.port = port
        self.answer_after = answer_after
        self.received: list[bytearray] = []
        self.ended: list[bool] = []
        self._server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> RecordingUpstream:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def everything(self) -> bytes:
        return b"".join(self.received)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(self.received)
        self.received.append(bytearray())
        self.ended.append(False)
        try:
            while data := await reader.read(65536):
                self.received[index] += data
                if self.answer_after and self.received[index].endswith(self.answer_after):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
            self.ended[index] = True
        except (ConnectionError, asyncio.CancelledError):
            self.ended[index] = True
        finally:
            writer.close()
