"""`/v1/knowledge-bases` on a control plane that boots real rag sandboxes: a builder makes a
knowledge base and adds documents one request each (each indexed in its own sandbox), a
hostile one fails alone and is reported, a file of the wrong type is refused before anything
is kept, a document is removed, the knowledge base is removed; each change is in the audit log
with the document's SHA-256, and an operator is refused (403, recorded with the actor)."""

from __future__ import annotations

import hashlib

import pytest
from api_plane import booting_plane_settings, running_plane
from rag_corpus import markdown, zip_bomb_docx

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("rag_image")]

GUIDE = markdown(
    "Guide", [("Ferries", "The Orme ferry carries at most 412 passengers on its crossing.")]
)


async def _records(plane, action: str) -> list[dict]:
    """The audit records of `action`, read as the admin through `/v1/audit`."""
    async with plane.client(plane.admin_token) as c:
        answer = await c.get("/v1/audit", params={"action": action, "limit": 1000})
    assert answer.status_code == 200, answer.text
    return answer.json()["records"]


async def test_a_builder_fills_and_empties_a_knowledge_base_and_an_operator_is_refused(
    tmp_path,
) -> None:
    async with running_plane(booting_plane_settings(tmp_path)) as plane:
        builder = await plane.user("bea", "builder")
        operator = await plane.user("otto", "operator")
        async with plane.client(builder, timeout=600) as c:
            made = await c.post("/v1/knowledge-bases", json={"name": "handbook"})
            assert made.status_code == 201, made.text
            again = await c.post("/v1/knowledge-bases", json={"name": "handbook"})
            assert again.status_code == 409
            url = "/v1/knowledge-bases/handbook/documents"
            added = await c.put(f"{url}/guide.md", content=GUIDE)
            assert added.status_code == 201, added.text
            bomb = await c.put(f"{url}/bomb.docx", content=zip_bomb_docx())
            assert bomb.status_code == 201, bomb.text
            wrong = await c.put(f"{url}/tool.exe", content=b"MZ\x90\x00")
            assert wrong.status_code == 400 and "takes pdf, docx" in wrong.json()["message"]
            fake = await c.put(f"{url}/fake.pdf", content=b"<html>not a pdf</html>")
            assert fake.status_code == 400 and "not a PDF" in fake.json()["message"]
            nowhere = await c.put("/v1/knowledge-bases/nope/documents/a.md", content=b"x")
            assert nowhere.status_code == 404
            shown = (await c.get("/v1/knowledge-bases/handbook")).json()
            listed = (await c.get("/v1/knowledge-bases")).json()
            removed = await c.delete(f"{url}/guide.md")
            assert removed.status_code == 200, removed.text
            missing = await c.delete(f"{url}/guide.md")
            assert missing.status_code == 404
        async with plane.client(operator) as c:
            refused = await c.get("/v1/knowledge-bases")
            assert refused.status_code == 403
            refused_put = await c.put(f"{url}/guide.md", content=GUIDE)
            assert refused_put.status_code == 403
        async with plane.client(plane.admin_token) as admin:
            # What an agent is granted is not deleted (as for policies, services, endpoints).
            agent = (await admin.post("/v1/agents", json={"name": "reader"})).json()["id"]
            grant = {"kind": "knowledge-base", "name": "handbook"}
            assert (
                await admin.post(f"/v1/agents/{agent}/resources", json=grant)
            ).status_code == 201
            in_use = await admin.delete("/v1/knowledge-bases/handbook")
            assert in_use.status_code == 409, in_use.text
            assert f"in use by agent:{agent}" in in_use.json()["message"]
            assert (await admin.get("/v1/knowledge-bases/handbook")).status_code == 200
            detached = await admin.delete(f"/v1/agents/{agent}/resources/knowledge-base/handbook")
            assert detached.status_code == 204, detached.text
        async with plane.client(builder) as c:
            gone = await c.delete("/v1/knowledge-bases/handbook")
            assert gone.status_code == 200
            assert (await c.get("/v1/knowledge-bases/handbook")).status_code == 404
        sandboxes_after = plane.cp.manager.list()

        docs = {d["name"]: d for d in shown["document_list"]}
        assert sorted(docs) == ["bomb.docx", "guide.md"]  # the refused ones were never kept
        assert docs["guide.md"]["status"] == "indexed" and docs["guide.md"]["chunks"] == 1
        assert docs["bomb.docx"]["status"] == "failed" and "zip bomb" in docs["bomb.docx"]["error"]
        assert shown["version"] == 2 and shown["failed"] == 1
        assert [kb["name"] for kb in listed] == ["handbook"]
        assert removed.json()["version"] == 3
        assert sandboxes_after == []

        adds = await _records(plane, "knowledge_base.document_added")
        assert [r["details"]["document"] for r in adds] == ["guide.md", "bomb.docx"]
        assert adds[0]["actor"] == "user:bea"
        assert adds[0]["details"]["sha256"] == hashlib.sha256(GUIDE).hexdigest()
        assert adds[1]["details"]["status"] == "failed"
        removed_records = await _records(plane, "knowledge_base.document_removed")
        assert [r["details"]["document"] for r in removed_records] == ["guide.md"]
        assert len(await _records(plane, "knowledge_base.deleted")) == 1
        refusals = [
            r for r in await _records(plane, "knowledge_base.delete") if r["decision"] == "deny"
        ]
        assert len(refusals) == 1 and "in use by agent:" in refusals[0]["reason"]
        listed_records = await _records(plane, "knowledge_base.list")
        denied = [r for r in listed_records if r["decision"] == "deny"]
        assert denied and denied[0]["actor"] == "user:otto"
        denied_change = await _records(plane, "knowledge_base.change")
        assert any(r["decision"] == "deny" and r["actor"] == "user:otto" for r in denied_change)
