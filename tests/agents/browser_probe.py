"""Run under `unshare -n` by the browser tool's tests: a private network namespace whose only
interface is `lo`, the legacy app (legacy_app.py) on 127.0.0.10:80 named `legacy.test`, and a
real gVisor sandbox from the browser image whose only way out is the egress proxy (`legacy.test`
allowed, everything else refused). The host-side browser tool drives it, call by call, exactly
as a run would (`BrowserTool` over the guest channel, refusals read from the sandbox's egress
ledger). Prints one JSON report: every call's observation, what the app received, the whole
egress ledger.

Usage: python browser_probe.py SETTINGS_JSON SCENARIO_JSON

The scenario is {"browser": {...agent browser settings...}, "steps": [...]}; a step is a
browser call (its arguments; `{"$ref": [role, name]}` is filled from the latest snapshot), or
{"shell": "command"} run in the sandbox, or {"put": [path, text]} into /workspace, or
{"sleep": seconds}.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from legacy_app import LegacyAppForTests  # noqa: E402
from snapshot_refs import fill_refs  # noqa: E402

from aamp.agents.browser_settings import BrowserBlock  # noqa: E402
from aamp.agents.browser_tool import BrowserTool  # noqa: E402
from aamp.agents.tools import ToolSet  # noqa: E402
from aamp.config import Settings  # noqa: E402
from aamp.egress.proxy import EgressContext  # noqa: E402
from aamp.egress.resolver import StaticResolver, SystemResolver  # noqa: E402
from aamp.egress.rules import EgressRules  # noqa: E402
from aamp.policy import validate  # noqa: E402
from aamp.sandbox.gvisor import GVisorDriver  # noqa: E402
from aamp.sandbox.images import ImageStore  # noqa: E402
from aamp.sandbox.manager import CreateRequest, SandboxManager  # noqa: E402

APP_ADDRESS = "127.0.0.10"
PUBLIC = "1.1.1.1"  # a would-be outside host, on this namespace's loopback


class LedgerForTests:
    """Keeps every egress event (the real sink of the control plane is the audit log)."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    async def record(self, event) -> None:
        self.events.append(
            {k: getattr(event, k) for k in ("kind", "host", "port", "decision", "rule")}
        )


async def scenario(settings: Settings, spec: dict, app: LegacyAppForTests) -> dict:
    ledger = LedgerForTests()
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    manager = SandboxManager(
        settings,
        ImageStore(settings),
        drivers,
        "gvisor",
        egress=EgressContext(SystemResolver(), ledger),
    )
    manager.resolver = StaticResolver(
        {"legacy.test": [APP_ADDRESS], "tracker.test": [PUBLIC], "blocked.test": [PUBLIC]}
    )
    browser = validate(BrowserBlock, spec.get("browser", {}))
    assert not isinstance(browser, list), browser  # the block's problems
    tools = ToolSet.build(("browser",), {})
    report: dict = {"steps": []}
    await manager.start()
    try:
        egress = EgressRules.from_lists("block", allow=["legacy.test"])
        sandbox = await manager.create(CreateRequest(image="browser", egress=egress))
        tool = BrowserTool(
            lambda: manager.use(sandbox.id), spec.get("tool_timeout", 120), browser,
            await manager.egress_view(sandbox.id),
        )  # fmt: skip
        last_text = ""
        for step in spec["steps"]:
            entry: dict = {"step": step}
            if "sleep" in step:
                await asyncio.sleep(step["sleep"])
            elif "shell" in step:
                async with manager.use(sandbox.id) as channel:
                    result, out, err = await channel.run(["sh", "-c", step["shell"]], timeout=60)
                entry.update(exit_code=result.exit_code, stdout=out.decode(), stderr=err.decode())
            elif "put" in step:
                path, text = step["put"]
                async with manager.use(sandbox.id) as channel:
                    await channel.put(path, text.encode(), len(text.encode()))
            else:
                args = fill_refs(step, last_text)
                checked, problem = tools.check_call("browser", json.dumps(args))
                assert problem is None, problem
                began = time.monotonic()
                observation = await tool.run(checked)
                if "\nsnapshot:\n" in observation.text:
                    last_text = observation.text
                entry.update(
                    args=args,
                    ok=observation.ok,
                    text=observation.text,
                    detail=observation.detail,
                    seconds=round(time.monotonic() - began, 3),
                    screenshot_bytes=len(observation.screenshot or b""),
                    screenshot_png=(observation.screenshot or b"").startswith(b"\x89PNG"),
                    model_image=observation.model_image.media_type
                    if observation.model_image
                    else None,
                )
            report["steps"].append(entry)
    finally:
        await manager.shutdown()
    report["received"] = app.received
    report["ledger"] = ledger.events
    return report


def main() -> None:
    settings, spec = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for address in (APP_ADDRESS, PUBLIC):
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    with LegacyAppForTests(APP_ADDRESS, 80) as app:
        report = asyncio.run(scenario(Settings.from_env(settings), spec, app))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
