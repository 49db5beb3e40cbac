"""Placement on a real store (SQLite and PostgreSQL), with several registered hosts: the best
of K candidates by image presence and free capacity, capacity reserved in the same
transaction (never promised twice, also under concurrent placements), and never a lost,
draining or silent host."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from aamp.errors import InvalidInput
from aamp.fleet import HostFacts, HostRegistry
from aamp.fleet.placement import Need, NoCapacity, Placement
from aamp.store import Store

BASE = "base@" + "ab" * 16
NEED = Need(driver="gvisor", image="base", cpus=0.5, memory_mb=512)


def _host(
    registry: HostRegistry,
    host_id: str,
    *,
    sandboxes: int,
    images: tuple[str, ...] = (),
    memory_mb: int = 8192,
    drivers: tuple[str, ...] = ("gvisor",),
) -> str:
    _, token = registry.add(host_id, by="test")
    registry.register(host_id, token, HostFacts(drivers, 4, memory_mb, sandboxes, images))
    return token


def test_the_best_candidate_has_the_image_then_the_most_free_slots(store: Store) -> None:
    registry = HostRegistry(store)
    _host(registry, "a-small-with-image", sandboxes=4, images=(BASE,))
    _host(registry, "b-big", sandboxes=10)
    _host(registry, "c-middle", sandboxes=6)
    assert Placement(registry, k=3).place(NEED).host_id == "a-small-with-image"
    # With one candidate, only the host with the most free slots is looked at.
    assert Placement(registry, k=1).place(NEED).host_id == "b-big"
    # A driver the host lacks, or more memory than it has free, rules it out.
    with pytest.raises(NoCapacity, match="firecracker"):
        Placement(registry).place(Need("firecracker", "base", 1, 512))
    with pytest.raises(NoCapacity):
        Placement(registry).place(Need("gvisor", "base", 1, 9000))


def test_a_host_with_the_packages_layer_comes_before_one_with_the_image_only(
    store: Store,
) -> None:
    registry = HostRegistry(store)
    layer = "base+" + "cd" * 8
    _host(registry, "a-image", sandboxes=10, images=(BASE,))
    _host(registry, "b-layer", sandboxes=4, images=(BASE, f"{layer}@" + "ef" * 32))
    _host(registry, "c-other-layer", sandboxes=10, images=(BASE, "base+" + "00" * 8 + "@ab12cd34"))
    placement = Placement(registry, k=3)
    assert placement.place(Need("gvisor", "base", 0.5, 512, layer=layer)).host_id == "b-layer"
    # Without packages the layer counts for nothing: the image, then the most free slots.
    assert placement.place(NEED).host_id == "a-image"


def test_a_host_reports_images_and_layers_by_their_rule(store: Store) -> None:
    registry = HostRegistry(store)
    token = _host(registry, "h", sandboxes=4)
    layer = "base+" + "cd" * 8 + "@" + "ef" * 32
    facts = HostFacts(("gvisor",), 4, 8192, 4, (BASE, layer))
    info, secret = registry.register("h", token, facts)
    assert registry.heartbeat("h", token, info.epoch, secret, (layer,)).images == (layer,)
    for bad in ("base+xyz@" + "ab" * 16, "base+" + "cd" * 8, "../x@" + "ab" * 16):
        with pytest.raises(InvalidInput, match=r"must be NAME@CONTENT_HASH or NAME\+KEY@HASH"):
            HostFacts(("gvisor",), 4, 8192, 4, (bad,))
        # A heartbeat is held to the same rule (it took any text before), nothing changed.
        with pytest.raises(InvalidInput, match=r"must be NAME@CONTENT_HASH"):
            registry.heartbeat("h", token, info.epoch, secret, (bad,))
        assert registry.get("h").images == (layer,)


def test_a_placement_reserves_capacity_and_release_gives_it_back(store: Store) -> None:
    registry = HostRegistry(store)
    token = _host(registry, "only", sandboxes=2, memory_mb=2048)
    placement = Placement(registry)
    first, second = placement.place(NEED), placement.place(NEED)
    assert first.host_id == second.host_id == "only" and first.epoch == 1
    shown = registry.get("only")
    assert (shown.used_sandboxes, shown.used_memory_mb, shown.used_cpus) == (2, 1024, 1.0)
    with pytest.raises(NoCapacity, match="no active host has a free slot"):
        placement.place(NEED)
    assert placement.release(first, NEED) is True
    assert placement.place(NEED).host_id == "only"
    # A new life of the host starts from nothing reserved; the old life's release is void.
    registry.register("only", token, HostFacts(("gvisor",), 4, 2048, 2, ()))
    assert registry.get("only").used_sandboxes == 0
    assert placement.release(second, NEED) is False
    assert registry.get("only").used_sandboxes == 0


def test_never_on_a_lost_draining_silent_or_unfit_host(store: Store) -> None:
    now = [time.time()]
    registry = HostRegistry(store, lost_after=10, clock=lambda: now[0])
    _host(registry, "draining", sandboxes=50, images=(BASE,))
    registry.drain("draining")
    _host(registry, "lost", sandboxes=50, images=(BASE,))
    now[0] += 11
    assert [h.id for h in registry.mark_lost()] == ["draining", "lost"]
    _host(registry, "silent", sandboxes=50, images=(BASE,))
    now[0] += 11  # silent for longer than the lost timeout, not yet swept
    _host(registry, "firecracker-only", sandboxes=50, drivers=("firecracker",))
    _host(registry, "tiny", sandboxes=50, memory_mb=256)
    added, _ = registry.add("never-registered", by="test")
    assert added.state == "new"
    with pytest.raises(NoCapacity):
        Placement(registry, k=10).place(NEED)
    _host(registry, "fresh", sandboxes=1)
    assert Placement(registry, k=10).place(NEED).host_id == "fresh"


def test_concurrent_placements_never_overbook(store: Store) -> None:
    registry = HostRegistry(store)
    for i in range(3):
        _host(registry, f"h{i}", sandboxes=8)
    placement = Placement(registry, k=2)

    def one(_: int) -> str | None:
        try:
            return placement.place(NEED).host_id
        except NoCapacity:
            return None

    # More placements at once than hosts: some must wait for busy hosts (never a deadlock,
    # never "no capacity" while a slot is free), and more placements than slots.
    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(one, range(40)))
    placed = [g for g in got if g is not None]
    assert len(placed) == 24 and got.count(None) == 16
    assert sorted(placed.count(f"h{i}") for i in range(3)) == [8, 8, 8]
    assert [registry.get(f"h{i}").used_sandboxes for i in range(3)] == [8, 8, 8]


def test_the_last_slot_goes_to_exactly_one_of_concurrent_placements(store: Store) -> None:
    # Two "replicas" (two stores, two connection pools) racing for one host's last slots.
    other = Store.from_url(store.engine.url)
    try:
        registries = [HostRegistry(store), HostRegistry(other)]
        token = _host(registries[0], "last", sandboxes=1)
        placements = [Placement(r) for r in registries]
        barrier = threading.Barrier(8)

        def one(i: int) -> str | None:
            barrier.wait()
            try:
                return placements[i % 2].place(NEED).host_id
            except NoCapacity:
                return None

        for round_ in range(5):
            with ThreadPoolExecutor(8) as pool:
                got = list(pool.map(one, range(8)))
            assert got.count("last") == 1 and got.count(None) == 7, (round_, got)
            assert registries[1].get("last").used_sandboxes == 1
            # A new life frees the slot for the next round.
            registries[0].register("last", token, HostFacts(("gvisor",), 4, 8192, 1, ()))
    finally:
        other.close()
