"""A replica's end of the link to one sandbox host: `LinkClient` (create — the wheels of its
packages sent first, `send_wheel` —, describe, list, destroy, new egress rules) and
`LinkChannel`, which does for a sandbox on that host what `GuestChannel` does for a local one
(exec, run, put, get, browser) — through the host, never to the guest. A create's read-only
files (a knowledge base's index) go ahead of it by SHA-256 (`send_files`): each held on the
host for that create, and sent only if the host does not have it already (`host_files.py`
checks its size and hash before keeping it).

Every connection is TLS with the replica's client certificate from the link CA, and the
host must present the certificate issued for exactly the host id the replica means
(`link_name`, checked as the server name): a host holding someone else's certificate, or a
certificate from another CA, fails the handshake and is never sent a byte.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import hashlib
import json
import logging
import os
import re
import secrets
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from aamp.egress.rules import EgressRules
from aamp.egress.services import ServiceSet
from aamp.errors import AampError
from aamp.fleet.link_ca import link_name
from aamp.fleet.reports import NotTaken, description
from aamp.sandbox.channel.errors import GuestError, GuestTimeout
from aamp.sandbox.channel.exec_session import ExecResult, Output
from aamp.sandbox.channel.guest_channel import Command, RunsToEnd
from aamp.sandbox.driver import SANDBOX_ID_RE, ReadOnlyFile
from aamp.sandbox.manager import CreateRequest, SandboxUnavailable
from aamp.sandbox.received_wheels import WheelRef

log = logging.getLogger("aamp.fleet")


# What a replica reads of a host's answer at most: more is refused, never buffered whole.
MAX_ANSWER = 1 * 2**20  # one sandbox described, an error, a hello
MAX_LIST_ANSWER = 16 * 2**20  # every sandbox a host runs, described
MAX_SEARCH_ANSWER = 5 * 2**20  # one knowledge-base search (the worker's own cap is 4 MB)
MAX_EXEC_LINE = 1 * 2**20  # one line of an exec stream (a guest's output chunk, base64)
SUCCESS_STATUSES = frozenset({200, 201, 204})
# The error statuses the link uses (`link_server.py`); any other is the host misbehaving.
HOST_STATUSES = frozenset({400, 404, 409, 410, 411, 413, 422, 503})
CODE_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
MAX_MESSAGE = 500
Refusals = Callable[[str, str], Awaitable[None]]  # (host id, why): each refusal is recorded
UPLOAD_CHUNK = 1 << 20
# Each file's SHA-256 by what identifies its content on this file system (path, inode,
# size, change time): a knowledge base's index is hashed once, not at every create.
_HASHES: dict[tuple[str, int, int, int], str] = {}


def file_sha256(path: Path) -> tuple[str, int]:
    """(Blocking.) The file's SHA-256 and size."""
    info = path.stat()
    key = (str(path), info.st_ino, info.st_size, info.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(UPLOAD_CHUNK), b""):
                h.update(block)
        if len(_HASHES) > 1024:
            _HASHES.clear()
        _HASHES[key] = h.hexdigest()
    return _HASHES[key], info.st_size


async def _chunks(path: Path, size: int) -> AsyncIterator[bytes]:
    """The first `size` bytes of `path`, read off the event loop."""
    fd = await asyncio.to_thread(os.open, path, os.O_RDONLY)
    try:
        left = size
        while left > 0:
            block = await asyncio.to_thread(os.read, fd, min(UPLOAD_CHUNK, left))
            if not block:
                return
            left -= len(block)
            yield block
    finally:
        os.close(fd)


class LinkError(AampError, code="host_unreachable", status=502):
    """The sandbox's host could not be reached over the link, or refused the replica."""


class HostMisbehaved(LinkError, code="host_misbehaved"):
    """The host answered outside the link's protocol (too large, a status the link does
    not use, malformed, a sandbox id against the rule): refused, and recorded."""


class LinkAnswer(AampError):
    """An error the host answered, checked: `status` is one the link uses, `code` a code's
    shape, the message cut to `MAX_MESSAGE` printable characters."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else " " for c in text[:MAX_MESSAGE])


def check_sandbox(info: object, expected: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """A sandbox as a host describes it, or ValueError: an object whose `id` follows the
    sandbox id rule (and is `expected`, if given), with only the keys a sandbox's description
    has, each of its type and size (`reports.description`); the keys left out are named (the
    second value)."""
    if not isinstance(info, dict):
        raise ValueError("a sandbox's description is not a JSON object")
    sandbox_id = info.get("id")
    if not isinstance(sandbox_id, str) or not SANDBOX_ID_RE.match(sandbox_id):
        raise ValueError(f"sandbox id {str(sandbox_id)[:80]!r} does not follow the id rule")
    if expected is not None and sandbox_id != expected:
        raise ValueError(f"asked for sandbox {expected}, described {sandbox_id}")
    try:
        return description(info)
    except NotTaken as exc:
        raise ValueError(f"sandbox {sandbox_id}: {exc}") from None


class LinkClient:
    """The link to host `host_id` at `address` (`HOST:PORT`); every answer it refuses is
    told to `refused` (the replica's audit: `HostLinks`)."""

    def __init__(
        self,
        host_id: str,
        address: str,
        tls: ssl.SSLContext,
        timeout: float = 60,
        refused: Refusals | None = None,
    ):
        self.host_id, self.address = host_id, address
        self._http = httpx.AsyncClient(
            base_url=f"https://{address}",
            verify=tls,
            timeout=timeout,
            trust_env=False,
            # A compressed answer would be decoded before any bound could apply (a few KB of
            # brotli is GBs): the link sends bodies as they are, and anything else is refused.
            headers={"accept-encoding": "identity"},
        )
        self._sni = {"sni_hostname": link_name(host_id)}
        self._refused = refused

    async def close(self) -> None:
        await self._http.aclose()

    @property
    def closed(self) -> bool:
        return self._http.is_closed

    async def refuse(self, why: str) -> HostMisbehaved:
        """Record that the host's answer was refused, and the error to raise for it."""
        log.warning("host %s: answer refused: %s", self.host_id, why)
        if self._refused is not None:
            await self._refused(self.host_id, why)
        return HostMisbehaved(f"host {self.host_id} answered outside the link protocol: {why}")

    async def _read(self, response: httpx.Response, cap: int, what: str) -> bytes:
        """The whole body, refused past `cap` bytes (the connection is dropped)."""
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            await response.aclose()
            raise await self.refuse(f"{what}: {declared} bytes announced, over {cap}")
        body = bytearray()
        try:
            async for chunk in response.aiter_raw():  # never decoded: see `stream`
                body += chunk
                if len(body) > cap:
                    raise await self.refuse(f"{what}: more than {cap} bytes")
        except httpx.HTTPError as exc:
            raise LinkError(f"host {self.host_id} at {self.address}: {exc!r}") from None
        finally:
            await response.aclose()
        return bytes(body)

    async def _check_status(self, response: httpx.Response, what: str) -> None:
        """A success the link uses goes on; an error it uses becomes the product's error;
        anything else (a redirect, a 500, a status the link never sends) is refused and
        recorded."""
        status = response.status_code
        if status in SUCCESS_STATUSES:
            return
        if status not in HOST_STATUSES and status not in (502, 504):
            await response.aclose()
            raise await self.refuse(f"{what}: status {status}, which the link does not use")
        body = await self._read(response, MAX_ANSWER, what)
        try:
            answer = json.loads(body)
            code, message = answer["code"], answer["message"]
            kind = answer.get("kind", "aamp")
            if not (isinstance(code, str) and CODE_RE.match(code) and isinstance(message, str)):
                raise TypeError("code or message")
        except (ValueError, KeyError, TypeError):
            raise await self.refuse(f"{what}: status {status} without an error") from None
        message = _printable(message)
        if (kind, status) == ("timeout", 504):
            raise GuestTimeout(message)
        if (kind, status) == ("guest", 502):
            raise GuestError(message, code)
        if kind == "aamp" and status in HOST_STATUSES:
            raise LinkAnswer(status, code, message)
        raise await self.refuse(f"{what}: status {status} with kind {str(kind)[:20]!r}")

    async def request(
        self, method: str, path: str, cap: int = MAX_ANSWER, **kw: Any
    ) -> tuple[httpx.Response, bytes]:
        """Send a request; its response (status checked) and its body of at most `cap`."""
        response = await self.stream(method, path, **kw)
        return response, await self._read(response, cap, f"{method} {path}")

    async def stream(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A response whose status was checked and whose body is read later (the caller
        closes it)."""
        req = self._http.build_request(method, path, extensions=self._sni, **kw)
        try:
            response = await self._http.send(req, stream=True)
        except httpx.HTTPError as exc:
            raise LinkError(f"host {self.host_id} at {self.address}: {exc!r}") from None
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            await response.aclose()
            raise await self.refuse(f"{method} {path}: content-encoding {encoding[:20]!r}")
        await self._check_status(response, f"{method} {path}")
        return response

    async def _json(self, method: str, path: str, cap: int = MAX_ANSWER, **kw: Any) -> Any:
        _, body = await self.request(method, path, cap, **kw)
        try:
            return json.loads(body)
        except ValueError:
            raise await self.refuse(f"{method} {path}: the answer is not JSON") from None

    async def hello(self) -> dict[str, Any]:
        hello = await self._json("GET", "/link/hello")
        if not isinstance(hello, dict):
            raise await self.refuse("GET /link/hello: the answer is not a JSON object")
        return hello

    async def send_files(self, files: tuple[ReadOnlyFile, ...]) -> tuple[str, list[dict[str, str]]]:
        """Have the host hold each of `files` for one create, sending those it lacks; the
        create's hold id and what its body names them by."""
        hold, named = secrets.token_hex(16), []
        for f in files:
            sha, size = await asyncio.to_thread(file_sha256, f.source)
            path = f"/link/files/{sha}"
            held = await self._json("POST", path + "/hold", json={"hold": hold, "size": size})
            if not isinstance(held, dict) or not isinstance(held.get("present"), bool):
                raise await self.refuse(f"POST {path}/hold: the answer is not one")
            if not held["present"]:
                await self.request(
                    "PUT",
                    path,
                    params={"hold": hold},
                    content=_chunks(f.source, size),
                    headers={"content-length": str(size)},
                    timeout=httpx.Timeout(60, write=600),
                )
            named.append({"sha256": sha, "target": f.target})
        return hold, named

    async def send_wheel(self, ref: WheelRef, path: Path) -> None:
        """Send one wheel the host lacks (`PUT /link/wheels/SHA256`); the host keeps it only
        if its bytes hash to `ref.sha256` (`received_wheels.py`)."""
        size = path.stat().st_size

        async def chunks() -> AsyncIterator[bytes]:
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    yield block

        await self.request(
            "PUT",
            f"/link/wheels/{ref.sha256}",
            params={"filename": ref.filename},
            content=chunks(),
            headers={"content-length": str(size)},
            timeout=httpx.Timeout(60, write=600),
        )

    async def create(
        self, request: CreateRequest, epoch: int, actor: str, wheels: tuple[WheelRef, ...] = ()
    ) -> dict[str, Any]:
        try:
            hold, files = await self.send_files(request.read_only_files)
        except HostMisbehaved:
            raise
        except LinkError as exc:
            raise SandboxUnavailable(str(exc)) from None
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
            # Its packages' wheels, named by hash: sent before (`send_wheel`), built into
            # the packages layer there.
            "packages": list(request.packages),
            "wheels": [w.to_dict() for w in wheels],
            "epoch": epoch,
            "actor": actor,
            # Its read-only files, held on the host for it (`send_files`).
            "files": files,
            "hold": hold,
        }
        try:
            info = await self._json("POST", "/link/sandboxes", json=body)
        except HostMisbehaved:
            raise
        except LinkError as exc:
            raise SandboxUnavailable(str(exc)) from None
        return await self._sandbox(info, None, "POST /link/sandboxes")

    async def _sandbox(self, info: object, expected: str | None, what: str) -> dict[str, Any]:
        try:
            taken, left_out = check_sandbox(info, expected)
        except ValueError as exc:
            raise await self.refuse(f"{what}: {exc}") from None
        if left_out:  # recorded; the rest of the description is taken
            await self.refuse(
                f"{what}: sandbox {taken['id']}: keys no sandbox's description has, left"
                f" out: {', '.join(left_out[:8])}"
            )
        return taken

    async def describe(self, sandbox_id: str) -> dict[str, Any]:
        path = f"/link/sandboxes/{sandbox_id}"
        return await self._sandbox(await self._json("GET", path), sandbox_id, f"GET {path}")

    async def list(self) -> list[dict[str, Any]]:
        listed = await self._json("GET", "/link/sandboxes", MAX_LIST_ANSWER)
        if not isinstance(listed, list):
            raise await self.refuse("GET /link/sandboxes: the answer is not a JSON list")
        return [await self._sandbox(i, None, "GET /link/sandboxes") for i in listed]

    async def update_egress(
        self, sandbox_id: str, rules: EgressRules, services: ServiceSet | None, actor: str
    ) -> None:
        """The sandbox's new egress rules (and services, None: unchanged) for its host's
        proxy; as a create's, a service's credential never travels here."""
        body = {
            "egress": rules.to_dict(),
            "services": [s.to_dict() for s in services] if services is not None else None,
            "actor": actor,
        }
        await self.request("PUT", f"/link/sandboxes/{sandbox_id}/egress", json=body)

    async def destroy(self, sandbox_id: str, reason: str, actor: str) -> None:
        params = {"reason": reason, "actor": actor}
        await self.request("DELETE", f"/link/sandboxes/{sandbox_id}", params=params)

    def channel(self, sandbox_id: str) -> LinkChannel:
        return LinkChannel(self, sandbox_id)


class LinkExecSession:
    """A command running on the host's sandbox: iterate it for output, then `result`. Every
    line is checked (at most `MAX_EXEC_LINE` bytes, the shape the link sends); a bad one is
    refused and ends the session."""

    def __init__(self, response: httpx.Response, link: LinkClient) -> None:
        self._response, self._link = response, link
        self._bytes = response.aiter_raw()  # never decoded: see `LinkClient.stream`
        self._buffer = bytearray()
        self.result: ExecResult | None = None

    async def __aenter__(self) -> LinkExecSession:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._response.aclose()

    def __aiter__(self) -> LinkExecSession:
        return self

    async def _line(self) -> bytes:
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > MAX_EXEC_LINE:
                await self.aclose()
                raise await self._link.refuse(f"an exec line of more than {MAX_EXEC_LINE} bytes")
            try:
                self._buffer += await anext(self._bytes)
            except StopAsyncIteration:
                raise GuestError("the host's exec stream ended without a result", "link") from None
            except httpx.HTTPError as exc:
                raise GuestError(f"the link to the host broke: {exc!r}", "link") from None
        if end > MAX_EXEC_LINE:
            await self.aclose()
            raise await self._link.refuse(f"an exec line of more than {MAX_EXEC_LINE} bytes")
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line

    async def __anext__(self) -> Output:
        if self.result is not None:
            raise StopAsyncIteration
        line = await self._line()
        try:
            item = json.loads(line)
            if "stream" in item:
                if item["stream"] not in ("stdout", "stderr"):
                    raise ValueError("stream")
                return Output(item["stream"], base64.b64decode(item["data"], validate=True))
            if item.get("error") == "guest_timeout":
                raise GuestTimeout(_printable(str(item.get("message", "the guest timed out"))))
            result = ExecResult(
                _typed(item["exit_code"], int, none=True),
                _typed(item["signal"], int, none=True),
                _typed(item["timed_out"], bool),
                _typed(item["duration"], float),
                truncated=_typed(item.get("truncated", False), bool),
            )
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
            await self.aclose()
            raise await self._link.refuse("an exec line outside the link protocol") from None
        self.result = result
        raise StopAsyncIteration


def _typed(value: object, kind: type, *, none: bool = False) -> Any:
    if value is None and none:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool):
        raise TypeError("a flag where a number belongs")
    if not isinstance(value, kind):
        raise TypeError(f"{type(value).__name__} where {kind.__name__} belongs")
    return value


class LinkGetStream:
    def __init__(self, response: httpx.Response, size: int) -> None:
        self._response, self.size = response, size
        self._chunks = response.aiter_raw()

    # Used as `GuestChannel.get`'s stream is (a knowledge base's indexing reads its index
    # back this way): closed on leaving.
    async def __aenter__(self) -> LinkGetStream:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

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


class LinkChannel(RunsToEnd[LinkExecSession]):
    """`GuestChannel`'s operations for a sandbox on another host, through its link."""

    def __init__(self, link: LinkClient, sandbox_id: str) -> None:
        self.link, self.sandbox_id = link, sandbox_id
        self._path = f"/link/sandboxes/{sandbox_id}"

    async def launch(self, command: Command) -> LinkExecSession:
        if command.stdin_open:
            raise ValueError("a command on another host cannot keep its stdin open")
        stdin, timeout = command.stdin, command.timeout
        body = {
            "argv": list(command.argv),
            "env": dict(command.env or {}),
            "cwd": command.cwd,
            "stdin_b64": base64.b64encode(stdin).decode() if stdin is not None else None,
            "timeout": timeout,
        }
        link_timeout = httpx.Timeout(60, read=(timeout or 3600) + 60)
        response = await self.link.stream(
            "POST", self._path + "/exec", json=body, timeout=link_timeout
        )
        return LinkExecSession(response, self.link)

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
        size = response.headers.get("content-length", "")
        if not size.isdigit():
            await response.aclose()
            raise await self.link.refuse("a file sent without its length")
        return LinkGetStream(response, int(size))

    async def search_resident(
        self, warm: tuple[str, ...], request: dict[str, Any] | None, timeout: float
    ) -> dict[str, Any]:
        """A search (or, `request` None, only a start) by the resident knowledge-base worker
        its host keeps for this sandbox (`rag_worker.SearchWorker` there): a link exec keeps
        no stdin open, so the worker cannot be driven from here."""
        body = {"warm": list(warm), "request": request, "timeout": timeout}
        answer = await self.link._json(
            "POST", self._path + "/search", MAX_SEARCH_ANSWER, json=body, timeout=timeout + 30
        )
        if not isinstance(answer, dict):
            raise await self.link.refuse("a search answer that is not a JSON object")
        return answer

    async def browser(self, request: dict[str, Any], *, timeout: float, max_answer: int) -> bytes:
        body = {"request": request, "timeout": timeout, "max_answer": max_answer}
        _, answer = await self.link.request(
            "POST", self._path + "/browser", max_answer, json=body, timeout=timeout + 30
        )
        return answer
