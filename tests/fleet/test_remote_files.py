"""A run whose sandbox mounts a knowledge base's index on a sandbox host on another machine
(`aamp host serve`, its own process and home), with a real replica on real PostgreSQL, real
gVisor and the scripted model, loopback only. The replica's own host is drained, so the
indexing sandbox (its index read back over the link) and the run's can only go to the
remote host.

- the index reaches the host over the link by its SHA-256 and is mounted read-only there:
  the run's `search` finds the passage and cites its document and page; the guest cannot
  write the file; the run's event says it was mounted read-only;
- the host keeps no file once the run's sandbox is gone;
- a replica that runs no sandbox itself (`aamp up --role api`) mounts it the same way (its
  run's index is not copied in);
- an upload whose bytes do not hash to the name it is sent under is refused (422) and
  recorded as `host.file_refused` in the host's log, and nothing of it is kept; the right
  bytes are kept (0600), and a second hold finds them there;
- a host found stale (stopped until it was marked lost) deletes every file it kept before
  its new life;
- a replica's own host serving a link (`AAMP_FLEET_LINK_LISTEN`) takes a create's files over
  it the same way (hold, send, claim, mount read-only; a create that held none of them is
  refused), and keeps none once the sandbox is gone.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import signal
import time
from pathlib import Path

import httpx
from fleet_processes import fleet_on_postgres, free_port, host_state, up_api, wait_for
from rag_corpus import markdown, pdf

from aamp.config import Settings
from aamp.fleet.link_ca import LinkCA, link_name

HEARTBEAT, LOST = "1", "6"
POLICY = {"name": "kb-work", "image": "rag", "lifetime": {"ttl": "10m", "idle": "5m"}}
GUIDE_PDF = pdf([
    "Opening hours of the harbour office are nine to five on weekdays.",
    "The Orme ferry carries at most 412 passengers on its crossing to Lowick.",
])  # fmt: skip
NOTES_MD = markdown("Notes", [("Vault", "The Quillfeather archive keeps its ledgers in vault 7.")])
INDEX = "/workspace/.knowledge-bases/handbook.sqlite"
WRITE = f"(echo x >> {INDEX}) 2>&1; echo rc=$?; wc -c < {INDEX}"


def _agent(admin: httpx.Client, model_url: str, name: str) -> str:
    agent = admin.post("/v1/agents", json={"name": name}).json()["id"]
    assert admin.put(f"/v1/policies/{POLICY['name']}", json=POLICY).status_code == 200
    endpoint = {"base_url": model_url, "models": ["scripted"]}
    assert admin.put("/v1/model-endpoints/llm-reader", json=endpoint).status_code == 200
    grants = [("policy", POLICY["name"]), ("image", "rag"), ("model-endpoint", "llm-reader"),
              ("knowledge-base", "handbook")]  # fmt: skip
    for kind, item in grants:
        r = admin.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": item})
        assert r.status_code == 201, r.text
    definition = {
        "model": {"endpoint": "llm-reader", "name": "scripted", "timeout": "60s", "retries": 0},
        "system_prompt": "test",
        "tools": ["shell", "knowledge-base:handbook"],
        "policy": POLICY["name"],
        "limits": {"max_steps": 10, "wall_time": "8m", "tool_timeout": "180s"},
    }
    r = admin.put(f"/v1/agents/{agent}/draft", json=definition)
    assert r.status_code == 200, r.text
    assert admin.post(f"/v1/agents/{agent}/publish").status_code == 200
    return agent


def _wait_end(admin: httpx.Client, run_id: str, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = admin.get(f"/v1/runs/{run_id}").json()
        if run["status"] in ("succeeded", "failed", "cancelled", "timed_out"):
            return run
        assert time.monotonic() < deadline, f"run {run_id} did not end: {run}"
        time.sleep(0.5)


def _events(admin: httpx.Client, run_id: str) -> list[dict]:
    text = admin.get(f"/v1/runs/{run_id}/events").text
    out = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            out.append({"event": fields["event"], "data": json.loads(fields.get("data", "{}"))})
    return out


def _run(admin: httpx.Client, turns: list[dict], name: str) -> tuple[dict, list[str], list[dict]]:
    """A run of a new agent `name` answered by `turns`: the run, its tool messages as the
    model last saw them, its events."""
    from scripted_model import ScriptedModelServerForTests

    with ScriptedModelServerForTests(turns) as model:
        agent = _agent(admin, model.base_url, name)
        made = admin.post(f"/v1/agents/{agent}/runs", json={"task": "ferry size?"})
        assert made.status_code == 201, made.text
        run = _wait_end(admin, made.json()["id"])
        assert model.requests, (run.get("status"), run.get("reason"), run.get("error"))
        messages = model.requests[-1]["messages"]
    return run, [m["content"] for m in messages if m["role"] == "tool"], _events(admin, run["id"])


def _on_h1_read_only(admin: httpx.Client, events: list[dict], host: str = "h1") -> dict:
    """The run's sandbox was on `host` and its index mounted read-only; the mount event."""
    sandbox_id = next(e["data"]["sandbox"] for e in events if e["event"] == "sandbox.created")
    created = admin.get("/v1/audit", params={"action": "sandbox.create"}).json()["records"]
    on = [r["details"].get("host") for r in created if r["resource"] == f"sandbox:{sandbox_id}"]
    assert on == [host], created
    mounted = [e["data"] for e in events if e["event"] == "knowledge_base.mounted"]
    assert [(m["name"], m["read_only"]) for m in mounted] == [("handbook", True)], events
    return mounted[0]


def test_a_run_mounts_its_index_read_only_on_a_remote_host(
    tmp_path: Path, rag_image, postgres_server
) -> None:
    fleet = fleet_on_postgres(tmp_path, postgres_server, HEARTBEAT, LOST)
    query = {"kb": "handbook", "query": "how many passengers can the Orme ferry take?", "k": 3}
    vault = {"kb": "handbook", "query": "which vault holds the Quillfeather ledgers?", "k": 3}
    turns = [
        {"tool_calls": [{"name": "rag", "arguments": query}]},
        {"tool_calls": [{"name": "rag", "arguments": vault}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": WRITE}}]},
        {"content": "At most 412 passengers (guide.pdf, page 2)."},
    ]
    left: list[int] = []
    try:
        a = fleet.replica("rep-a")
        # -- the replica's own host takes no work: the documents are indexed on h1 too ----
        assert a.post("/v1/hosts/rep-a/drain").status_code == 200
        h1 = fleet.add_host(a, "h1")
        h1.start()
        wait_for(lambda: host_state(a, "h1")["state"] == "active", 120)
        assert a.post("/v1/knowledge-bases", json={"name": "handbook"}).status_code == 201
        for name, data in (("guide.pdf", GUIDE_PDF), ("notes.md", NOTES_MD)):
            added = a.put(f"/v1/knowledge-bases/handbook/documents/{name}", content=data)
            assert added.status_code == 201, added.text

        run, tool_messages, events = _run(a, turns, "reader")
        assert run["status"] == "succeeded", run
        mounted = _on_h1_read_only(a, events)
        found, again, wrote = tool_messages
        assert found.startswith("[1] guide.pdf, page 2 (score "), found
        assert "The Orme ferry carries at most 412 passengers" in found
        assert again.startswith("[1] notes.md") and "vault 7" in again, again
        # The host keeps the resident worker: the second search pays no model load (a
        # figure, never asserted).
        took = [e["data"]["seconds"] for e in events if e["event"] == "tool.result"]
        print(f"remote searches took {took[0]:.2f} s and {took[1]:.2f} s")
        assert "Read-only file system" in wrote and "rc=0" not in wrote, wrote
        assert f"\n{mounted['size']}" in wrote, wrote  # the file unchanged

        # -- the sandbox is gone: so is the file it mounted --------------------------------
        files = h1.home / "host-files"
        wait_for(lambda: files.is_dir() and list(files.iterdir()) == [], 30)
        assert host_state(a, "h1")["used_sandboxes"] == 0

        # -- a replica that runs no sandbox itself (`aamp up --role api`) sends it too -----
        port = free_port()
        with open(tmp_path / "api.log", "wb") as out:
            proc = up_api(fleet.home, port, out, **fleet.env)
        fleet.replicas.append((proc, str(tmp_path / "no-runtime"), port))
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=a.headers, timeout=120)

        def up() -> bool:
            assert proc.poll() is None, (tmp_path / "api.log").read_text()
            try:
                return api.get("/v1/health").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 180)
        run, tool_messages, events = _run(api, [turns[0], turns[-1]], "reader-api")
        assert run["status"] == "succeeded", run
        _on_h1_read_only(api, events)  # mounted, not copied: the host's gVisor binds it
        assert tool_messages[0].startswith("[1] guide.pdf, page 2 (score "), tool_messages
        wait_for(lambda: list(files.iterdir()) == [], 30)

        # -- bytes that are not the file their name says are refused and recorded ----------
        link = httpx.Client(
            base_url=f"https://127.0.0.1:{h1.port}",
            verify=LinkCA.of(Settings.from_env({"AAMP_HOME": str(fleet.home)})).replica_context(),
            timeout=30,
        )
        sni = {"sni_hostname": link_name("h1")}
        meant, sent = b"the index meant " * 64, b"something else! " * 64
        sha, hold = hashlib.sha256(meant).hexdigest(), secrets.token_hex(16)
        held = link.post(
            f"/link/files/{sha}/hold", json={"hold": hold, "size": len(meant)}, extensions=sni
        )
        assert held.status_code == 200 and held.json() == {"present": False}, held.text
        put = link.put(f"/link/files/{sha}", params={"hold": hold}, content=sent, extensions=sni)
        assert put.status_code == 422 and put.json()["code"] == "file_refused", put.text
        unheld = link.put(
            f"/link/files/{'0' * 64}", params={"hold": hold}, content=sent, extensions=sni
        )
        assert unheld.status_code == 404, unheld.text
        assert list(files.iterdir()) == []
        log = h1.log.read_text()
        refused = [line for line in log.splitlines() if "host.file_refused" in line]
        assert len(refused) == 2, log[-3000:]
        assert f"host-file:{sha}" in refused[0] and "deny" in refused[0]
        assert "hash to " + hashlib.sha256(sent).hexdigest() in refused[0]

        # -- the right bytes are kept (held, no create yet); a stale epoch clears them -----
        put = link.put(f"/link/files/{sha}", params={"hold": hold}, content=meant, extensions=sni)
        assert put.status_code == 204, put.text
        assert [(p.name, p.stat().st_mode & 0o777) for p in files.iterdir()] == [(sha, 0o600)]
        other = link.post(
            f"/link/files/{sha}/hold",
            json={"hold": secrets.token_hex(16), "size": len(meant)},
            extensions=sni,
        )
        assert other.json() == {"present": True}  # a second create sends nothing
        link.close()
        epoch = host_state(a, "h1")["epoch"]
        assert h1.proc is not None
        h1.proc.send_signal(signal.SIGSTOP)  # it misses its heartbeats and is marked lost
        try:
            wait_for(lambda: host_state(a, "h1")["state"] == "lost", 60)
        finally:
            h1.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: host_state(a, "h1")["epoch"] > epoch, 60)
        assert list(files.iterdir()) == []  # cleared before its new life took work
    finally:
        left = fleet.close()
    assert left == []


def test_a_replicas_own_host_takes_the_files_another_replica_sends(
    tmp_path: Path, base_image, postgres_server
) -> None:
    """Through replica A's link (`AAMP_FLEET_LINK_LISTEN`), as replica B's `LinkClient`
    sends a create: the file held, sent, claimed by the create and mounted read-only; gone
    with the sandbox. (A run that B places on A's own host cannot start yet, whatever its
    files: A's own host answers no `approver` over its link — noted in the report.)"""
    fleet = fleet_on_postgres(tmp_path, postgres_server, HEARTBEAT, LOST)
    left: list[int] = []
    try:
        a = fleet.replica("rep-a", AAMP_FLEET_LINK_LISTEN=f"127.0.0.1:{free_port()}")
        wait_for(lambda: host_state(a, "rep-a")["link_address"] is not None, 60)
        own = host_state(a, "rep-a")
        link = httpx.Client(
            base_url=f"https://{own['link_address']}",
            verify=LinkCA.of(Settings.from_env({"AAMP_HOME": str(fleet.home)})).replica_context(),
            timeout=120,
        )
        sni = {"sni_hostname": link_name("rep-a")}
        data, hold = b"read me, never write me\n" * 100, secrets.token_hex(16)
        sha = hashlib.sha256(data).hexdigest()
        held = link.post(f"/link/files/{sha}/hold", json={"hold": hold, "size": len(data)},
                         extensions=sni)  # fmt: skip
        assert held.json() == {"present": False}, held.text
        put = link.put(f"/link/files/{sha}", params={"hold": hold}, content=data, extensions=sni)
        assert put.status_code == 204, put.text
        files = fleet.home / "host-files" / "rep-a"
        assert [p.name for p in files.iterdir()] == [sha]
        target = "/workspace/kept/file.txt"
        body = {"image": "base", "ttl": 300, "idle": 300, "epoch": own["epoch"],
                "files": [{"sha256": sha, "target": target}], "hold": hold}  # fmt: skip
        made = link.post("/link/sandboxes", json=body, extensions=sni)
        assert made.status_code == 201, made.text
        sandbox = made.json()["id"]
        script = f"head -c 24 {target}; (echo x >> {target}) 2>&1; wc -c < {target}"
        ran = link.post(f"/link/sandboxes/{sandbox}/exec", json={"argv": ["sh", "-c", script]},
                        extensions=sni)  # fmt: skip
        lines = [json.loads(line) for line in ran.text.splitlines()]
        out = b"".join(base64.b64decode(x["data"]) for x in lines if "data" in x).decode()
        assert out.startswith("read me, never write me\n"), out
        assert "Read-only file system" in out and f"\n{len(data)}\n" in out, out
        # A create naming a file it did not hold is refused, and boots nothing.
        body["hold"] = secrets.token_hex(16)
        refused = link.post("/link/sandboxes", json=body, extensions=sni)
        assert refused.status_code == 422, refused.text
        gone = link.delete(f"/link/sandboxes/{sandbox}", extensions=sni)
        assert gone.status_code == 204, gone.text
        assert list(files.iterdir()) == []
        assert link.get("/link/sandboxes", extensions=sni).json() == []
        link.close()
    finally:
        left = fleet.close()
    assert left == []
