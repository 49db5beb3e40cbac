"""The host end of the channel against a hostile guest (`HostileGuestForTests`): every kind of
misbehaviour ends in a clean channel exception within a bounded time, only the offending
connection is dropped, and the next well-behaved agent is served normally."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import struct
import time
from pathlib import Path

import pytest
from guest_helpers import AgentStarter, HostileGuestForTests, MiB, make_channel

from aamp.guest import wire
from aamp.sandbox import (
    GuestChannel,
    GuestError,
    GuestProtocolError,
    GuestTimeout,
    GuestUnavailable,
)

pytestmark = pytest.mark.timeout(30)

BOUND = 3.0  # seconds: every misbehaviour must be settled well within this


@pytest.fixture
async def fast(sock_path: Path) -> GuestChannel:
    ch = make_channel(sock_path, hello_timeout=0.5, io_timeout=0.5, exec_grace=0.3)
    await ch.start()
    yield ch  # type: ignore[misc]
    await ch.close()


async def still_works(channel: GuestChannel, start_agent: AgentStarter) -> None:
    """The next, well-behaved agent gets served."""
    start_agent()
    result, out, _ = await channel.run(["echo", "fine"], timeout=10)
    assert (result.exit_code, out) == (0, b"fine\n")


# --- before the hello ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "unknown frame type"),
        (b"\x7fELF" + b"\x01" * 60, "over the limit"),
        (struct.pack(">IB", 0xFFFFFFFF, wire.CONTROL), "over the limit"),  # claims 4 GiB
        (struct.pack(">IB", 4, 99) + b"abcd", "unknown frame type"),
        (struct.pack(">IB", 9, wire.CONTROL) + b"{not json", "not valid JSON"),
        (struct.pack(">IB", 2, wire.CONTROL) + b"[]", "not an object"),
        (struct.pack(">IB", 20000, wire.CONTROL) + b"[" * 20000, "not valid JSON"),
        (wire.HEADER.pack(5, wire.STDOUT) + b"hello", "expected a control message"),
        (
            wire.HEADER.pack(1, wire.EOF) + b"x",
            "EOF frame carries",
        ),
    ],
    ids=["http", "elf", "4gib", "type", "json", "array", "deep", "stdout", "eof"],
)
async def test_garbage_instead_of_a_hello_is_refused(
    fast: GuestChannel, start_agent: AgentStarter, sock_path: Path, raw: bytes, reason: str
) -> None:
    guest = await HostileGuestForTests.connect(sock_path, hello=False)
    guest.send_raw(raw)
    started = time.monotonic()
    await guest.wait_hung_up(BOUND)
    assert time.monotonic() - started < BOUND
    assert isinstance(fast.last_rejection, GuestProtocolError)
    assert reason in str(fast.last_rejection)
    assert not fast.connected
    await still_works(fast, start_agent)


@pytest.mark.parametrize(
    "hello",
    [
        {"hello": "aamp-guest", "protocol": "1", "version": "x", "pid": 1},
        {"hello": "aamp-guest", "protocol": 1, "version": 5, "pid": 1},
        {"hello": "aamp-guest", "protocol": 1, "version": "x", "pid": True},
        {"hello": "aamp-guest", "protocol": 1, "version": "x", "pid": -4},
        {"hello": "aamp-guest", "protocol": 99, "version": "x", "pid": 1},
        {"hello": "someone-else", "protocol": 1, "version": "x", "pid": 1},
        {"hello": "aamp-guest", "protocol": 1, "version": "x" * 100, "pid": 1},
    ],
)
async def test_a_hello_with_wrong_types_is_refused(
    fast: GuestChannel, sock_path: Path, hello: dict[str, object]
) -> None:
    guest = await HostileGuestForTests.connect(sock_path, hello=False)
    guest.send_control(hello)
    await guest.wait_hung_up(BOUND)
    assert isinstance(fast.last_rejection, GuestProtocolError)
    with pytest.raises(GuestUnavailable, match="did not connect"):
        await fast.wait_ready(timeout=0.2)


async def test_a_guest_that_never_says_hello(
    fast: GuestChannel, start_agent: AgentStarter, sock_path: Path
) -> None:
    guest = await HostileGuestForTests.connect(sock_path, hello=False)
    started = time.monotonic()
    with pytest.raises(GuestUnavailable, match=r"did not connect within 0\.8s"):
        await fast.wait_ready(timeout=0.8)
    await guest.wait_hung_up(BOUND)  # dropped after hello_timeout
    assert time.monotonic() - started < BOUND
    assert isinstance(fast.last_rejection, GuestTimeout)
    await still_works(fast, start_agent)


async def test_a_truncated_hello_then_silence(fast: GuestChannel, sock_path: Path) -> None:
    guest = await HostileGuestForTests.connect(sock_path, hello=False)
    guest.send_raw(wire.HEADER.pack(100, wire.CONTROL) + b'{"hel')
    await guest.wait_hung_up(BOUND)
    assert isinstance(fast.last_rejection, GuestTimeout)


async def test_too_many_idle_connections_are_refused(fast: GuestChannel, sock_path: Path) -> None:
    guests = [await HostileGuestForTests.connect(sock_path) for _ in range(6)]
    await asyncio.sleep(0.2)
    assert fast.rejected_connections == 2
    assert "too many idle" in str(fast.last_rejection)
    for g in guests:
        g.close()


# --- during a request ----------------------------------------------------------------------


async def hostile_request(
    channel: GuestChannel, sock_path: Path, op: str
) -> tuple[HostileGuestForTests, dict[str, object], asyncio.Task[object]]:
    """Start `op` on the channel with a hostile guest on the other end; returns the guest, the
    request it received and the host's pending operation."""
    guest = await HostileGuestForTests.connect(sock_path)
    await channel.wait_ready(timeout=2)
    coro = {
        "health": lambda: channel.health(),
        "exec": lambda: channel.run(["true"], timeout=30),
        "get": lambda: channel.get("f.bin"),
        "put": lambda: channel.put("f.bin", b"x" * 10, 10),
    }[op]()
    task: asyncio.Task[object] = asyncio.ensure_future(coro)
    request = await guest.read_request()
    assert request["op"] == op
    return guest, request, task


async def settle(task: asyncio.Task[object]) -> float:
    started = time.monotonic()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.shield(task), BOUND)
    assert task.done(), "the host was still waiting on the guest"
    return time.monotonic() - started


@pytest.mark.parametrize("op", ["health", "exec", "get", "put"])
async def test_a_frame_claiming_4_gib(fast: GuestChannel, sock_path: Path, op: str) -> None:
    guest, _, task = await hostile_request(fast, sock_path, op)
    guest.send_raw(struct.pack(">IB", 0xFFFFFFFF, wire.DATA) + b"\0" * 1000)
    await settle(task)
    with pytest.raises(GuestProtocolError, match="over the limit"):
        task.result()
    await guest.wait_hung_up(BOUND)


@pytest.mark.parametrize("op", ["health", "exec", "get", "put"])
async def test_a_truncated_frame_then_silence(fast: GuestChannel, sock_path: Path, op: str) -> None:
    guest, _, task = await hostile_request(fast, sock_path, op)
    guest.send_raw(wire.HEADER.pack(100, wire.CONTROL) + b'{"ok": tr')
    elapsed = await settle(task)
    with pytest.raises(GuestTimeout):
        task.result()
    assert elapsed < 0.5 + 1.0
    await guest.wait_hung_up(BOUND)


@pytest.mark.parametrize("op", ["health", "exec", "get", "put"])
async def test_a_truncated_frame_then_hang_up(fast: GuestChannel, sock_path: Path, op: str) -> None:
    guest, _, task = await hostile_request(fast, sock_path, op)
    guest.send_raw(wire.HEADER.pack(100, wire.CONTROL) + b'{"ok": tr')
    await guest.writer.drain()
    guest.close()
    await settle(task)
    with pytest.raises(GuestProtocolError, match="connection closed after"):
        task.result()


@pytest.mark.parametrize("op", ["health", "exec", "get", "put"])
async def test_a_hang_up_before_answering(fast: GuestChannel, sock_path: Path, op: str) -> None:
    guest, _, task = await hostile_request(fast, sock_path, op)
    guest.close()
    await settle(task)
    with pytest.raises(GuestUnavailable, match="closed the connection"):
        task.result()


@pytest.mark.parametrize("op", ["health", "exec", "get", "put"])
async def test_invalid_json_in_an_answer(fast: GuestChannel, sock_path: Path, op: str) -> None:
    guest, _, task = await hostile_request(fast, sock_path, op)
    guest.send_frame(wire.CONTROL, b'{"ok": true, "size": 10,')
    await settle(task)
    with pytest.raises(GuestProtocolError, match="not valid JSON"):
        task.result()


@pytest.mark.parametrize(
    ("op", "answer"),
    [
        ("health", {"ok": "yes", "uptime": 1}),
        ("health", {"ok": True, "uptime": "long"}),
        ("health", {"ok": True, "uptime": 1, "load": [1, 2]}),
        ("health", {"ok": True, "uptime": 1, "load": None, "mem_available": 1.5}),
        ("exec", {"exit_code": "0", "signal": None, "timed_out": False}),
        ("exec", {"exit_code": 0, "signal": 9, "timed_out": False}),
        ("exec", {"exit_code": None, "signal": None, "timed_out": False}),
        ("exec", {"exit_code": 1000, "signal": None, "timed_out": False}),
        ("exec", {"exit_code": 0, "signal": None, "timed_out": 0}),
        ("exec", {"error": 42}),
        ("exec", {"error": "x", "code": "<script>"}),
        ("get", {"size": "10"}),
        ("get", {"size": -1}),
        ("get", {"size": 1.5}),
        ("put", {"ok": True, "size": 11}),
        ("put", {"ok": 1, "size": 10}),
    ],
)
async def test_answers_with_wrong_types_or_values(
    fast: GuestChannel, sock_path: Path, op: str, answer: dict[str, object]
) -> None:
    guest, _, task = await hostile_request(fast, sock_path, op)
    if op == "put":
        await guest.read_frame()  # the data
        await guest.read_frame()  # EOF
    guest.send_control(answer)
    await settle(task)
    with pytest.raises(GuestProtocolError):
        task.result()


async def test_a_hello_then_a_hang_mid_exec(fast: GuestChannel, sock_path: Path) -> None:
    guest, _, task = await hostile_request(fast, sock_path, "exec")
    guest.send_frame(wire.STDOUT, b"partial output")
    # ... and then nothing: no output, no keepalive, no result.
    elapsed = await settle(task)
    with pytest.raises(GuestTimeout, match="sent nothing"):
        task.result()
    assert elapsed < 0.5 + 1.0
    kind, payload = await guest.read_frame()  # the host told the guest to kill it ...
    assert (kind, wire.decode_control(payload)) == (wire.CONTROL, {"op": "kill"})
    await guest.wait_hung_up(BOUND)  # ... and hung up


async def test_the_host_enforces_the_exec_timeout(sock_path: Path) -> None:
    """A guest that keeps the exec alive with keepalives past its timeout: the host kills it
    at timeout + grace and reports timed_out."""
    channel = make_channel(sock_path, io_timeout=1.0, exec_grace=0.3)
    await channel.start()
    try:
        guest = await HostileGuestForTests.connect(sock_path)
        started = time.monotonic()
        task = asyncio.ensure_future(channel.run(["sleep", "100"], timeout=0.4))
        request = await guest.read_request()
        assert request["timeout"] == 0.4 and request["heartbeat"] > 0

        async def keep_alive_forever() -> None:
            while True:
                guest.send_control({"keepalive": True})
                await asyncio.sleep(0.1)

        pinger = asyncio.create_task(keep_alive_forever())
        try:
            kill = await guest.read_frame(timeout=BOUND)
        finally:
            pinger.cancel()
        assert kill == (wire.CONTROL, b'{"op":"kill"}')
        result, _, _ = await asyncio.wait_for(task, BOUND)  # type: ignore[misc]
        assert result.timed_out and result.exit_code is None
        assert 0.6 <= time.monotonic() - started < 2.5
        await guest.wait_hung_up(BOUND)
    finally:
        await channel.close()


async def test_keepalives_hold_a_quiet_exec_open(
    sock_path: Path, start_agent: AgentStarter
) -> None:
    channel = make_channel(sock_path, io_timeout=0.3)
    await channel.start()
    try:
        start_agent()
        result, out, _ = await channel.run(["sh", "-c", "sleep 1; echo done"])
        assert (result.exit_code, out) == (0, b"done\n")
    finally:
        await channel.close()


async def test_a_get_size_over_the_limit_is_refused_before_data(
    sock_path: Path,
) -> None:
    channel = make_channel(sock_path, max_file_bytes=MiB, io_timeout=0.5)
    await channel.start()
    try:
        guest, request, task = await hostile_request(channel, sock_path, "get")
        assert request["max_size"] == MiB
        guest.send_control({"size": 4 * 1024**3})
        guest.send_frame(wire.DATA, b"x" * 1000)
        await settle(task)
        with pytest.raises(GuestProtocolError, match="beyond the limit"):
            task.result()
        await guest.wait_hung_up(BOUND)
    finally:
        await channel.close()


async def test_more_data_than_the_announced_size(fast: GuestChannel, sock_path: Path) -> None:
    guest, _, task = await hostile_request(fast, sock_path, "get")
    guest.send_control({"size": 10})
    guest.send_frame(wire.DATA, b"x" * 8)
    guest.send_frame(wire.DATA, b"x" * 8)
    guest.send_frame(wire.EOF)
    await settle(task)
    stream = task.result()
    with pytest.raises(GuestProtocolError, match="more than the 10 bytes"):
        await stream.read_all()  # type: ignore[attr-defined]
    await guest.wait_hung_up(BOUND)


async def test_less_data_than_the_announced_size(fast: GuestChannel, sock_path: Path) -> None:
    guest, _, task = await hostile_request(fast, sock_path, "get")
    guest.send_control({"size": 10})
    guest.send_frame(wire.DATA, b"x" * 8)
    guest.send_frame(wire.EOF)
    await settle(task)
    with pytest.raises(GuestProtocolError, match="8 of the 10 bytes"):
        await task.result().read_all()  # type: ignore[attr-defined]


async def test_wrong_frame_types_mid_stream(fast: GuestChannel, sock_path: Path) -> None:
    guest, _, task = await hostile_request(fast, sock_path, "exec")
    guest.send_frame(wire.DATA, b"file data in an exec")
    await settle(task)
    with pytest.raises(GuestProtocolError, match="got a DATA frame"):
        task.result()
    guest, _, task = await hostile_request(fast, sock_path, "get")
    guest.send_control({"size": 4})
    guest.send_frame(wire.STDOUT, b"abcd")
    await settle(task)
    with pytest.raises(GuestProtocolError, match="got a STDOUT frame"):
        await task.result().read_all()  # type: ignore[attr-defined]


async def test_a_guest_refusal_is_shown_with_its_message(
    fast: GuestChannel, sock_path: Path
) -> None:
    guest, _, task = await hostile_request(fast, sock_path, "put")
    guest.send_control({"error": "disk full", "code": "write_failed"})
    await settle(task)
    with pytest.raises(GuestError, match="disk full") as info:
        task.result()
    assert info.value.code == "write_failed"


async def test_a_guest_that_stops_reading_a_put(sock_path: Path) -> None:
    channel = make_channel(sock_path, io_timeout=0.5)
    await channel.start()
    try:
        guest = await HostileGuestForTests.connect(sock_path)
        await channel.wait_ready(timeout=2)
        started = time.monotonic()
        with pytest.raises(GuestTimeout, match="stopped reading"):
            await channel.put("big.bin", b"x" * (64 * MiB), 64 * MiB)
        assert time.monotonic() - started < BOUND
        guest.close()
    finally:
        await channel.close()


async def test_one_hostile_connection_does_not_disturb_a_real_agent(
    fast: GuestChannel, start_agent: AgentStarter, sock_path: Path
) -> None:
    start_agent()
    await fast.wait_ready(timeout=10)
    await asyncio.sleep(0.2)
    silent = await HostileGuestForTests.connect(sock_path, hello=False)
    liar = await HostileGuestForTests.connect(sock_path, hello=False)
    liar.send_raw(struct.pack(">IB", 0xFFFFFFFF, wire.CONTROL))
    results = await asyncio.gather(*(fast.run(["echo", str(n)]) for n in range(3)))
    assert [out for _, out, _ in results] == [b"0\n", b"1\n", b"2\n"]
    result, _, _ = await fast.run(["sh", "-c", "kill -KILL $$"])
    assert result.signal == signal.SIGKILL
    silent.close()
    liar.close()
