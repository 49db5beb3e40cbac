"""The MCP tools: aamp's sandboxes and agent runs for outside agents, each tool one call (or
a few) of the control plane's own /v1 API through the SDK, with the caller's token.

So there is no second authorisation path: every tool call is authenticated, decided by
`allowed` and audited by the API's guard exactly as its API twin is (the same action, the
same record, denials included), and a sandbox made here obeys the same policy and lifetime.
A refusal comes back as a tool error naming the API's `code` and `message`.

`build_server(client_for)` makes the server; `client_for(ctx)` gives the SDK client a call
acts through (stdio: the one made at start; HTTP: the request's bearer token's, `clients`).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent, TextContent
from pydantic import Field

from aamp import __version__
from aamp.client import AsyncClient, AsyncSandbox, ClientError, ExecResult

# The SDK client a call acts through: the caller's token's (it is not closed by the tool).
ClientFor = Callable[[Context], Awaitable[AsyncClient]]
# What a tool returns of a command's output, per stream; the rest is cut with a note.
MAX_OUTPUT_BYTES = 64 * 1024
MAX_FILE_BYTES = 4 * 1024 * 1024  # one file through a tool, either way (base64 in JSON)

ID_PATTERN = r"^[A-Za-z0-9_-]+$"  # an id is one path segment of the API's routes
SandboxId = Annotated[
    str, Field(description="a sandbox id, sb-…", min_length=1, max_length=64, pattern=ID_PATTERN)
]
RunId = Annotated[
    str, Field(description="a run id, run-…", min_length=1, max_length=32, pattern=ID_PATTERN)
]
GuestPath = Annotated[
    str,
    Field(
        description="a path in the sandbox; relative paths are under /workspace "
        "(inputs in in/, outputs in out/)",
        min_length=1,
        max_length=4096,
    ),
]
Encoding = Annotated[
    Literal["utf-8", "base64"],
    Field(description="utf-8 for text, base64 for any bytes"),
]

INSTRUCTIONS = """\
aamp runs code in disposable, isolated sandboxes and runs aamp agents, under your account's
grants, policies and audit. Make a sandbox (sandbox_create), run commands in it
(sandbox_exec: argv, not a shell line — use ["sh", "-c", "..."] for one), move files
(sandbox_write_file, sandbox_read_file), and destroy it when done (sandbox_destroy); it is
destroyed anyway when its lifetime ends. browser_screenshot shows a web page as the
policy's egress rules let a sandbox's browser see it. Start an agent's run with run_start,
follow it with run_status, and fetch what it made with run_artifacts and
run_fetch_artifact. A refusal names the rule that refused; it is not retried by asking
again."""


def _refusal(exc: ClientError) -> ToolError:
    return ToolError(f"refused ({exc.code}): {exc.message}")


def _cut_note(result: ExecResult) -> str | None:
    """What of a command's output was not returned, or None when it all was."""
    cut = [
        f"{name} cut at {MAX_OUTPUT_BYTES} bytes ({size} written, {size - MAX_OUTPUT_BYTES} "
        "dropped)"
        for name, size in (("stdout", result.stdout_size), ("stderr", result.stderr_size))
        if size > MAX_OUTPUT_BYTES
    ]
    if not cut:
        return None
    return f"{'; '.join(cut)}; redirect the output to a file and read parts of it"


def _encode(data: bytes, encoding: str) -> str:
    if encoding == "base64":
        return base64.b64encode(data).decode()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError("the file is not UTF-8 text; read it with encoding base64") from None


def _decode(content: str, encoding: str) -> bytes:
    if encoding == "base64":
        try:
            return base64.b64decode(content, validate=True)
        except ValueError:
            raise ToolError("content is not valid base64") from None
    return content.encode("utf-8")


def build_server(client_for: ClientFor) -> MCPServer:
    # The MCP SDK logs every request at INFO ("Terminating session" for each stateless call),
    # and by default installs a rich-text handler for it: a line rendered and written per tool
    # call, several milliseconds of a busy host each time. Its warnings and errors still show.
    logging.getLogger("mcp").setLevel(logging.WARNING)
    server = MCPServer("aamp", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    async def with_client(ctx: Context, work: Callable[[AsyncClient], Awaitable[Any]]) -> Any:
        client = await client_for(ctx)
        try:
            return await work(client)
        except ClientError as exc:
            raise _refusal(exc) from None

    @server.tool()
    async def sandbox_create(
        ctx: Context,
        agent: Annotated[
            str | None,
            Field(description="the id (ag-…) of an agent you can run; the sandbox is for it"),
        ] = None,
        policy: Annotated[
            str | None,
            Field(
                description="the name of a policy granted to that agent; it sets the image, "
                "lifetime, resources, network egress and services"
            ),
        ] = None,
        image: Annotated[
            str | None, Field(description="admins only, without a policy: base, browser, docs, …")
        ] = None,
        ttl_seconds: Annotated[
            float | None,
            Field(description="admins only, without a policy: lifetime in seconds", gt=0),
        ] = None,
    ) -> dict[str, Any]:
        """Create an isolated sandbox (no network but through its policy's egress rules).
        Everyone but admins names an agent they can run and a policy granted to it. Returns
        the sandbox's id (use it with the other sandbox tools), image and seconds left."""

        async def create(client: AsyncClient) -> dict[str, Any]:
            made = await client.sandboxes.create(
                agent=agent, policy=policy, image=image, ttl=ttl_seconds
            )
            return _sandbox_view(made.info)

        return await with_client(ctx, create)

    @server.tool()
    async def sandbox_exec(
        ctx: Context,
        sandbox_id: SandboxId,
        argv: Annotated[
            list[str],
            Field(
                description='the command as a list of words, e.g. ["python3", "-c", '
                '"print(1)"] or ["sh", "-c", "ls | wc -l"]',
                min_length=1,
            ),
        ],
        timeout_seconds: Annotated[
            float, Field(description="kill the command after this many seconds", gt=0, le=3600)
        ] = 60,
        stdin: Annotated[str | None, Field(description="text given to the command")] = None,
    ) -> dict[str, Any]:
        """Run a command in the sandbox (working directory /workspace) and wait for it.
        Returns exit_code, timed_out, and stdout/stderr as text, each cut at 64 KiB with a
        note when longer (write big output to a file and read it instead)."""

        async def run(client: AsyncClient) -> dict[str, Any]:
            sandbox = await _sandbox(client, sandbox_id)
            # Only what is returned is kept of each stream; the rest is counted, not held.
            result = await sandbox.exec(
                argv,
                timeout=timeout_seconds,
                stdin=stdin.encode() if stdin is not None else None,
                keep=MAX_OUTPUT_BYTES,
            )
            answer: dict[str, Any] = {
                "exit_code": result.exit_code,
                "signal": result.signal,
                "timed_out": result.timed_out,
                "stdout": result.stdout.decode("utf-8", errors="replace"),
                "stderr": result.stderr.decode("utf-8", errors="replace"),
            }
            note = _cut_note(result)
            if note is not None:
                answer["note"] = note
            return answer

        return await with_client(ctx, run)

    @server.tool()
    async def sandbox_write_file(
        ctx: Context,
        sandbox_id: SandboxId,
        path: GuestPath,
        content: Annotated[str, Field(description="the file's content, encoded as `encoding`")],
        encoding: Encoding = "utf-8",
    ) -> dict[str, Any]:
        """Write a file into the sandbox (checked against its policy's inbound data rules,
        hashed and audited); replaces a file already there. At most 4 MiB."""
        data = _decode(content, encoding)
        if len(data) > MAX_FILE_BYTES:
            raise ToolError(f"the file is {len(data)} bytes; a tool moves at most {MAX_FILE_BYTES}")

        async def write(client: AsyncClient) -> dict[str, Any]:
            await (await _sandbox(client, sandbox_id)).files.write(path, data)
            return {"path": path, "bytes": len(data)}

        return await with_client(ctx, write)

    @server.tool()
    async def sandbox_read_file(
        ctx: Context, sandbox_id: SandboxId, path: GuestPath, encoding: Encoding = "utf-8"
    ) -> dict[str, Any]:
        """Read a file out of the sandbox (hashed and audited). At most 4 MiB; text files
        with utf-8, anything else with base64."""

        async def read(client: AsyncClient) -> dict[str, Any]:
            sandbox = await _sandbox(client, sandbox_id)
            try:  # refused before more than the bound is read into this process
                data = await sandbox.files.read(path, max_bytes=MAX_FILE_BYTES)
            except ClientError as exc:
                if exc.code != "too_large":
                    raise
                raise ToolError(f"{exc.message}; a tool moves at most 4 MiB") from None
            return {"path": path, "bytes": len(data), "content": _encode(data, encoding)}

        return await with_client(ctx, read)

    @server.tool()
    async def sandbox_list(ctx: Context) -> dict[str, Any]:
        """The sandboxes you can use (your own; all of them for an admin)."""

        async def listed(client: AsyncClient) -> dict[str, Any]:
            return {"sandboxes": [_sandbox_view(s.info) for s in await client.sandboxes.list()]}

        return await with_client(ctx, listed)

    @server.tool()
    async def sandbox_destroy(ctx: Context, sandbox_id: SandboxId) -> dict[str, Any]:
        """Destroy the sandbox and everything in it; do this when you are done."""

        async def destroy(client: AsyncClient) -> dict[str, Any]:
            await client.call("DELETE", f"/v1/sandboxes/{sandbox_id}")
            return {"destroyed": sandbox_id}

        return await with_client(ctx, destroy)

    @server.tool()
    async def browser_screenshot(
        ctx: Context,
        url: Annotated[
            str,
            Field(description="the page to load, http:// or https://", pattern=r"^https?://"),
        ],
        sandbox_id: Annotated[
            str | None,
            Field(
                description="a browser sandbox of yours (sb-…) to take it in; without one, a "
                "sandbox is made from `agent` and `policy` for this screenshot and destroyed",
                min_length=1,
                max_length=64,
                pattern=ID_PATTERN,
            ),
        ] = None,
        agent: Annotated[
            str | None, Field(description="without sandbox_id: an agent you can run (ag-…)")
        ] = None,
        policy: Annotated[
            str | None,
            Field(description="without sandbox_id: a policy of that agent with image: browser"),
        ] = None,
        full_page: Annotated[
            bool, Field(description="the whole page, not only the visible part")
        ] = False,
    ) -> CallToolResult:
        """Load a web page in a sandbox's browser and return a PNG screenshot of it. The page
        is reached only through the sandbox policy's egress rules: a domain the policy does
        not allow is refused (the error names the rule), never loaded."""

        if sandbox_id is None and (agent is None or policy is None):
            raise ToolError("give sandbox_id, or agent and policy for a one-shot sandbox")

        async def take(client: AsyncClient) -> CallToolResult:
            if sandbox_id is not None:
                return await _screenshot(client, sandbox_id, url, full_page)
            made = await client.sandboxes.create(agent=agent, policy=policy)
            try:
                return await _screenshot(client, made.id, url, full_page)
            finally:
                await client.call("DELETE", f"/v1/sandboxes/{made.id}")

        return await with_client(ctx, take)

    @server.tool()
    async def run_start(
        ctx: Context,
        agent: Annotated[str, Field(description="the agent's id (ag-…) or name")],
        task: Annotated[str, Field(description="what the agent is to do", min_length=1)],
        inputs: Annotated[
            list[dict[str, str]],
            Field(
                description='input files, each {"name": "data.csv", "content_base64": "…"}; '
                "the agent finds them in /workspace/in"
            ),
        ] = [],  # noqa: B006 - the schema's default; never mutated
    ) -> dict[str, Any]:
        """Start a run of an agent (its latest published version) on a task. Returns the run's
        id and status; follow it with run_status."""
        pairs = []
        for item in inputs:
            if set(item) != {"name", "content_base64"}:
                raise ToolError('each input is {"name": ..., "content_base64": ...}')
            pairs.append((item["name"], _decode(item["content_base64"], "base64")))

        async def start(client: AsyncClient) -> dict[str, Any]:
            run = await client.agents.run(agent, task, inputs=pairs)
            return _run_view(run.info)

        return await with_client(ctx, start)

    @server.tool()
    async def run_status(
        ctx: Context,
        run_id: RunId,
        wait_seconds: Annotated[
            float,
            Field(description="wait up to this long for the run to end (0: answer now)", ge=0),
        ] = 0,
        after_event: Annotated[
            int, Field(description="list only the steps after this event id", ge=0)
        ] = 0,
    ) -> dict[str, Any]:
        """A run's status (queued, running, waiting_approval, succeeded, failed, cancelled,
        timed_out) and, once it has ended, its answer or reason and its steps after
        `after_event` (each with an id: pass one to get only the steps after it). While it
        runs, steps is empty: call again with wait_seconds to wait for the end."""

        async def status(client: AsyncClient) -> dict[str, Any]:
            run = await client.agents.get_run(run_id)
            if wait_seconds and run.status not in FINISHED:
                try:
                    await run.wait(timeout=wait_seconds)
                except ClientError as exc:
                    if exc.code != "timed_out":
                        raise
            steps = []
            if run.status in FINISHED:
                async for event in run.events(after=after_event):
                    steps.append({"id": event.id, "type": event.type, "data": event.data})
            return {**_run_view(run.info), "steps": steps}

        return await with_client(ctx, status)

    @server.tool()
    async def run_artifacts(ctx: Context, run_id: RunId) -> dict[str, Any]:
        """The files a run produced (its /workspace/out and browser downloads): name, size
        and SHA-256 of each; fetch one with run_fetch_artifact."""

        async def listed(client: AsyncClient) -> dict[str, Any]:
            items = await (await client.agents.get_run(run_id)).artifacts()
            return {
                "artifacts": [{"name": a.name, "size": a.size, "sha256": a.sha256} for a in items]
            }

        return await with_client(ctx, listed)

    @server.tool()
    async def run_fetch_artifact(
        ctx: Context,
        run_id: RunId,
        name: Annotated[str, Field(description="the artifact's name, as run_artifacts lists it")],
        encoding: Encoding = "utf-8",
    ) -> dict[str, Any]:
        """One artifact's content (checked against its listed size and SHA-256; audited).
        At most 4 MiB."""

        async def fetch(client: AsyncClient) -> dict[str, Any]:
            items = await (await client.agents.get_run(run_id)).artifacts()
            found = next((a for a in items if a.name == name), None)
            if found is None:
                raise ToolError(f"run {run_id} has no artifact named {name!r}")
            if found.size > MAX_FILE_BYTES:
                raise ToolError(f"{name} is {found.size} bytes; a tool moves at most 4 MiB")
            data = await found.read()
            return {"name": name, "sha256": found.sha256, "content": _encode(data, encoding)}

        return await with_client(ctx, fetch)

    return server


async def _screenshot(
    client: AsyncClient, sandbox_id: str, url: str, full_page: bool
) -> CallToolResult:
    shot = await AsyncSandbox(client, {"id": sandbox_id}).screenshot(url, full_page=full_page)
    about = {"url": shot.url, "title": shot.title, "status": shot.status}
    about |= {"sha256": shot.sha256, "bytes": len(shot.png)}
    return CallToolResult(
        content=[
            ImageContent(data=base64.b64encode(shot.png).decode(), mime_type="image/png"),
            TextContent(text=json.dumps({"sandbox_id": sandbox_id, **about})),
        ]
    )


FINISHED = ("succeeded", "failed", "cancelled", "timed_out")


async def _sandbox(client: AsyncClient, sandbox_id: str) -> AsyncSandbox:
    """The sandbox by id, without a request: the call that uses it is decided by the API."""
    return AsyncSandbox(client, {"id": sandbox_id})


def _sandbox_view(info: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "image", "driver", "expires_in", "agent", "policy", "owner")
    return {k: info[k] for k in keys if k in info}


def _run_view(info: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "agent_id", "version", "status", "reason", "answer", "steps", "created_at")
    return {k: info[k] for k in keys if k in info}
