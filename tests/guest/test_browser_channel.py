"""The channel's `browser` operation against a hostile guest (`HostileGuestForTests`): the
answer comes back only as DATA frames ending in EOF, never over its size limit, never after
its timeout; a guest refusal is a `GuestError` with its message; anything else is dropped."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from guest_helpers import HostileGuestForTests, make_channel

from aamp.guest import wire
from aamp.sandbox import GuestChannel, GuestError, GuestProtocolError, GuestTimeout

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def channel(sock_path: Path) -> GuestChannel:
    ch = make_channel(sock_path, hello_timeout=0.5, io_timeout=0.5)
    await ch.start()
    yield ch  # type: ignore[misc]
    await ch.close()


async def ask(channel: GuestChannel, sock_path: Path, **kw: float):
    guest = await HostileGuestForTests.connect(sock_path)
    await channel.wait_ready(timeout=2)
    options = {"timeout": 2.0, "max_answer": 1000, **kw}
    task = asyncio.ensure_future(
        channel.browser({"action": "snapshot", "timeout": 5}, **options)  # type: ignore[arg-type]
    )
    request = await guest.read_request()
    return guest, request, task


async def test_the_answer_is_the_data_up_to_eof(channel: GuestChannel, sock_path: Path) -> None:
    guest, request, task = await ask(channel, sock_path)
    inner = {"action": "snapshot", "timeout": 5}
    assert request == {"op": "browser", "request": inner, "timeout": 2.0}
    guest.send_frame(wire.DATA, b'{"ok": ')
    guest.send_frame(wire.DATA, b"true}")
    guest.send_frame(wire.EOF)
    assert await asyncio.wait_for(task, 3) == b'{"ok": true}'


async def test_a_refusal_is_a_guest_error(channel: GuestChannel, sock_path: Path) -> None:
    guest, _, task = await ask(channel, sock_path)
    guest.send_control({"error": "this sandbox's image has no browser", "code": "no_browser"})
    with pytest.raises(GuestError, match="no browser") as caught:
        await asyncio.wait_for(task, 3)
    assert caught.value.code == "no_browser"


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        ([(wire.DATA, b"x" * 600), (wire.DATA, b"y" * 600)], "over 1000 bytes"),
        ([(wire.STDOUT, b"hello")], "unexpected STDOUT frame"),
        ([(wire.CONTROL, b'{"ok": true}')], "unexpected CONTROL frame"),
    ],
)
async def test_too_much_or_the_wrong_frames_are_refused(
    channel: GuestChannel, sock_path: Path, frames: list[tuple[int, bytes]], why: str
) -> None:
    guest, _, task = await ask(channel, sock_path)
    for ftype, payload in frames:
        guest.send_frame(ftype, payload)
    with pytest.raises(GuestProtocolError, match=why):
        await asyncio.wait_for(task, 3)
    await guest.wait_hung_up(3)


async def test_a_guest_that_trickles_is_cut_off_at_the_timeout(
    channel: GuestChannel, sock_path: Path
) -> None:
    guest, _, task = await ask(channel, sock_path, timeout=1.5, max_answer=10**6)
    started = time.monotonic()
    while not task.done() and time.monotonic() - started < 5:
        guest.send_frame(wire.DATA, b" ")  # always something, never the end
        await asyncio.sleep(0.1)
    with pytest.raises(GuestTimeout):
        await task
    assert time.monotonic() - started < 2.5
