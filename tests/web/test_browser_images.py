"""The admin's Images page in a real browser (Playwright driving Debian's chromium): a build
started from the page shows its progress line by line while it runs, over server-sent events;
a second build of the same image is refused at the form (409, the rule named, on record); an
operator who posts the form gets the 403 page and a denial on record; and a real build of
`base` from the built-image cache ends on the page with the hash built.

The first build waits on another builder's lock (`OtherBuild`, tests/api/other_build.py), so
it stays in progress for as long as the test looks at it, without minutes of debootstrap.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from api_plane import ADMIN_PASSWORD, plane_settings, running_plane
from install_layout import shared_home, shared_image_dir
from other_build import OtherBuild
from web_helpers import CHROMIUM, Site, in_chromium, sign_in

from aamp.egress.ca import CA_DIRNAME, ca_cert_path
from aamp.sandbox.images import ImageStore

pytest.importorskip("playwright.async_api")
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"
)


async def _build_from_the_page(page, name: str, *, force: bool = False) -> None:
    await page.goto("/admin/images")
    await page.fill("#f-name", name)
    if force:
        await page.check("#f-force")
    await page.click("form.card button[type=submit]")
    await page.wait_for_load_state()


async def test_a_build_shows_its_progress_live_and_a_second_is_refused(tmp_path) -> None:
    settings = plane_settings(tmp_path)
    async with running_plane(settings) as plane:
        site = Site(plane)
        await plane.user("olga", "operator", "olga-password-1")
        other = OtherBuild(settings, "base")
        try:
            async with in_chromium(site.app) as (base, browser):
                _, admin = await sign_in(browser, base, "admin", ADMIN_PASSWORD)
                await _build_from_the_page(admin, "base")
                assert admin.url.endswith("/admin/images/base/build")
                # The build waits for the other builder, says so, and is still running.
                line = admin.locator("#build-log li", has_text="waiting for another build")
                await line.first.wait_for(timeout=20_000)
                assert "Building" in await admin.inner_text("#build-state")

                # A second build of the same image, from another tab, is refused at the form.
                again = await admin.context.new_page()
                await _build_from_the_page(again, "base", force=True)
                error = await again.inner_text("#err-name")
                assert "already being built (started by user:admin" in error
                assert "one build of an image at a time" in error
                assert await again.input_value("#f-name") == "base"
                assert await again.is_checked("#f-force")

                # An operator who types the address gets the 403 page; one who posts the
                # form anyway (with their own CSRF token) too.
                olga_context, olga = await sign_in(browser, base, "olga", "olga-password-1")
                await olga.goto("/admin/images")
                assert "Not allowed" in await olga.inner_text("h1")
                assert await olga.locator("nav a[href='/admin/images']").count() == 0
                cookies = await olga_context.cookies()
                csrf = next(c["value"] for c in cookies if c["name"] == "aamp_csrf")
                posted = await olga.request.post(
                    "/admin/images", form={"name": "base", "csrf": csrf}
                )
                assert posted.status == 403 and "Not allowed" in await posted.text()

                # The other build ends: the page says what was built, without a reload.
                other.finish()
                await admin.locator("#build-state", has_text="Built").wait_for(timeout=20_000)
                assert other.hash[:16] in await admin.inner_text("#build-state")
                assert "up to date" in await admin.inner_text("#build-log")
        finally:
            other.release()
        denials = [r for r in site.audit(action="image.build") if r["decision"] == "deny"]
        assert [r["actor"] for r in denials] == ["user:admin", "user:olga"]
        looked = site.audit(action="image.build_read", actor="user:olga")
        assert [r["decision"] for r in looked] == ["deny"]
        assert "already being built" in denials[0]["reason"]
        assert len(site.audit(action="image.build_finished")) == 1


async def test_a_cached_image_is_built_from_the_page(tmp_path) -> None:
    """A real build of `base`: the shared cache holds it (same code, same CA), so the build
    finds it by its content hash in a moment and the page shows it built."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copytree(shared_home() / CA_DIRNAME, home / CA_DIRNAME)
    settings = plane_settings(tmp_path, AAMP_IMAGE_DIR=str(shared_image_dir()))
    wanted = ImageStore(settings).content_hash("base", ca_cert=ca_cert_path(settings))
    if not (shared_image_dir() / "base" / wanted / "image.json").is_file():
        pytest.skip("the shared base image is not built for this code: scripts/install builds it")
    async with (
        running_plane(settings) as plane,
        in_chromium(Site(plane).app) as (base, browser),
    ):
        _, admin = await sign_in(browser, base, "admin", ADMIN_PASSWORD)
        await _build_from_the_page(admin, "base")
        await admin.locator("#build-state", has_text="Built").wait_for(timeout=20_000)
        assert wanted[:16] in await admin.inner_text("#build-state")
        assert f"[base] up to date ({wanted[:12]})" in await admin.inner_text("#build-log")
        await admin.goto("/admin/images")
        assert wanted[:16] in await admin.inner_text("table")
