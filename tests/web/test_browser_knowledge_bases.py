"""The knowledge-base pages in a real browser (Playwright driving Debian's chromium) on a
control plane that indexes in real rag sandboxes: a builder creates a knowledge base, adds
three documents in one form and sees each start and end while the others still index (the
page grows as it is made), a hostile document fails alone and the page says why, a document
is removed, and deleting the knowledge base while an agent is granted it is refused at the
button naming the agent (409, on record) and works once the grant is gone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from api_plane import booting_plane_settings, running_plane
from rag_corpus import markdown, zip_bomb_docx
from web_helpers import CHROMIUM, Site, in_chromium, sign_in

pytest.importorskip("playwright.async_api")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("rag_image"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]
GUIDE = markdown("Guide", [("Ferries", "The Orme ferry carries at most 412 passengers.")])
NOTES = markdown("Notes", [("Harbour", "The harbour master answers on channel 12.")])


def _file(name: str, data: bytes) -> dict[str, object]:
    return {"name": name, "mimeType": "application/octet-stream", "buffer": data}


async def test_a_builder_fills_a_knowledge_base_and_sees_it_index(tmp_path: Path) -> None:
    shots = os.environ.get("AAMP_UI_SCREENSHOTS")
    async with running_plane(booting_plane_settings(tmp_path)) as plane:
        site = Site(plane)
        await plane.user("bea", "builder", "bea-password-1")
        async with in_chromium(site.app) as (base, browser):
            _, bea = await sign_in(browser, base, "bea", "bea-password-1")
            await bea.click("nav >> text=Knowledge bases")
            await bea.fill("#f-name", "handbook")
            await bea.click("form.card button[type=submit]")
            await bea.wait_for_selector("h1:has-text('Knowledge base handbook')")

            await bea.set_input_files(
                "#f-documents",
                files=[
                    _file("guide.md", GUIDE),
                    _file("bomb.docx", zip_bomb_docx()),
                    _file("notes.md", NOTES),
                ],
            )
            await bea.click("form.card button[type=submit]")
            # The first document's end is on the page while the rest still index.
            first = bea.locator("li[data-doc='guide.md'][data-state='indexed']")
            await first.wait_for(timeout=300_000)
            assert await bea.locator("#indexing-done").count() == 0
            assert "1 chunk(s)" in await first.inner_text()
            await bea.locator("#indexing-done").wait_for(timeout=600_000)
            assert "2 indexed, 1 failed" in await bea.inner_text("#indexing-done")
            bomb = await bea.inner_text("li[data-doc='bomb.docx'][data-state='failed']")
            assert "zip bomb" in bomb
            if shots:
                await bea.set_viewport_size({"width": 1100, "height": 900})
                await bea.screenshot(path=str(Path(shots) / "knowledge-base.png"), full_page=True)

            await bea.click("text=Back to handbook")
            row = bea.locator("tr[data-doc='bomb.docx']")
            assert "failed" in await row.inner_text() and "zip bomb" in await row.inner_text()
            await bea.click("tr[data-doc='notes.md'] button")
            await bea.wait_for_selector("h1:has-text('Knowledge base handbook')")
            assert await bea.locator("tr[data-doc='notes.md']").count() == 0
            assert await bea.locator("tr[data-doc='guide.md']").count() == 1

            async with plane.client(plane.admin_token) as admin:
                agent = (await admin.post("/v1/agents", json={"name": "reader"})).json()["id"]
                grant = {"kind": "knowledge-base", "name": "handbook"}
                r = await admin.post(f"/v1/agents/{agent}/resources", json=grant)
                assert r.status_code == 201, r.text
            await bea.click("text=Delete knowledge base handbook")
            refused = await bea.inner_text("#err-delete")
            assert f"in use by agent:{agent}" in refused
            async with plane.client(plane.admin_token) as admin:
                r = await admin.delete(f"/v1/agents/{agent}/resources/knowledge-base/handbook")
                assert r.status_code == 204, r.text
            await bea.click("text=Delete knowledge base handbook")
            await bea.wait_for_selector("h1:has-text('Knowledge bases')")
            assert "No knowledge base yet." in await bea.inner_text("table")
        denied = site.audit(action="knowledge_base.delete", decision="deny")
        assert [d["actor"] for d in denied] == ["user:bea"]
        added = site.audit(action="knowledge_base.document_added")
        assert sorted(r["actor"] for r in added) == ["user:bea"] * 3
