"""The knowledge-base pages over HTTP, on a plane that boots nothing (indexing itself is in
test_browser_knowledge_bases.py): builders and admins see them, an operator gets the 403 page
and the refusal is on record; a bad name is shown at the field and nothing is made; files the
knowledge bases' rule refuses (type, bytes that do not look like the type) are named at the
field and nothing is uploaded; a form without the CSRF token is refused."""

from __future__ import annotations

import re

from web_helpers import Site, csrf_of


async def test_an_operator_has_no_knowledge_base_pages(site: Site) -> None:
    await site.plane.user("olga", "operator", "olga-password-1")
    olga = await site.signed_in("olga", "olga-password-1")
    home = await olga.get("/agents")
    assert home.status_code == 200 and "/knowledge-bases" not in home.text
    r = await olga.get("/knowledge-bases")
    assert r.status_code == 403 and "Not allowed" in r.text
    denied = site.audit(action="knowledge_base.list", actor="user:olga")
    assert [d["decision"] for d in denied] == ["deny"]


async def test_bad_names_and_files_are_refused_at_the_field_and_change_nothing(
    site: Site,
) -> None:
    await site.plane.user("bea", "builder", "bea-password-1")
    bea = await site.signed_in("bea", "bea-password-1")
    listing = await bea.get("/knowledge-bases")
    assert listing.status_code == 200 and 'href="/knowledge-bases"' in listing.text
    token = csrf_of(listing.text)
    r = await bea.post("/knowledge-bases", data={"name": "Bad Name!", "csrf": token})
    assert r.status_code == 422, r.text
    assert 'id="err-name"' in r.text and 'value="Bad Name!"' in r.text
    r = await bea.post("/knowledge-bases", data={"name": "handbook"})
    assert r.status_code == 403  # no CSRF token: the API's guard refuses it
    r = await bea.post("/knowledge-bases", data={"name": "handbook", "csrf": token})
    assert r.status_code == 303 and r.headers["location"] == "/knowledge-bases/handbook"
    shown = await bea.get("/knowledge-bases/handbook")
    assert shown.status_code == 200 and "No document yet." in shown.text

    files = [
        ("documents", ("guide.md", b"# Guide\n\nFerries.\n", "text/markdown")),
        ("documents", ("tool.exe", b"MZ\x90\x00", "application/octet-stream")),
        ("documents", ("fake.pdf", b"<html>not a pdf</html>", "application/pdf")),
    ]
    r = await bea.post("/knowledge-bases/handbook/documents", data={"csrf": token}, files=files)
    assert r.status_code == 400, r.text
    error = re.search(r'id="err-documents"[^>]*>([^<]+)<', r.text).group(1)
    assert "tool.exe: a knowledge base takes pdf, docx" in error
    assert "fake.pdf: not a PDF (it does not start with %PDF-)" in error
    assert "guide.md" not in error
    assert site.audit(action="knowledge_base.change") == []  # nothing was sent to the API
    async with site.plane.client(site.plane.admin_token) as admin:
        kb = (await admin.get("/v1/knowledge-bases/handbook")).json()
    assert kb["documents"] == 0 and kb["version"] == 0
