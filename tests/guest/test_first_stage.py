"""The guest agent's first stage (`aamp/guest/first_stage.c`) in front of the real agent: it
serves the first exec itself, hands every other first request to the agent, and keeps the
agent's constants. (Every test of `test_agent_channel.py` also runs behind it.)"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from guest_helpers import AgentStarter

from aamp.guest import agent, exec_runner, wire
from aamp.sandbox import GuestChannel

pytestmark = pytest.mark.timeout(60)

SOURCE = Path(__file__).resolve().parents[2] / "src" / "aamp" / "guest" / "first_stage.c"
PARENT = ["sh", "-c", "tr '\\0' ' ' < /proc/$PPID/cmdline"]


def defines() -> dict[str, str]:
    return dict(re.findall(r"^#define (\w+) (.+)$", SOURCE.read_text(), re.MULTILINE))


def test_its_constants_are_the_agents() -> None:
    d = defines()
    assert d["AGENT_VERSION"] == f'"{agent.AGENT_VERSION}"'
    assert int(d["PROTOCOL_VERSION"]) == wire.PROTOCOL_VERSION
    assert eval(d["MAX_PAYLOAD"]) == wire.MAX_PAYLOAD
    assert eval(d["OUTPUT_CHUNK"]) == exec_runner.OUTPUT_CHUNK
    assert float(d["DRAIN_GRACE"]) == exec_runner.DRAIN_GRACE
    assert float(d["DRAIN_TIMEOUT"]) == agent.DRAIN_TIMEOUT
    text = SOURCE.read_text()
    for name, value in {**exec_runner.BASE_ENV}.items():
        assert f'"{name}={value}"' in text


@pytest.mark.parametrize("start_agent", ["first-stage"], indirect=True)
async def test_the_first_exec_is_served_by_the_first_stage(ready: GuestChannel) -> None:
    result, first, _ = await ready.run(PARENT)
    assert result.exit_code == 0 and b"agent-init" in first
    _, second, _ = await ready.run(PARENT)
    assert b"agent-init" not in second and b"python3" in second


@pytest.mark.parametrize("start_agent", ["first-stage"], indirect=True)
async def test_a_first_request_with_stdin_goes_to_the_agent(ready: GuestChannel) -> None:
    result, out, _ = await ready.run(["sh", "-c", "cat; " + PARENT[2]], stdin=b"in:")
    assert result.exit_code == 0 and out.startswith(b"in:")
    assert b"agent-init" not in out and b"python3" in out


@pytest.mark.parametrize("start_agent", ["first-stage"], indirect=True)
async def test_requests_it_cannot_read_go_to_the_agent(
    ready: GuestChannel, workspace: Path
) -> None:
    """An exec with an unusual (but valid) JSON value is the agent's to judge."""
    request = {"op": "exec", "argv": ["sh", "-c", PARENT[2]], "env": {"A": "\u00e9\U0001f600"}}
    conn = await ready._acquire()  # the first stage's connection: the first to say hello
    try:
        wire.write_control(conn.writer, {**request, "stdin": 0})
        frames = []
        while True:
            ftype, payload = await wire.read_frame(conn.reader)
            frames.append((ftype, payload))
            if ftype == wire.CONTROL and b"exit_code" in payload:
                break
    finally:
        conn.close()
    out = b"".join(p for t, p in frames if t == wire.STDOUT)
    assert b"python3" in out and b"agent-init" not in out


async def test_an_exec_with_stdin_or_env_through_the_first_stage(
    start_agent: AgentStarter, channel: GuestChannel
) -> None:
    start_agent()
    await channel.wait_ready(timeout=10)
    result, out, _ = await channel.run(
        ["sh", "-c", 'printf "%s|%s|%s" "$A" "$HOME" "$PWD"'], env={"A": "é x", "HOME": "/h"}
    )
    assert result.exit_code == 0
    assert out.decode().split("|")[:2] == ["é x", "/h"]


@pytest.mark.parametrize("start_agent", ["first-stage"], indirect=True)
async def test_a_long_first_command_does_not_hold_up_the_agent(ready: GuestChannel) -> None:
    """The agent starts after the first command, or as soon as a request comes on the spare
    connection the first stage dialled for it: the second request never waits for the
    first command."""
    started = time.monotonic()
    async with await ready.exec(["sleep", "5"], timeout=30) as first:
        result, out, _ = await ready.run(["echo", "second"])
        assert (result.exit_code, out) == (0, b"second\n")
        assert time.monotonic() - started < 4
        await first.kill()
