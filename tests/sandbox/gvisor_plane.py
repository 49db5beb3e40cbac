"""One real gVisor sandbox manager for a whole test module: a scenario runs once against it
(in its own installation under pytest's temporary directory) and returns what the module's
tests then read, so slow work — booting, indexing — is done once, not per test."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from installation_settings import make_settings

from aamp.config import Settings
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import SandboxManager

Scenario = Callable[[Settings, SandboxManager], Awaitable[dict[str, Any]]]


def run_once(home: Path, scenario: Scenario) -> dict[str, Any]:
    settings = make_settings(home)

    async def main() -> dict[str, Any]:
        drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
        manager = SandboxManager(settings, ImageStore(settings), drivers, "gvisor")
        await manager.start()
        try:
            return await scenario(settings, manager)
        finally:
            await manager.shutdown()

    try:
        return asyncio.run(main())
    finally:
        shutil.rmtree(settings.runtime_dir, ignore_errors=True)
