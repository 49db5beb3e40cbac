"""The MCP server with the official MCP client, in-process and over real HTTP (`/mcp` on a
real `aamp up`): it lists the tools, makes a sandbox, runs Python, writes and reads a file,
starts a run with the scripted model double and fetches its artifact. An operator's token
cannot do through a tool what the API refuses it, and the refusal is in the audit log in the
very shape of the API's own."""

from __future__ import annotations

import asyncio
import base64
import sys
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client as McpClient
from mcp import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from scripted_model import ScriptedModelServerForTests
from test_cli_runs import WRITE, publish_agent, write_reporter  # tests/runs

from aamp import AsyncClient, Client
from aamp.mcp import build_server

TOOLS = {
    "browser_screenshot",
    "sandbox_create",
    "sandbox_exec",
    "sandbox_write_file",
    "sandbox_read_file",
    "sandbox_list",
    "sandbox_destroy",
    "run_start",
    "run_status",
    "run_artifacts",
    "run_fetch_artifact",
}


@pytest.fixture
def live(shared_live):
    """One plane for this module's tests (conftest_live.py's `shared_live`)."""
    return shared_live


def over_http(url: str, token: str) -> McpClient:
    headers = {"authorization": f"Bearer {token}"}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(300))
    return McpClient(streamable_http_client(f"{url}/mcp", http_client=http))


async def call(client: McpClient, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, (tool, result.content)
    return result.structured_content


async def refusal(client: McpClient, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, (tool, result.structured_content)
    text = result.content[0].text
    prefix = f"Error executing tool {tool}: "  # the MCP SDK's own framing of a ToolError
    assert text.startswith(prefix), text
    return text.removeprefix(prefix)


async def the_whole_flow(client: McpClient, csv: bytes) -> None:
    listed = await client.list_tools()
    by_name = {t.name: t for t in listed.tools}
    assert set(by_name) == TOOLS
    schema = by_name["sandbox_exec"].input_schema
    assert set(schema["required"]) == {"sandbox_id", "argv"}
    assert schema["properties"]["argv"]["type"] == "array"
    assert all(t.description for t in listed.tools)

    made = await call(client, "sandbox_create", image="base", ttl_seconds=300)
    sandbox = made["id"]
    assert sandbox.startswith("sb-") and made["expires_in"] <= 300
    ran = await call(
        client, "sandbox_exec", sandbox_id=sandbox, argv=["python3", "-c", "print(6*7)"]
    )
    assert (ran["exit_code"], ran["stdout"], ran["timed_out"]) == (0, "42\n", False)
    big = await call(
        client, "sandbox_exec", sandbox_id=sandbox, argv=["python3", "-c", "print('x'*100000)"]
    )
    assert len(big["stdout"]) == 64 * 1024 and "cut at 65536 bytes" in big["note"]
    slow = await call(
        client, "sandbox_exec", sandbox_id=sandbox, argv=["sleep", "9"], timeout_seconds=1
    )
    assert slow["timed_out"]
    await call(client, "sandbox_write_file", sandbox_id=sandbox, path="in/a.txt", content="héllo")
    back = await call(client, "sandbox_read_file", sandbox_id=sandbox, path="in/a.txt")
    assert (back["content"], back["bytes"]) == ("héllo", 6)
    raw = bytes(range(256))
    await call(
        client,
        "sandbox_write_file",
        sandbox_id=sandbox,
        path="b.bin",
        content=base64.b64encode(raw).decode(),
        encoding="base64",
    )
    got = await call(
        client, "sandbox_read_file", sandbox_id=sandbox, path="b.bin", encoding="base64"
    )
    assert base64.b64decode(got["content"]) == raw
    assert sandbox in [s["id"] for s in (await call(client, "sandbox_list"))["sandboxes"]]
    await call(client, "sandbox_destroy", sandbox_id=sandbox)
    assert sandbox not in [s["id"] for s in (await call(client, "sandbox_list"))["sandboxes"]]
    odd = await client.call_tool("sandbox_destroy", {"sandbox_id": "../users/admin"})
    assert odd.is_error and "pattern" in odd.content[0].text  # refused before any request
    gone = await refusal(client, "sandbox_exec", sandbox_id=sandbox, argv=["true"])
    assert gone.startswith("refused (unknown_sandbox)")

    inputs = [{"name": "a.csv", "content_base64": base64.b64encode(csv).decode()}]
    run = await call(client, "run_start", agent="reporter", task="count", inputs=inputs)
    status = await call(client, "run_status", run_id=run["id"], wait_seconds=240)
    assert status["status"] == "succeeded", status
    kinds = [s["type"] for s in status["steps"]]
    assert "tool.call" in kinds and kinds[-1] == "run.finished"
    later = await call(
        client, "run_status", run_id=run["id"], after_event=status["steps"][-2]["id"]
    )
    assert [s["type"] for s in later["steps"]] == ["run.finished"]
    (artifact,) = (await call(client, "run_artifacts", run_id=run["id"]))["artifacts"]
    assert (artifact["name"], artifact["size"]) == ("n.txt", 1)
    fetched = await call(client, "run_fetch_artifact", run_id=run["id"], name="n.txt")
    assert fetched["content"] == "8"


def test_in_process_and_over_http(live, tmp_path) -> None:
    turns = [
        {"tool_calls": [{"name": "python", "arguments": {"code": WRITE}}]},
        {"content": "Counted."},
    ] * 2
    with ScriptedModelServerForTests(turns) as model:
        csv = write_reporter(tmp_path)
        publish_agent(live, tmp_path, "reporter", "files-only", model.base_url)

        async def main() -> None:
            async with AsyncClient(live.url, live.admin_token) as sdk:

                async def client_for(_ctx: object) -> AsyncClient:
                    return sdk

                async with McpClient(build_server(client_for)) as in_process:
                    await the_whole_flow(in_process, csv.read_bytes())
            async with over_http(live.url, live.admin_token) as remote:
                await the_whole_flow(remote, csv.read_bytes())

        asyncio.run(main())


def _memory_kib(pid: int, field: str) -> int:
    """A process's VmRSS or VmHWM (its peak since the last reset), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def test_a_huge_exec_output_is_cut_as_it_arrives_not_held(live) -> None:
    """128 MiB of stdout through sandbox_exec over /mcp: the control plane's peak memory does
    not grow by anything like the output (only what is returned is kept while it streams),
    64 KiB come back, and the note counts every byte written and dropped."""
    size = 128 * 1024 * 1024
    pid = live.proc.pid

    async def main() -> tuple[dict[str, Any], int]:
        async with over_http(live.url, live.admin_token) as client:
            made = await call(client, "sandbox_create", image="base", ttl_seconds=600)
            argv = ["head", "-c", str(size), "/dev/zero"]
            await call(client, "sandbox_exec", sandbox_id=made["id"], argv=["true"])
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM counts from here
            before = _memory_kib(pid, "VmRSS")
            ran = await call(
                client, "sandbox_exec", sandbox_id=made["id"], argv=argv, timeout_seconds=600
            )
            grown = _memory_kib(pid, "VmHWM") - before
            await call(client, "sandbox_destroy", sandbox_id=made["id"])
            return ran, grown

    ran, grown_kib = asyncio.run(main())
    assert grown_kib < 48 * 1024, f"the control plane grew by {grown_kib} KiB"
    assert ran["exit_code"] == 0 and ran["stdout"] == "\0" * 64 * 1024
    dropped = size - 64 * 1024
    assert f"stdout cut at 65536 bytes ({size} written, {dropped} dropped)" in ran["note"]
    assert "stderr" not in ran["note"]


def test_a_file_over_the_tools_bound_is_refused_before_it_is_read(live) -> None:
    """sandbox_read_file of a 200 MiB file: refused naming the bound, and the control plane
    (which serves /mcp) did not read it into memory first (it read all of it, then refused)."""
    size = 200 * 1024 * 1024
    pid = live.proc.pid

    async def main() -> tuple[str, int]:
        async with over_http(live.url, live.admin_token) as client:
            made = await call(client, "sandbox_create", image="base", ttl_seconds=600)
            argv = ["head", "-c", str(size), "/dev/zero"]
            make = ["sh", "-c", f"{' '.join(argv)} > /workspace/big.bin"]
            await call(client, "sandbox_exec", sandbox_id=made["id"], argv=make)
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM counts from here
            before = _memory_kib(pid, "VmRSS")
            why = await refusal(client, "sandbox_read_file", sandbox_id=made["id"], path="big.bin")
            grown = _memory_kib(pid, "VmHWM") - before
            await call(client, "sandbox_destroy", sandbox_id=made["id"])
            return why, grown

    why, grown_kib = asyncio.run(main())
    assert f"big.bin is {size} bytes" in why and "a tool moves at most 4 MiB" in why, why
    assert grown_kib < 48 * 1024, f"the control plane grew by {grown_kib} KiB"


def audit_of(admin: Client, actor: str, action: str) -> list[dict[str, Any]]:
    page = admin.call("GET", "/v1/audit", params={"actor": actor, "action": action})
    return page["records"]


def test_an_operator_is_refused_over_mcp_what_the_api_refuses(live) -> None:
    with Client(live.url, live.admin_token) as admin:
        body = {"username": "olga", "role": "operator", "password": "olga-password-1"}
        admin.call("POST", "/v1/users", json=body)
        token = admin.call("POST", "/v1/users/olga/tokens", json={"name": "mcp"})["token"]

        # The API's own answer to the same request, and its audit record.
        direct = httpx.post(
            f"{live.url}/v1/sandboxes",
            json={"image": "base"},
            headers={"authorization": f"Bearer {token}"},
        )
        assert direct.status_code == 403
        (api_record,) = audit_of(admin, "user:olga", "sandbox.create")

        async def main() -> str:
            async with over_http(live.url, token) as client:
                text = await refusal(client, "sandbox_create", image="base")
                assert (await call(client, "sandbox_list"))["sandboxes"] == []
                return text

        said = asyncio.run(main())
        assert said == f"refused (forbidden): {direct.json()['message']}"
        records = audit_of(admin, "user:olga", "sandbox.create")
        assert len(records) == 2
        mcp_record = records[-1]
        same = ("actor", "action", "resource", "decision", "reason", "details")
        assert {k: mcp_record[k] for k in same} == {k: api_record[k] for k in same}
        assert mcp_record["decision"] == "deny" and set(mcp_record) == set(api_record)
        assert admin.list_sandboxes() == []  # nothing was made

        # The admin's sandbox: each tool on it is refused as the API refuses its twin request.
        with admin.sandboxes.create(image="base", ttl=300) as theirs:
            url = "http://app.test/"
            twins = [
                ("sandbox_exec", {"argv": ["true"]}, "POST", "/exec", {"json": {"argv": ["true"]}}),
                ("sandbox_read_file", {"path": "a"}, "GET", "/files", {"params": {"path": "a"}}),
                ("browser_screenshot", {"url": url}, "POST", "/screenshot", {"json": {"url": url}}),
                ("sandbox_destroy", {}, "DELETE", "", {}),
            ]
            for tool, arguments, method, suffix, request in twins:
                answer = httpx.request(
                    method,
                    f"{live.url}/v1/sandboxes/{theirs.id}{suffix}",
                    headers={"authorization": f"Bearer {token}"},
                    **request,
                )
                assert answer.status_code == 403, (tool, answer.text)

                said = asyncio.run(refused_over_http(live.url, token, tool, theirs.id, arguments))
                assert said == f"refused (forbidden): {answer.json()['message']}", tool
                page = admin.call("GET", "/v1/audit", params={"actor": "user:olga"})
                *_, api_record, mcp_record = page["records"]
                assert {k: mcp_record[k] for k in same} == {k: api_record[k] for k in same}
                assert mcp_record["decision"] == "deny", tool
            assert theirs.exec(["true"]).ok  # untouched


async def refused_over_http(
    url: str, token: str, tool: str, sandbox_id: str, arguments: dict[str, Any]
) -> str:
    async with over_http(url, token) as client:
        return await refusal(client, tool, sandbox_id=sandbox_id, **arguments)


def test_mcp_over_http_needs_a_bearer_token(live) -> None:
    bare = httpx.post(f"{live.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert bare.status_code == 401 and bare.json()["code"] == "unauthenticated"

    async def main() -> None:
        async with over_http(live.url, "aamp_not-a-token") as client:
            await client.list_tools()

    with pytest.raises(BaseExceptionGroup) as refused:  # the handshake: 401 before MCP reads it
        asyncio.run(main())
    assert refused.group_contains(MCPError)
    garbage = httpx.post(
        f"{live.url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"authorization": "Bearer aamp_not-a-token"},
    )
    assert garbage.status_code == 401 and "not valid" in garbage.json()["message"]


def test_aamp_mcp_over_stdio_acts_with_the_clis_token(live) -> None:
    """`aamp mcp` as a desktop client starts it: the tools act as the CLI's token's holder
    (here the login profile of a new user), and a refusal names the API's rule."""
    with Client(live.url, live.admin_token) as admin:
        body = {"username": "ines", "role": "operator", "password": "ines-password-1"}
        admin.call("POST", "/v1/users", json=body)
        token = admin.call("POST", "/v1/users/ines/tokens", json={"name": "desk"})["token"]
    env = {k: v for k, v in live.env.items() if k.startswith(("AAMP_", "XDG_", "PYTHON", "PATH"))}
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "aamp", "mcp"], env={**env, "AAMP_TOKEN": token}
    )

    async def main() -> None:
        async with McpClient(server) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS
            assert (await call(client, "sandbox_list"))["sandboxes"] == []
            said = await refusal(client, "sandbox_create", image="base")
            assert said.startswith("refused (forbidden): agent: a sandbox is made for an agent")

    asyncio.run(main())
    with Client(live.url, live.admin_token) as admin:
        (record,) = audit_of(admin, "user:ines", "sandbox.create")
        assert record["decision"] == "deny"
