"""The browser image: Debian's chromium, driven by playwright inside a gVisor sandbox, and kept
quiet by the image's managed policy and wrapper flags."""

from __future__ import annotations

import json
import struct

import pytest

from aamp.sandbox import browser_quiet
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, SandboxManager

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("browser_image")]

SCRIPT = r"""
from playwright.sync_api import sync_playwright
html = "<html><body style='margin:0;background:red'><h1>aamp 42</h1></body></html>"
with sync_playwright() as p:
    browser = p.chromium.launch(
        executable_path="/usr/bin/chromium",
        args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
              "--disable-background-networking", "--disable-component-update"],
    )
    page = browser.new_page(viewport={"width": 320, "height": 200})
    page.goto("data:text/html," + html)
    print(page.inner_text("h1"))
    page.screenshot(path="/workspace/shot.png")
    browser.close()
"""


async def test_chromium_renders_a_data_url_and_takes_a_screenshot(settings):
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    manager = SandboxManager(settings, ImageStore(settings), drivers, "gvisor")
    await manager.start()
    try:
        sb = await manager.create(CreateRequest(image="browser"))
        async with manager.use(sb.id) as channel:
            result, out, err = await channel.run(["python3", "-c", SCRIPT], timeout=180)
            assert result.exit_code == 0, err.decode(errors="replace")[-3000:]
            assert out.strip() == b"aamp 42"
            stream = await channel.get("shot.png")
            png = b"".join([chunk async for chunk in stream])
    finally:
        await manager.shutdown()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (320, 200)


QUIET_CHECK = r"""
import json, subprocess
policy = json.load(open("/etc/chromium/policies/managed/aamp-quiet.json"))
trace = subprocess.run(["sh", "-x", "/usr/bin/chromium", "--version"], capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin", "HOME": "/root"}).stderr
line = [l for l in trace.splitlines() if l.startswith("+ exec /usr/lib/chromium/chromium")][-1]
print(json.dumps({"policy": policy, "exec": line}))
"""


async def test_chromium_in_the_image_is_quiet_by_policy_and_flags(settings):
    """What browser_quiet puts into the image is there and in force for every chromium the
    guest starts through /usr/bin/chromium (whether the browser tool does or the agent's own
    shell). That it then makes no traffic of its own is test_browser_tool's ledger check."""
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    manager = SandboxManager(settings, ImageStore(settings), drivers, "gvisor")
    await manager.start()
    try:
        sb = await manager.create(CreateRequest(image="browser"))
        async with manager.use(sb.id) as channel:
            result, out, err = await channel.run(["python3", "-c", QUIET_CHECK], timeout=60)
    finally:
        await manager.shutdown()
    assert result.exit_code == 0, err.decode(errors="replace")[-3000:]
    seen = json.loads(out)
    assert seen["policy"] == browser_quiet.POLICY
    assert seen["policy"]["PasswordLeakDetectionEnabled"] is False
    flags = seen["exec"].split()
    for flag in browser_quiet.FLAGS:
        assert flag in flags, flag
    assert "--gaia-url=http://127.0.0.1:9" in flags
    assert "--enable-remote-extensions" not in flags  # Debian's default, which would keep
    assert "GOOGLE_API_KEY" not in seen["exec"]  # background networking on, is dropped
