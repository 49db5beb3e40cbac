"""Which isolation drivers this host has, and which one sandboxes get by default."""

from __future__ import annotations

from aamp.config import Settings
from aamp.sandbox.driver import Driver, DriverStatus
from aamp.sandbox.gvisor import GVisorDriver


def all_drivers(settings: Settings) -> list[Driver]:
    from aamp.sandbox.firecracker import FirecrackerDriver

    return [FirecrackerDriver(settings), GVisorDriver(settings.runtime_dir)]


def driver_mounts_files(name: str) -> bool:
    """Whether driver `name` (of any host, this one's or not) can show host files read-only."""
    from aamp.sandbox.firecracker import FirecrackerDriver

    return any(d.name == name and d.mounts_files for d in (FirecrackerDriver, GVisorDriver))


def probe_all(settings: Settings) -> list[DriverStatus]:
    return [driver.probe() for driver in all_drivers(settings)]


def available_drivers(settings: Settings) -> dict[str, Driver]:
    return {d.name: d for d in all_drivers(settings) if d.probe().usable}


def choose_default_driver(settings: Settings, drivers: dict[str, Driver]) -> str:
    wanted = settings.env.get("AAMP_DRIVER")
    if wanted:
        if wanted not in drivers:
            raise SystemExit(
                f"AAMP_DRIVER={wanted} is not usable on this host; run `aamp doctor` to see why"
            )
        return wanted
    # Hardware virtualisation first; gVisor where there is none.
    for name in ("firecracker", "gvisor"):
        if name in drivers:
            return name
    raise SystemExit("no isolation driver works on this host; run `aamp doctor` to see why")
