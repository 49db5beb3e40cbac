"""The browser image: Debian's chromium, driven by playwright inside a gVisor sandbox."""

from __future__ import annotations

import struct

import pytest

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
