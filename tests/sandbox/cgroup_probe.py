"""Run by test_doctor.py inside a mount namespace where some cgroup mounts are hidden: what the
gVisor driver's probe says there, and whether a real sandbox starts there. Prints JSON.

The test checks that the two agree, so the probe claims no more and no less than runsc needs.
"""

from __future__ import annotations

import asyncio
import json
import sys

from aamp.config import Settings
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, SandboxManager


async def try_to_start(settings: Settings, driver: GVisorDriver) -> str | None:
    """None when a sandbox started and answered a command; otherwise why not."""
    manager = SandboxManager(settings, ImageStore(settings), {"gvisor": driver}, "gvisor")
    await manager.start()
    try:
        sb = await manager.create(CreateRequest(image="base"))
        async with manager.use(sb.id) as channel:
            result, out, _ = await channel.run(["echo", "started"], timeout=60)
        return None if (result.exit_code, out) == (0, b"started\n") else f"exec gave {out!r}"
    except Exception as exc:  # the report is the point: any failure to start is an answer
        return f"{type(exc).__name__}: {exc}"
    finally:
        await manager.shutdown()


def main() -> None:
    settings = Settings.from_env(json.loads(sys.argv[1]))
    driver = GVisorDriver(settings.runtime_dir)
    status = driver.probe()
    failure = asyncio.run(try_to_start(settings, driver))
    print(json.dumps({"usable": status.usable, "reason": status.reason, "failure": failure}))


if __name__ == "__main__":
    main()
