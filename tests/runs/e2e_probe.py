"""Run under `unshare -n` by test_run_end_to_end.py: the whole Must-hold scenario inside a
private network namespace whose only interface is `lo`. An upstream web server named
`data.test` (127.0.0.10), the scripted model double, and a real control plane with gVisor
sandboxes; the run is driven through the HTTP API. Prints a JSON report.

Mode `ask`: the policy says `egress.default: ask`; `shop.test` and `nope.test` resolve to a
fake public host (1.1.1.1 on `lo`); a person (this probe, as the admin, through the API)
approves shop.test only after the tool's timeout and the run's wall time have both passed,
and denies nope.test.

Usage: python e2e_probe.py SETTINGS_JSON MODE   (MODE: base | browser | ask)
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import httpx

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "agents")]

from run_helpers import admin_client, audit_and_tool_messages  # noqa: E402
from scripted_model import ScriptedModelServerForTests  # noqa: E402

from aamp.api.app import create_app  # noqa: E402
from aamp.config import Settings  # noqa: E402
from aamp.egress.resolver import StaticResolver  # noqa: E402
from aamp.sandbox.gvisor import GVisorDriver  # noqa: E402
from aamp.server import build_control_plane  # noqa: E402

UPSTREAM = "127.0.0.10"
PUBLIC = "1.1.1.1"  # a fake outside host on this namespace's loopback
FORM = b"""<html><head><title>Back office</title></head><body>
<h1>Expense form</h1>
<form method="post" action="/submit"><input id="amount" name="amount">
<button type="submit">Send</button></form></body></html>"""
EXPORT = b"claim,amount\n1,42\n"


class Upstream(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        if self.path == "/rate":
            self._send(b"1.25", "text/plain")
        elif self.path == "/form":
            self._send(FORM, "text/html")
        elif self.path == "/export.csv":
            self._send(EXPORT, "text/csv", disposition='attachment; filename="export.csv"')
        else:
            self._send(b"no", "text/plain", 404)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        Upstream.received.append(body)
        self._send(f"<html><body>Thanks: {body}</body></html>".encode(), "text/html")

    def _send(self, body: bytes, kind: str, status: int = 200, disposition: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        if disposition:
            self.send_header("Content-Disposition", disposition)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


COMPUTE = """
import csv, urllib.request
rate = float(urllib.request.urlopen('http://data.test/rate', timeout=30).read())
rows = list(csv.DictReader(open('/workspace/in/sales.csv')))
total = sum(int(r['amount']) for r in rows) * rate
open('/workspace/out/report.csv', 'w').write(f'total_eur\\n{total:.2f}\\n')
print('rate', rate, 'total', total)
"""

BASE_TURNS = [
    {"tool_calls": [{"name": "files", "arguments": {"action": "read", "path": "in/sales.csv"}}]},
    {"tool_calls": [{"name": "python", "arguments": {"code": COMPUTE}}]},
    {"tool_calls": [{"name": "files", "arguments": {"action": "list", "path": "out"}}]},
    {"content": "Wrote out/report.csv"},
]

FETCH = """
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen('http://{host}/rate', timeout=60).read().decode())
except urllib.error.HTTPError as e:
    print('http', e.code, e.read().decode())
"""

ASK_TURNS = [
    {"tool_calls": [{"name": "python", "arguments": {"code": FETCH.format(host="shop.test")}}]},
    {"tool_calls": [{"name": "python", "arguments": {"code": FETCH.format(host="shop.test")}}]},
    {"tool_calls": [{"name": "python", "arguments": {"code": FETCH.format(host="nope.test")}}]},
    {"content": "done"},
]
ASK_WALL_SECONDS = 8
ASK_APPROVE_AFTER = 11.0  # longer than the wall time and the tool timeout (3 s)

BROWSER_TURNS = [
    {
        "tool_calls": [
            {"name": "browser", "arguments": {"action": "open", "url": "http://data.test/form"}}
        ]
    },
    {
        "tool_calls": [
            {
                "name": "browser",
                "arguments": {"action": "fill", "selector": "#amount", "value": "42"},
            }
        ]
    },
    {
        "tool_calls": [
            {
                "name": "browser",
                "arguments": {"action": "click", "ref": {"$ref": ["button", "Send"]}},
            }
        ]
    },
    {"tool_calls": [{"name": "browser", "arguments": {"action": "screenshot"}}]},
    {
        "tool_calls": [
            {"name": "browser", "arguments": {"action": "open", "url": "http://blocked.test/"}}
        ]
    },
    {
        "tool_calls": [
            {
                "name": "browser",
                "arguments": {"action": "download", "url": "http://data.test/export.csv"},
            }
        ]
    },
    {"content": "Submitted 42."},
]


async def answer_approvals(c: httpx.AsyncClient, run_id: str, seen: list) -> None:
    """The person: approve shop.test late, deny nope.test at once; note the run's status."""
    answered: set[str] = set()
    while True:
        for item in (await c.get("/v1/approvals")).json():
            if item["id"] in answered or item["run_id"] != run_id:
                continue
            status = (await c.get(f"/v1/runs/{run_id}")).json()["status"]
            seen.append({"kind": item["kind"], "subject": item["subject"], "run_status": status})
            if item["subject"]["host"] == "shop.test":
                await asyncio.sleep(ASK_APPROVE_AFTER)
                decision = "approve"
            else:
                decision = "deny"
            note = {"note": "not for this task"} if decision == "deny" else {}
            got = await c.post(f"/v1/approvals/{item['id']}", json={"decision": decision, **note})
            assert got.status_code == 200, got.text
            answered.add(item["id"])
        await asyncio.sleep(0.1)


async def scenario(settings: Settings, mode: str, model: ScriptedModelServerForTests) -> dict:
    cp, _ = build_control_plane(settings, {"gvisor": GVisorDriver(settings.runtime_dir)})
    cp.manager.resolver = StaticResolver(
        {"data.test": [UPSTREAM], "shop.test": [PUBLIC], "nope.test": [PUBLIC]}
    )
    app = create_app(cp)
    token = settings.cli_token_path.read_text().strip()
    report: dict = {}
    csv_bytes = b"region,amount\nnorth,120\nsouth,80\n"
    image = "browser" if mode == "browser" else "base"
    policy = {
        "name": "reports",
        "image": image,
        "egress": {"default": "ask"}
        if mode == "ask"
        else {"default": "block", "allow": ["data.test"]},
        "data": {
            "inbound": {"max_bytes": "1MB", "types": ["csv"]},
            "outbound": {"max_bytes": "1MB", "types": ["csv"]},
        },
    }
    tools = ["browser"] if mode == "browser" else ["python", "files"]
    async with app.router.lifespan_context(app), admin_client(app, token) as c:
        agent = (await c.post("/v1/agents", json={"name": "e2e"})).json()["id"]
        assert (await c.put("/v1/policies/reports", json=policy)).status_code == 200
        llm = {"base_url": model.base_url}
        assert (await c.put("/v1/model-endpoints/llm", json=llm)).status_code == 200
        for kind, name in (("policy", "reports"), ("image", image), ("model-endpoint", "llm")):
            await c.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": name})
        definition = {
            "model": {"endpoint": "llm", "name": "scripted"},
            **({"browser": {"images": True}} if mode == "browser" else {}),
            "tools": tools,
            "policy": "reports",
            "limits": {"tool_timeout": "120s", "wall_time": "5m"}
            if mode != "ask"
            else {"tool_timeout": "3s", "wall_time": f"{ASK_WALL_SECONDS}s"},
        }
        assert (await c.put(f"/v1/agents/{agent}/draft", json=definition)).status_code == 200
        assert (await c.post(f"/v1/agents/{agent}/publish")).status_code == 200
        inputs = [{"name": "sales.csv", "content_b64": base64.b64encode(csv_bytes).decode()}]
        made = await c.post(f"/v1/agents/{agent}/runs", json={"task": "t", "inputs": inputs})
        run_id = made.json()["id"]
        seen: list = []
        person = asyncio.create_task(answer_approvals(c, run_id, seen))
        events_text = (await c.get(f"/v1/runs/{run_id}/events")).text  # until run.finished
        person.cancel()
        report["approvals_seen"] = seen
        report["approvals"] = (await c.get("/v1/approvals", params={"pending": False})).json()
        run = (await c.get(f"/v1/runs/{run_id}")).json()
        report["run"] = run
        report["events_text"] = events_text
        report["artifacts"] = (await c.get(f"/v1/runs/{run_id}/artifacts")).json()
        for item in report["artifacts"]:
            got = await c.get(f"/v1/runs/{run_id}/artifacts/{item['name']}")
            report.setdefault("artifact_files", {})[item["name"]] = got.content.decode()
        if report["artifacts"] and mode == "base":
            got = await c.get(f"/v1/runs/{run_id}/artifacts/report.csv")
            report["artifact_b64"] = base64.b64encode(got.content).decode()
        report["sandboxes_after"] = (await c.get("/v1/sandboxes")).json()
    # A clean stop removes the whole runtime directory; whatever is left of it is reported.
    report["runtime_after"] = sorted(str(p) for p in settings.runtime_dir.glob("**/*"))
    report.update(audit_and_tool_messages(cp.store, model))
    # The images each model call was shown (data: URLs of image_url parts).
    report["images_shown"] = [
        [
            part["image_url"]["url"][:30]
            for m in request["messages"]
            if isinstance(m.get("content"), list)
            for part in m["content"]
            if part.get("type") == "image_url"
        ]
        for request in model.requests
    ]
    report["upstream_posts"] = Upstream.received
    report["expected_sha256"] = hashlib.sha256(b"total_eur\n250.00\n").hexdigest()
    return report


def main() -> None:
    env, mode = json.loads(sys.argv[1]), sys.argv[2]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", f"{PUBLIC}/32", "dev", "lo"], check=True)
    for address in (UPSTREAM, PUBLIC):
        server = http.server.ThreadingHTTPServer((address, 80), Upstream)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    turns = {"browser": BROWSER_TURNS, "ask": ASK_TURNS}.get(mode, BASE_TURNS)
    with ScriptedModelServerForTests(turns) as model:
        report = asyncio.run(scenario(Settings.from_env(env), mode, model))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
