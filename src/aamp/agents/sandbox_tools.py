"""Runs validated tool calls inside the run's sandbox, through its guest channel only.

Everything that comes back from the guest is untrusted: outputs are decoded leniently, JSON
answers of the guest scripts are parsed defensively, and sizes are capped before anything is
kept. The agent never gets a credential: a service call goes through the egress proxy, which
injects it host-side.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from aamp.agents import guest_scripts
from aamp.agents.browser_tool import BrowserTool
from aamp.agents.documents_tool import DocumentsTool
from aamp.agents.observation import Observation
from aamp.agents.rag_tool import RagTool
from aamp.agents.tools import SERVICE_PREFIX
from aamp.sandbox import (
    FileTooLargeError,
    GuestChannel,
    GuestError,
    GuestTimeout,
    PathEscapeError,
    workspace_path,
)

Borrow = Callable[[], AbstractAsyncContextManager[GuestChannel]]
MAX_OUTPUT = 1_000_000
MAX_SERVICE_ANSWER = 8_000_000  # a 2 MB body, JSON-escaped
__all__ = ["Observation", "SandboxTools"]


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


class SandboxTools:
    def __init__(
        self,
        borrow: Borrow,
        services: dict[str, str],
        timeout_cap: int,
        *,
        browser: BrowserTool | None = None,
        documents: DocumentsTool | None = None,
        rag: RagTool | None = None,
    ) -> None:
        """`services` maps each service tool's name to the upstream URL the guest calls;
        `browser` and `documents` are the run's browser and documents tools (default: ones
        with the default settings and no egress ledger to explain refusals with)."""
        self.borrow = borrow
        self.services = services
        self.timeout_cap = timeout_cap
        self.browser = browser or BrowserTool(borrow, timeout_cap)
        self.documents = documents or DocumentsTool(borrow, timeout_cap)
        self.rag = rag or RagTool(borrow, timeout_cap, ())

    def _timeout(self, args: dict[str, Any]) -> float:
        return float(min(int(args.get("timeout", self.timeout_cap)), self.timeout_cap))

    async def run(self, name: str, args: dict[str, Any]) -> Observation:
        try:
            if name == "shell":
                return await self._exec(["sh", "-c", args["command"]], None, self._timeout(args))
            if name == "python":
                code = args["code"].encode()
                return await self._exec(["python3", "-"], code, self._timeout(args))
            if name == "files":
                return await self._files(args)
            if name == "browser":
                return await self.browser.run(args)
            if name == "documents":
                return await self.documents.run(args)
            if name == "rag":
                return await self.rag.run(args)
            if name.startswith(SERVICE_PREFIX) and name in self.services:
                return await self._service(self.services[name], args)
        except (PathEscapeError, FileTooLargeError, GuestError) as exc:
            return Observation(f"error: {exc}", ok=False)
        except GuestTimeout as exc:
            return Observation(f"error: the sandbox did not answer in time: {exc}", ok=False)
        raise ValueError(f"no executor for tool {name!r}")

    async def _exec(self, argv: list[str], stdin: bytes | None, timeout: float) -> Observation:
        async with self.borrow() as channel:
            result, out, err = await channel.run(
                argv,
                cwd="/workspace",
                stdin=stdin,
                timeout=timeout,
                max_output=MAX_OUTPUT,
            )
        detail = {
            "exit_code": result.exit_code,
            "signal": result.signal,
            "timed_out": result.timed_out,
            "duration": result.duration,
        }
        head = f"exit code {result.exit_code}"
        if result.timed_out:
            head = f"timed out after {timeout:g} s (killed)"
        elif result.signal:
            head = f"killed by signal {result.signal}"
        text = f"{head}\nstdout:\n{_decode(out)}"
        if err:
            text += f"\nstderr:\n{_decode(err)}"
        ok = result.exit_code == 0 and not result.timed_out
        return Observation(text, ok=ok, detail=detail)

    async def _files(self, args: dict[str, Any]) -> Observation:
        path = workspace_path(args["path"])
        action = args["action"]
        async with self.borrow() as channel:
            if action == "write":
                data = args["content"].encode()
                await channel.put(path, data, len(data))
                return Observation(f"wrote {len(data)} bytes to {path}", detail={"path": path})
            if action == "read":
                stream = await channel.get(path)
                async with stream:
                    data = await stream.read_all()
                return Observation(_decode(data), detail={"path": path, "size": len(data)})
            result, out, err = await channel.run(
                ["python3", "-c", guest_scripts.LIST, path], timeout=30, max_output=MAX_OUTPUT
            )
        answer = guest_scripts.answer(out) if result.exit_code == 0 else None
        listing = answer.get("entries") if answer else None
        if not isinstance(listing, list):
            return Observation(f"error: could not list {path}: {_decode(err)[-500:]}", ok=False)
        lines = [
            f"{e[0]}\t{e[1]} bytes"
            for e in listing
            if isinstance(e, list) and len(e) == 2 and isinstance(e[0], str)
        ]
        return Observation("\n".join(lines) or f"{path} is empty", detail={"path": path})

    async def _json_script(
        self, script: str, request: dict[str, Any], timeout: float
    ) -> tuple[dict[str, Any] | None, str]:
        async with self.borrow() as channel:
            result, out, err = await channel.run(
                ["python3", "-c", script],
                cwd="/workspace",
                stdin=json.dumps(request).encode(),
                timeout=timeout,
                max_output=MAX_SERVICE_ANSWER,
            )
        if result.timed_out:
            return None, f"timed out after {timeout:g} s"
        answer = guest_scripts.answer(out)
        if answer is None:
            return None, f"exit code {result.exit_code}: {_decode(err)[-1500:]}"
        return answer, ""

    async def _service(self, upstream: str, args: dict[str, Any]) -> Observation:
        timeout = float(self.timeout_cap)
        request = {
            "url": upstream.rstrip("/") + args["path"],
            "method": args["method"],
            "body": args.get("body"),
            "headers": args.get("headers") or {},
            "timeout": timeout,
        }
        answer, problem = await self._json_script(guest_scripts.SERVICE, request, timeout + 5)
        if answer is None or "error" in answer:
            why = problem or str(answer.get("error") if answer else "")
            return Observation(f"error: the service call failed: {why}", ok=False)
        status = answer.get("status")
        text = f"http status: {status}\n"
        if answer.get("egress_rule"):
            text += f"refused by the egress policy: {answer['egress_rule']}\n"
        text += str(answer.get("body", ""))
        ok = isinstance(status, int) and status < 400
        return Observation(text, ok=ok, detail={"status": status, "url": request["url"]})
