"""Real gVisor sandboxes through the manager: exec, files, limits, isolation, clean teardown."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from pathlib import Path

import pytest

from aamp.egress.rules import EgressRules
from aamp.policy import MiB, Resources
from aamp.sandbox import ChannelError, procs
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import (
    CreateRequest,
    InvalidRequest,
    SandboxError,
    SandboxManager,
    UnknownSandbox,
)
from aamp.sandbox.warm_pool import boot_key

pytestmark = pytest.mark.usefixtures("base_image")


class EventsForTests:
    """Keeps the manager's lifecycle events in memory (the audit log does this for real)."""

    def __init__(self) -> None:
        self.events: list[dict[str, object]] = []

    async def record(self, **fields: object) -> None:
        self.events.append(fields)

    def reasons(self, sandbox_id: str) -> list[object]:
        return [
            e["reason"]
            for e in self.events
            if e["resource"] == f"sandbox:{sandbox_id}" and e["action"] == "sandbox.destroy"
        ]


@pytest.fixture
def events():
    return EventsForTests()


@pytest.fixture
async def manager(settings, events):
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    m = SandboxManager(settings, ImageStore(settings), drivers, "gvisor", tick=0.1, recorder=events)
    await m.start()
    yield m
    await m.shutdown()


async def wait_gone(manager, sandbox_id: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and sandbox_id in {s.id for s in manager.list()}:
        await asyncio.sleep(0.05)


def leftovers(settings, sandbox_id: str) -> list[str]:
    """Everything of one sandbox that could remain on the host."""
    found = []
    if (settings.runtime_dir / "sb" / sandbox_id).exists():
        found.append("state dir")
    if procs.pids_matching(f"--root={settings.runtime_dir}/runsc", sandbox_id):
        found.append("runsc process")
    for controller in Path("/sys/fs/cgroup").iterdir():
        if (controller / settings.runtime_dir.name / sandbox_id).exists():
            found.append(f"cgroup {controller.name}")
    runsc_state = settings.runtime_dir / "runsc" / f"{sandbox_id}_sandbox:{sandbox_id}.state"
    if runsc_state.exists():
        found.append("runsc state")
    return found


async def test_python_prints_42(manager):
    sb = await manager.create(CreateRequest(image="base"))
    async with manager.use(sb.id) as channel:
        result, out, err = await channel.run(["python3", "-c", "print(6*7)"])
    assert (result.exit_code, out, err) == (0, b"42\n", b"")


@pytest.mark.parametrize("size", [1, 1 * MiB, 100 * MiB], ids=["1B", "1MiB", "100MiB"])
async def test_file_round_trip_is_byte_identical(manager, size):
    sb = await manager.create(CreateRequest(image="base"))
    data = os.urandom(size)
    async with manager.use(sb.id) as channel:
        await channel.put("in/blob.bin", data, len(data))
        _, out, _ = await channel.run(["sha256sum", "/workspace/in/blob.bin"])
        assert out.split()[0].decode() == hashlib.sha256(data).hexdigest()
        stream = await channel.get("in/blob.bin")
        back = b"".join([chunk async for chunk in stream])
    assert stream.size == size
    assert back == data


async def test_no_other_sandbox_is_visible(manager):
    a = await manager.create(CreateRequest(image="base"))
    b = await manager.create(CreateRequest(image="base"))
    async with manager.use(a.id) as ca, manager.use(b.id) as cb:
        await ca.put("marker-a.txt", b"only in a", 9)
        session = await ca.exec(["sleep", "1234"])
        async with session:
            await asyncio.sleep(0.5)
            _, files, _ = await cb.run(["sh", "-c", "find / -name 'marker-a*' 2>/dev/null; true"])
            _, ps, _ = await cb.run(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
            await session.kill()
    assert files == b""
    assert b"sleep 1234" not in ps


async def test_memory_hog_kills_only_its_own_sandbox(manager, events, settings):
    small = Resources(memory_bytes=256 * MiB)
    hog = await manager.create(CreateRequest(image="base", resources=small))
    bystander = await manager.create(CreateRequest(image="base"))
    async with manager.use(hog.id) as channel:
        try:
            result, _, _ = await channel.run(
                ["python3", "-c", "x = [bytearray(1 << 20) for _ in range(2048)]"], timeout=60
            )
            hog_succeeded = result.exit_code == 0
        except ChannelError:
            hog_succeeded = False  # the whole sandbox died with it: that is containment too
    assert not hog_succeeded
    await wait_gone(manager, hog.id)
    assert events.reasons(hog.id) == ["stopped: it reached its memory limit"]
    assert leftovers(settings, hog.id) == []
    async with manager.use(bystander.id) as channel:
        _, out, _ = await channel.run(["python3", "-c", "print(6*7)"])
    assert out == b"42\n"


async def test_fork_bomb_is_contained(manager, events, settings):
    bomb = await manager.create(CreateRequest(image="base", resources=Resources(pids=64)))
    bystander = await manager.create(CreateRequest(image="base"))
    async with manager.use(bomb.id) as channel:
        with contextlib.suppress(ChannelError):  # the sandbox may die of it: contained
            await channel.run(["sh", "-c", "b() { b | b & }; b"], timeout=10)
    await wait_gone(manager, bomb.id)
    assert events.reasons(bomb.id) == ["stopped: it reached its process limit"]
    assert leftovers(settings, bomb.id) == []
    async with manager.use(bystander.id) as channel:
        _, out, _ = await channel.run(["echo", "alive"])
    assert out == b"alive\n"
    # The host still starts processes.
    assert procs.run_quiet(["echo", "host ok"]).strip() == "host ok"


async def test_the_handle_names_the_sandbox_process(manager):
    """What `exited` watches is this sandbox's gVisor kernel (runsc writes its pid to a file
    in the sandbox's state directory; nothing scans /proc on the way up)."""
    sb = await manager.create(CreateRequest(image="base"))
    pid = sb.handle.pid
    assert pid is not None and procs.pid_alive(pid)
    args = procs.cmdline(pid)
    assert args[:1] == ["runsc-sandbox"] and any(str(sb.handle.state_dir) in a for a in args)
    assert manager.drivers["gvisor"].exited(sb.handle) is None
    await manager.destroy(sb.id)
    assert not procs.pid_alive(pid)


async def test_destroy_leaves_nothing(manager, settings):
    sb = await manager.create(CreateRequest(image="base"))
    assert leftovers(settings, sb.id)  # there is something to remove
    await manager.destroy(sb.id)
    assert leftovers(settings, sb.id) == []
    with pytest.raises(UnknownSandbox):
        manager.get(sb.id)


async def test_ttl_expiry_destroys_the_sandbox(manager, settings):
    sb = await manager.create(CreateRequest(image="base", ttl=1))
    await wait_gone(manager, sb.id)
    assert sb.id not in {s.id for s in manager.list()}
    assert leftovers(settings, sb.id) == []


async def test_idle_expiry_but_not_while_busy(manager):
    sb = await manager.create(CreateRequest(image="base", idle=1, ttl=60))
    async with manager.use(sb.id) as channel:
        result, _, _ = await channel.run(["sleep", "2"])  # busy longer than idle
        assert result.exit_code == 0
    assert sb.id in {s.id for s in manager.list()}
    await asyncio.sleep(2)
    assert sb.id not in {s.id for s in manager.list()}


async def test_new_egress_rules_are_recorded(manager, events):
    """A local sandbox's new egress rules are on record, as a remote one's are
    (`sandbox.update_egress`, with the rules)."""
    sandbox = await manager.create(CreateRequest())
    rules = EgressRules.from_lists("block", allow=["a.test"])
    await manager.update_egress(sandbox.id, rules, actor="user:t")
    updates = [e for e in events.events if e["action"] == "sandbox.update_egress"]
    assert [(e["actor"], e["resource"], e["decision"]) for e in updates] == [
        ("user:t", f"sandbox:{sandbox.id}", "allow")
    ]
    assert updates[0]["details"] == {"egress": rules.to_dict(), "services": None}
    with pytest.raises(UnknownSandbox):
        await manager.update_egress("sb-000000000000", rules)


async def test_bad_requests_change_nothing(manager):
    with pytest.raises(InvalidRequest, match="no-such-image"):
        await manager.create(CreateRequest(image="no-such-image"))
    with pytest.raises(InvalidRequest, match="ttl"):
        CreateRequest(ttl=0)
    with pytest.raises(InvalidRequest, match="ttl"):
        CreateRequest(ttl=10**9)
    with pytest.raises(InvalidRequest, match="driver"):
        await manager.create(CreateRequest(driver="qemu"))
    with pytest.raises(UnknownSandbox):
        manager.get("sb-000000000000")
    with pytest.raises(UnknownSandbox):
        manager.get("../../etc")
    assert manager.list() == []


async def test_warm_pool_hands_out_running_sandboxes(settings):
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    m = SandboxManager(settings, ImageStore(settings), drivers, "gvisor", warm_pool={"base": 2})
    m_cgroup = drivers["gvisor"].cgroup_parent
    await m.start()
    try:
        deadline = time.monotonic() + 30
        while m.pool_status().get("base", 0) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert m.pool_status()["base"] == 2
        pooled = {s.id for s in m._pools[boot_key("gvisor", "base", Resources())]}
        sb = await m.create(CreateRequest(image="base"))
        assert sb.id in pooled  # handed out, not booted
        async with m.use(sb.id) as channel:
            _, out, _ = await channel.run(["echo", "warm"])
        assert out == b"warm\n"
        # A request with other resources never takes a pooled sandbox.
        other = await m.create(CreateRequest(image="base", resources=Resources(pids=100)))
        assert other.resources.pids == 100
    finally:
        await m.shutdown()
    assert not procs.pids_matching(f"--root={settings.runtime_dir}/runsc")
    # Nothing of the installation stays on the host after a clean shutdown.
    assert not settings.runtime_dir.exists()
    assert [c.name for c in Path("/sys/fs/cgroup").iterdir() if (c / m_cgroup).exists()] == []


async def test_a_second_manager_for_the_same_installation_is_refused(manager, settings):
    other = SandboxManager(
        settings, ImageStore(settings), {"gvisor": GVisorDriver(settings.runtime_dir)}, "gvisor"
    )
    with pytest.raises(SandboxError, match="another aamp process already runs sandboxes"):
        await other.start()
    sb = await manager.create(CreateRequest(image="base"))  # the first one is untouched
    async with manager.use(sb.id) as channel:
        assert (await channel.run(["true"]))[0].exit_code == 0


async def test_guest_writes_never_reach_the_image(manager, base_image):
    sb = await manager.create(CreateRequest(image="base"))
    before = (base_image.root / "etc" / "hostname").read_bytes()
    async with manager.use(sb.id) as channel:
        result, out, _ = await channel.run(
            [
                "sh",
                "-c",
                "echo pwned > /etc/hostname && touch /usr/bin/planted && cat /etc/hostname",
            ]
        )
    assert (result.exit_code, out) == (0, b"pwned\n")  # the guest sees its own writable layer
    assert (base_image.root / "etc" / "hostname").read_bytes() == before
    assert not (base_image.root / "usr" / "bin" / "planted").exists()


async def test_a_sandbox_cannot_reach_another_sandboxs_channels(manager):
    a = await manager.create(CreateRequest(image="base"))
    b = await manager.create(CreateRequest(image="base"))
    b_sockets = [str(b.handle.state_dir / "chan" / n) for n in ("agent.sock", "egress.sock")]
    probe = (
        "import os, socket, sys\n"
        "print(sorted(os.listdir('/run/aamp')))\n"
        "for path in sys.argv[1:]:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try:\n"
        "        s.connect(path); print('connected', path)\n"
        "    except OSError as e:\n"
        "        print('refused', type(e).__name__)\n"
    )
    async with manager.use(a.id) as channel:
        result, out, err = await channel.run(["python3", "-c", probe, *b_sockets])
    assert result.exit_code == 0, err
    lines = out.decode().splitlines()
    assert lines[0] == "['agent.sock', 'egress.sock']"  # only its own two channels
    assert lines[1:] == ["refused FileNotFoundError"] * 2
