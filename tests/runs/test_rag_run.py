"""The `rag` tool end to end through the HTTP API, with real gVisor sandboxes and the scripted
model double: a builder makes a knowledge base from a PDF and a Markdown file (indexed in a
rag sandbox); an agent granted it searches it in its run's own sandbox and the observation
cites the passage's document and page; an operator whose agent lacks the grant is refused
(403 and the audit record naming what is not granted), and such an agent has no `rag` tool
until it is granted."""

from __future__ import annotations

from rag_corpus import markdown, pdf
from run_helpers import make_agent, parse_sse, wait_end
from scripted_model import ScriptedModelServerForTests
from sqlalchemy import text

POLICY = {"name": "kb-work", "image": "rag", "lifetime": {"ttl": "10m", "idle": "5m"}}
GUIDE_PDF = pdf([
    "Opening hours of the harbour office are nine to five on weekdays.",
    "The Orme ferry carries at most 412 passengers on its crossing to Lowick.",
])  # fmt: skip
NOTES_MD = markdown("Notes", [("Vault", "The Quillfeather archive keeps its ledgers in vault 7.")])


async def test_a_run_searches_its_granted_knowledge_base_and_cites_document_and_page(
    run_plane, rag_image
) -> None:
    plane, cp = run_plane, run_plane.cp
    builder = await plane.user("bea", "builder")
    operator = await plane.user("otto", "operator")
    async with plane.client(builder, timeout=600) as c:
        assert (await c.post("/v1/knowledge-bases", json={"name": "handbook"})).status_code == 201
        for name, data in (("guide.pdf", GUIDE_PDF), ("notes.md", NOTES_MD)):
            added = await c.put(f"/v1/knowledge-bases/handbook/documents/{name}", content=data)
            assert added.status_code == 201, added.text
    query = {"kb": "handbook", "query": "how many passengers can the Orme ferry take?", "k": 3}
    turns = [
        {"tool_calls": [{"name": "rag", "arguments": query}]},
        {"content": "At most 412 passengers (guide.pdf, page 2)."},
    ]
    with ScriptedModelServerForTests(turns) as model:
        async with plane.client(plane.admin_token) as admin:
            tools = ["knowledge-base:handbook"]
            agent = await make_agent(admin, "reader", model.base_url, POLICY, tools=tools)
            grant = {"kind": "knowledge-base", "name": "handbook"}
            granted = await admin.post(f"/v1/agents/{agent}/resources", json=grant)
            assert granted.status_code == 201, granted.text
            # The same tools, without the grant: refused to an operator who may run it.
            lacking = await make_agent(admin, "lacking", model.base_url, POLICY, tools=tools)
            r = await admin.post(f"/v1/agents/{lacking}/grants",
                                 json={"user": "otto", "level": "run"})  # fmt: skip
            assert r.status_code == 201
            made = await admin.post(f"/v1/agents/{agent}/runs", json={"task": "ferry size?"})
            assert made.status_code == 201, made.text
            run = await wait_end(admin, made.json()["id"], timeout=400)
            events = (await admin.get(f"/v1/runs/{run['id']}/events")).text
        async with plane.client(operator) as c:
            refused = await c.post(f"/v1/agents/{lacking}/runs", json={"task": "ferry size?"})
    assert run["status"] == "succeeded", run
    assert run["answer"] == "At most 412 passengers (guide.pdf, page 2)."
    tool_messages = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    first = tool_messages[0]
    assert first.startswith("[1] guide.pdf, page 2 (score "), first
    assert "The Orme ferry carries at most 412 passengers" in first
    tools_offered = {t["function"]["name"] for t in model.requests[0]["tools"]}
    assert tools_offered == {"rag"}
    mounted = [e["data"] for e in parse_sse(events) if e["event"] == "knowledge_base.mounted"]
    assert [(m["name"], m["version"], m["read_only"]) for m in mounted] == [("handbook", 2, True)]
    assert "knowledge_base.copied" not in events  # gVisor binds the stored file, read-only
    assert cp.manager.list() == []

    assert refused.status_code == 403, refused.text
    assert "knowledge-base:handbook is not granted" in refused.json()["message"]
    with cp.store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT actor, action, decision, reason FROM audit_records "
                 "WHERE request_id = :r ORDER BY seq"), {"r": refused.headers["x-request-id"]}
        ).all()  # fmt: skip
    assert [(a, b, d) for a, b, d, _ in rows] == [("user:otto", "run.create", "deny")]
    assert "knowledge-base:handbook is not granted" in rows[0][3]
