"""A command whose stdin stays open (`GuestChannel.exec(..., stdin_open=True)`) in a real gVisor
sandbox: what the host sends later reaches it as it is sent, it answers each piece before the
next is sent, and once it has ended, sending more is refused."""

from __future__ import annotations

import pytest

from aamp.sandbox import GuestUnavailable
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, SandboxManager

pytestmark = pytest.mark.usefixtures("base_image")

ECHO_LINES = r"""
import sys
for line in sys.stdin:
    if line.strip() == "stop":
        break
    sys.stdout.write(line.upper())
    sys.stdout.flush()
"""


async def test_stdin_kept_open_takes_lines_one_answer_at_a_time(settings) -> None:
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    manager = SandboxManager(settings, ImageStore(settings), drivers, "gvisor")
    await manager.start()
    try:
        sandbox = await manager.create(CreateRequest())
        async with manager.use(sandbox.id) as channel:
            with pytest.raises(ValueError, match="not both"):
                await channel.exec(["cat"], stdin=b"x", stdin_open=True)
            session = await channel.exec(["python3", "-c", ECHO_LINES], stdin_open=True)
            answers = []
            for line in (b"first\n", b"second\n"):
                await session.send_stdin(line)
                answers.append((await session.__anext__()).data)
            await session.send_stdin(b"stop\n")
            result = await session.wait()
            with pytest.raises(GuestUnavailable, match="stdin is closed"):
                await session.send_stdin(b"late\n")
    finally:
        await manager.shutdown()
    assert answers == [b"FIRST\n", b"SECOND\n"]
    assert result.exit_code == 0
