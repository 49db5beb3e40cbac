"""Warm pools keyed by what a sandbox is booted with (`aamp.sandbox.warm_pool`), on real gVisor
sandboxes: a learned pool serves the next request of the same boot key whatever its policy,
and what is handed out has exactly the new request's rules and services and nothing of an
earlier user."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from installation_settings import make_settings
from wheel_files import linked_image_dir, make_wheel

from aamp.egress.ca import InstallationCA
from aamp.egress.proxy import EgressContext
from aamp.egress.resolver import SystemResolver
from aamp.egress.rules import EgressRules
from aamp.egress.services import Bearer, Service, ServiceSet
from aamp.policy import Resources, parse_policy
from aamp.sandbox import cgroups
from aamp.sandbox.driver import DriverError
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, LogEgressSink, SandboxManager
from aamp.sandbox.warm_pool import PoolTargets, WarmTotalExceeded, boot_key
from aamp.sandbox.wheelhouse import Wheelhouse

pytestmark = pytest.mark.usefixtures("base_image")

RESOURCES = Resources(pids=128)  # not the default: no configured pool serves these


class UnreadSecretsForTests:
    """A `SecretReader` that must never be read: no request here calls a service."""

    async def reveal(self, name: str, *, purpose: str) -> str:
        raise AssertionError(f"secret {name} read")

    async def record_use(self, service: str, *, purpose: str, details: dict) -> None:
        raise AssertionError(f"use of {service} recorded")


class EventsForTests:
    def __init__(self) -> None:
        self.events: list[dict[str, object]] = []

    async def record(self, **fields: object) -> None:
        self.events.append(fields)


def policy(host: str, service: Service) -> CreateRequest:
    """What a policy makes: the same image and resources, its own rules and services."""
    return CreateRequest(
        image="base",
        resources=RESOURCES,
        egress=EgressRules.from_lists("block", allow=[host]),
        services=ServiceSet([service]),
    )


def packages_policy(host: str, *packages: str) -> CreateRequest:
    """A policy with its own rules and `packages`, booted alike otherwise."""
    return CreateRequest(
        image="base",
        resources=RESOURCES,
        packages=packages,
        egress=EgressRules.from_lists("block", allow=[host]),
    )


def gvisor_manager(settings, **options) -> SandboxManager:
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    return SandboxManager(settings, ImageStore(settings), drivers, "gvisor", **options)


async def wait_for_pool(m: SandboxManager, label: str, size: int) -> None:
    deadline = time.monotonic() + 60
    while m.pool_status().get(label, 0) < size and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert m.pool_status().get(label, 0) == size


def services_manager(settings, tmp_path, events: EventsForTests, **options) -> SandboxManager:
    """A manager that can give sandboxes services (a CA; secrets that are never read)."""
    return gvisor_manager(
        settings,
        recorder=events,
        egress=EgressContext(
            SystemResolver(),
            LogEgressSink(),
            secrets=UnreadSecretsForTests(),
            ca=InstallationCA.load_or_create(tmp_path / "ca"),
        ),
        **options,
    )


async def test_two_policies_two_users_one_pool(settings, tmp_path):
    events = EventsForTests()
    m = services_manager(settings, tmp_path, events, learn_pools=1)
    crm = Service("crm-api", "https://crm.test", Bearer("crm_token"))
    erp = Service("erp", "https://erp.test", Bearer("erp_token"))
    first, second = policy("a.test", crm), policy("b.test", erp)
    label = boot_key("gvisor", "base", RESOURCES).label("gvisor")
    await m.start()
    try:
        a = await m.create(first, actor="user:alice")
        assert not a.warm  # nothing was warm for this boot key yet: it is learned now
        async with m.use(a.id) as channel:
            result, _, _ = await channel.run(["sh", "-c", "echo alice > /tmp/left-by-alice"])
            assert result.exit_code == 0
        await wait_for_pool(m, label, 1)
        pooled = m._pools[boot_key("gvisor", "base", RESOURCES)][0]
        assert pooled.id not in {s.id for s in m.list()}  # unreachable until handed out
        await m.destroy(a.id, actor="user:alice")

        b = await m.create(second, actor="user:bob")
        assert b.warm and b.id == pooled.id and b.id != a.id
        assert b.resources == RESOURCES
        # Exactly the second policy's rules and services, none of the first's.
        assert b.egress.rules == second.egress
        assert b.egress.services.names == ("erp",)
        assert b.egress.approvals.approver is None
        assert b.egress.stats().bytes_up == 0 and b.egress.stats().attempts == 0
        async with m.use(b.id) as channel:
            result, out, _ = await channel.run(
                ["sh", "-c", "ls /tmp; test ! -e /tmp/left-by-alice"]
            )
        assert result.exit_code == 0, out
        created = [e for e in events.events if e["action"] == "sandbox.create"]
        assert [(e["actor"], e["details"]["warm"]) for e in created] == [
            ("user:alice", False),
            ("user:bob", True),
        ]
        # The pool is refilled behind the hand-out, with a sandbox nobody has used.
        await wait_for_pool(m, label, 1)
        assert m._pools[boot_key("gvisor", "base", RESOURCES)][0].id not in {a.id, b.id}
    finally:
        await m.shutdown()


FETCH = (
    "import urllib.request, sys\n"
    "try:\n"
    "    urllib.request.urlopen(sys.argv[1], timeout=20)\n"
    "except Exception as exc:\n"
    "    print(getattr(exc, 'code', exc))\n"
)


async def refused_hosts(m: SandboxManager, sandbox_id: str, url: str) -> list[tuple[str, str]]:
    """From inside the guest, ask the egress proxy for `url`; the (host, rule) it refused."""
    view = await m.egress_view(sandbox_id)
    mark = await view.mark()
    async with m.use(sandbox_id) as channel:
        await channel.run(["python3", "-c", FETCH, url])
    deadline = time.monotonic() + 10
    while not await view.since(mark) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return [(e.host, e.rule) for e in await view.since(mark) if e.decision == "refused"]


async def test_two_stored_policies_two_users_one_configured_pool(settings, tmp_path):
    """Two stored policies that boot alike, each with `warm: 1`, share one pool of two; two
    users each get one of its sandboxes at once, never used before, each with exactly its
    own policy's rules and services: the guest of one is refused the other's host."""
    events = EventsForTests()
    m = services_manager(settings, tmp_path, events)
    shape = "image: base\nresources: {pids: 128}\nwarm: 1\n"
    alpha = parse_policy(f"name: alpha\negress: {{allow: [a.test]}}\n{shape}")
    beta = parse_policy(f"name: beta\negress: {{allow: [b.test]}}\n{shape}")
    crm = Service("crm-api", "https://crm.test", Bearer("crm_token"))
    erp = Service("erp", "https://erp.test", Bearer("erp_token"))
    first, second = policy("a.test", crm), policy("b.test", erp)  # what each policy makes
    assert first.egress == EgressRules.from_policy(alpha.egress)
    assert second.egress == EgressRules.from_policy(beta.egress)
    key = boot_key("gvisor", "base", RESOURCES)
    await m.start()
    try:
        await m.keep_warm("alpha", alpha)
        await m.keep_warm("beta", beta)
        assert m.pool_targets.target(key) == 2
        await wait_for_pool(m, key.label("gvisor"), 2)
        pooled = {s.id for s in m._pools[key]}
        assert not pooled & {s.id for s in m.list()}  # unreachable until handed out

        a = await m.create(first, actor="user:alice")
        async with m.use(a.id) as channel:
            await channel.run(["sh", "-c", "echo alice > /tmp/left-by-alice"])
        b = await m.create(second, actor="user:bob")
        assert a.warm and b.warm and {a.id, b.id} == pooled
        assert b.egress.rules == second.egress and b.egress.services.names == ("erp",)
        assert a.egress.rules == first.egress and a.egress.services.names == ("crm-api",)
        async with m.use(b.id) as channel:
            result, _, _ = await channel.run(["test", "!", "-e", "/tmp/left-by-alice"])
        assert result.exit_code == 0
        # From the untrusted side: each guest reaches its own policy's host only.
        assert await refused_hosts(m, b.id, "http://a.test/") == [("a.test", "default: block")]
        assert await refused_hosts(m, a.id, "http://b.test/") == [("b.test", "default: block")]
        created = [e for e in events.events if e["action"] == "sandbox.create"]
        assert [(e["actor"], e["details"]["warm"]) for e in created] == [
            ("user:alice", True),
            ("user:bob", True),
        ]
        # Refilled behind the hand-outs with sandboxes nobody used; a policy deleted gives
        # its share back, the last one drains the pool.
        await wait_for_pool(m, key.label("gvisor"), 2)
        assert not {s.id for s in m._pools[key]} & {a.id, b.id}
        await m.keep_warm("alpha", None)
        assert m.pool_targets.target(key) == 1 and len(m._pools[key]) == 1
        await m.keep_warm("beta", None)
        assert m.pool_status().get(key.label("gvisor")) is None
    finally:
        await m.shutdown()


def test_policies_warm_counts_add_up_within_the_bound():
    key = boot_key("gvisor", "base", RESOURCES)
    other = boot_key("gvisor", "browser", Resources())
    targets = PoolTargets({boot_key("gvisor", "base", Resources()): 2}, bound=6)
    assert targets.keep("alpha", key, 2) == [key]
    assert targets.keep("beta", key, 1) == [key] and targets.target(key) == 3
    assert set(targets.keep("beta", other, 1)) == {key, other}
    assert (targets.target(key), targets.target(other)) == (2, 1)
    targets.check({"alpha": 2, "beta": 2})  # 2 + 4: at the bound
    with pytest.raises(WarmTotalExceeded) as refused:
        targets.check({"alpha": 3, "beta": 2})
    assert str(refused.value) == (
        "7 sandboxes would be kept warm (AAMP_WARM_POOL 2, policy alpha 3, policy beta 2), "
        "over AAMP_WARM_POOL_MAX (6); lower a policy's warm or raise AAMP_WARM_POOL_MAX"
    )
    with pytest.raises(WarmTotalExceeded, match="AAMP_WARM_POOL 2"):
        PoolTargets({key: 2}, bound=1)


async def test_a_packages_layer_has_its_own_pool(tmp_path, base_image):
    """A policy's packages are part of what a sandbox is booted with: the pool learned for
    them hands out a sandbox that has them (in either order) to the next policy listing them,
    with that policy's rules and nothing of the first user's; a policy without them never
    gets one of those sandboxes."""
    settings = make_settings(
        tmp_path / "home", AAMP_IMAGE_DIR=str(linked_image_dir(tmp_path, base_image))
    )
    wheels = [
        make_wheel(tmp_path, "aamppoolone", "1.0", "X = 'one'\n"),
        make_wheel(tmp_path, "aamppooltwo", "2.0", "X = 'two'\n"),
    ]
    Wheelhouse(settings).add_files(wheels, by="test")
    events = EventsForTests()
    m = gvisor_manager(settings, recorder=events, learn_pools=1)
    key = boot_key("gvisor", "base", RESOURCES, ("aamppooltwo==2.0", "aamppoolone==1.0"))
    probe = [
        "python3",
        "-c",
        "import aamppoolone, aamppooltwo; print(aamppoolone.X, aamppooltwo.X)",
    ]
    await m.start()
    try:
        first = packages_policy("a.test", "aamppoolone==1.0", "aamppooltwo==2.0")
        a = await m.create(first, actor="user:alice")
        assert not a.warm
        async with m.use(a.id) as channel:
            await channel.run(["sh", "-c", "echo alice > /tmp/left-by-alice"])
        await wait_for_pool(m, key.label("gvisor"), 1)
        await m.destroy(a.id)

        second = packages_policy("b.test", "aamppooltwo==2.0", "aamppoolone==1.0")
        b = await m.create(second, actor="user:bob")
        assert b.warm and b.id != a.id and b.image_hash == a.image_hash
        assert b.packages == second.packages and b.egress.rules == second.egress
        async with m.use(b.id) as channel:
            result, out, _ = await channel.run(probe)
            assert (result.exit_code, out) == (0, b"one two\n")
            result, _, _ = await channel.run(["test", "!", "-e", "/tmp/left-by-alice"])
            assert result.exit_code == 0
        await m.destroy(b.id)

        plain = await m.create(CreateRequest(image="base", resources=RESOURCES))
        assert not plain.warm and plain.image_hash == base_image.content_hash
        async with m.use(plain.id) as channel:
            result, _, _ = await channel.run(probe)
            assert result.exit_code != 0  # no packages layer in it
        await m.destroy(plain.id)
        created = [e["details"] for e in events.events if e["action"] == "sandbox.create"]
        assert [(d["warm"], d["packages"]) for d in created] == [
            (False, list(first.packages)),
            (True, list(second.packages)),
            (False, []),
        ]
    finally:
        await m.shutdown()


def test_the_packages_order_does_not_change_the_pool():
    one = boot_key("gvisor", "base", RESOURCES, ("b==1", "a==1"))
    assert one == boot_key("gvisor", "base", RESOURCES, ("a==1", "b==1"))
    assert one != boot_key("gvisor", "base", RESOURCES)
    assert "packages=a==1,b==1" in one.label("gvisor")
    assert boot_key("gvisor", "base", Resources()).label("gvisor") == "base"


async def test_a_default_request_does_not_take_a_learned_pools_sandbox(settings, tmp_path):
    m = gvisor_manager(settings, learn_pools=1)
    await m.start()
    try:
        first = await m.create(CreateRequest(image="base", resources=RESOURCES))
        await wait_for_pool(m, boot_key("gvisor", "base", RESOURCES).label("gvisor"), 1)
        other = await m.create(CreateRequest(image="base"))
        assert not other.warm and other.resources == Resources()
        await wait_for_pool(m, "base", 1)  # learned in its turn, pushing the first out
        assert m.pool_status().get(boot_key("gvisor", "base", RESOURCES).label("gvisor")) is None
        await m.destroy(first.id)
    finally:
        await m.shutdown()


def test_learned_targets_are_bounded_and_configured_ones_stay():
    base = boot_key("gvisor", "base", Resources())
    keys = [boot_key("gvisor", "base", Resources(pids=100 + n)) for n in range(3)]
    targets = PoolTargets({base: 2}, learn=2)
    assert targets.requested(base) == [] and targets.target(base) == 2
    assert targets.requested(keys[0]) == [] and targets.requested(keys[1]) == []
    assert targets.requested(keys[0]) == []  # used again: the most recent now
    assert targets.requested(keys[2]) == [keys[1]]  # the least recent one goes
    assert [targets.target(k) for k in keys] == [1, 0, 1]
    assert targets.wanted() == [base, keys[0], keys[2]]
    assert PoolTargets({}, learn=0).requested(keys[0]) == []
    with pytest.raises(ValueError, match="0 or more"):
        PoolTargets({}, learn=-1)


async def test_a_pools_sandbox_boots_at_a_low_cpu_weight_until_handed_out(settings):
    """A pool's boot yields to every sandbox in use: its whole cgroup (gofer, gVisor kernel,
    guest agent) has a low `cpu.shares` while it boots and waits, the normal weight from
    its hand-out on; a sandbox booted for a request has the normal weight throughout."""
    m = gvisor_manager(settings, warm_pool={"base": 1})
    parent = m.drivers["gvisor"].cgroup_parent
    key = boot_key("gvisor", "base", Resources())
    await m.start()
    try:
        await wait_for_pool(m, "base", 1)
        pooled = m._pools[key][0]
        assert cgroups.cpu_shares(parent, pooled.id) == cgroups.BACKGROUND_CPU_SHARES
        taken = await m.create(CreateRequest(image="base"))
        assert taken.warm and taken.id == pooled.id
        assert cgroups.cpu_shares(parent, taken.id) == cgroups.NORMAL_CPU_SHARES
        cold = await m.create(CreateRequest(image="base", resources=RESOURCES))  # no pool
        assert not cold.warm and cgroups.cpu_shares(parent, cold.id) == cgroups.NORMAL_CPU_SHARES
        await wait_for_pool(m, "base", 1)  # the refill behind the hand-out yields again
        refilled = m._pools[key][0]
        assert refilled.id != taken.id
        assert cgroups.cpu_shares(parent, refilled.id) == cgroups.BACKGROUND_CPU_SHARES
        async with m.use(taken.id) as channel:
            result, _, _ = await channel.run(["true"])
        assert result.exit_code == 0
    finally:
        await m.shutdown()


class WeightStuckDriver(GVisorDriver):
    """gVisor, except that a sandbox's CPU weight can never be raised (as when its cgroup
    cannot be written)."""

    def foreground(self, handle):
        raise DriverError(f"cannot raise sandbox {handle.sandbox_id}'s CPU weight: stuck")


async def test_a_pools_sandbox_whose_weight_cannot_be_raised_is_not_handed_out(settings):
    drivers = {"gvisor": WeightStuckDriver(settings.runtime_dir)}
    m = SandboxManager(settings, ImageStore(settings), drivers, "gvisor", warm_pool={"base": 1})
    parent = drivers["gvisor"].cgroup_parent
    await m.start()
    try:
        await wait_for_pool(m, "base", 1)
        pooled = m._pools[boot_key("gvisor", "base", Resources())][0]
        sb = await m.create(CreateRequest(image="base"))
        # Booted for the request instead, at the normal weight; the stuck one is gone.
        assert not sb.warm and sb.id != pooled.id
        assert cgroups.cpu_shares(parent, sb.id) == cgroups.NORMAL_CPU_SHARES
        assert not (Path("/sys/fs/cgroup/cpu") / parent / pooled.id).exists()
        assert pooled.id not in {s.id for s in m.list()}
    finally:
        await m.shutdown()
