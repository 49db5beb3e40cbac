"""Run under `unshare -n` by test_documents_run.py: a run of an agent with the `documents`
tool in a docs-image sandbox, driven through the HTTP API with the scripted model double, in
a private network namespace whose only interface is `lo`. `data.test` (127.0.0.10) is an
allowed upstream serving a logo; `remote.test` resolves to a fake public host (1.1.1.1 on
`lo`) that the policy does not allow. Prints a JSON report: the run, its tool messages, its
artifacts (bytes, base64), the audit log, and what the upstreams were asked for.

Usage: python documents_probe.py SETTINGS_JSON
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import json
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import ClassVar

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / d) for d in ("agents", ".")]

from office_files import W, minimal_docx  # noqa: E402  (tests/office_files.py)
from run_helpers import admin_client, audit_and_tool_messages  # noqa: E402
from scripted_model import ScriptedModelServerForTests  # noqa: E402

from aamp.api.app import create_app  # noqa: E402
from aamp.config import Settings  # noqa: E402
from aamp.egress.resolver import StaticResolver  # noqa: E402
from aamp.sandbox.gvisor import GVisorDriver  # noqa: E402
from aamp.server import build_control_plane  # noqa: E402

UPSTREAM = "127.0.0.10"
PUBLIC = "1.1.1.1"  # a fake outside host on this namespace's loopback
# A 1x1 PNG.
LOGO = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


class Upstream(http.server.BaseHTTPRequestHandler):
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        Upstream.asked.append(f"{self.headers.get('Host')}{self.path}")
        body = LOGO if self.path == "/logo.png" else b"no"
        self.send_response(200 if body is LOGO else 404)
        self.send_header("Content-Type", "image/png" if body is LOGO else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


# Word splits "{{name}}" over runs when a part of it was typed or formatted separately.
TEMPLATE = minimal_docx(
    f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="{W}"><w:body>'
    "<w:p><w:r><w:t>ACME Ltd, 1 Main Street</w:t></w:r></w:p>"
    '<w:p><w:r><w:t xml:space="preserve">Dear {{</w:t></w:r><w:r><w:rPr><w:b/></w:rPr>'
    "<w:t>name}},</w:t></w:r></w:p>"
    "<w:p><w:r><w:t>your order {{order}} ships on {{date}}.</w:t></w:r></w:p>"
    "</w:body></w:document>"
)


def _bomb() -> bytes:
    """A DOCX whose document part inflates to 1 GiB (about 1 MB packed)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(TEMPLATE)) as z, zipfile.ZipFile(out, "w") as bomb:
        for info in z.infolist():
            if info.filename != "word/document.xml":
                bomb.writestr(info, z.read(info.filename))
        part = zipfile.ZipInfo("word/document.xml")
        part.compress_type = zipfile.ZIP_DEFLATED
        with bomb.open(part, "w", force_zip64=True) as f:
            f.write(f'<w:document xmlns:w="{W}"><w:body>'.encode())
            for _ in range(1024):
                f.write(b" " * (1 << 20))
            f.write(b"</w:body></w:document>")
    return out.getvalue()


INVOICE = """<!doctype html><html><head><title>Invoice INV-2024-017</title></head><body>
<img src="http://data.test/logo.png" alt="logo">
<h1>Invoice INV-2024-017</h1>
<table><tr><th>Item</th><th>Amount</th></tr>
<tr><td>Consulting, June</td><td>1,000.00</td></tr>
<tr><td>Travel</td><td>234.50</td></tr></table>
<p class="total">Total due: 1,234.50 EUR</p>
<img src="http://remote.test/pixel.png?id=tracking">
<img src="file:///etc/passwd">
<iframe src="file:///etc/passwd"></iframe>
</body></html>"""

SHEET = {
    "name": "Totals",
    "rows": [
        ["item", "amount"],
        ["Consulting", 1000],
        ["Travel", 234.5],
        ["total", {"formula": "=SUM(B2:B3)", "bold": True}],
        ['=HYPERLINK("http://evil.example")', None],
    ],
    "columns": [{"width": 24}, {"width": 14, "number_format": "#,##0.00"}],
    "freeze_header": True,
}


def _call(**arguments: object) -> dict:
    return {"tool_calls": [{"name": "documents", "arguments": arguments}]}


TURNS = [
    _call(
        action="render_pdf",
        html=INVOICE,
        css="h1 { color: #123; } .total { font-weight: bold; }",
        page_size="A4",
        footer="Page {page} of {pages}",
        output="out/invoice.pdf",
    ),
    _call(action="write_xlsx", sheets=[SHEET], output="out/totals.xlsx"),
    _call(
        action="write_docx",
        template="in/letter.docx",
        values={"name": "Ms Ada Lovelace", "order": "A-17", "date": "2024-07-01"},
        output="out/letter.docx",
    ),
    _call(action="read", path="in/bomb.docx"),
    _call(action="read", path="out/invoice.pdf"),
    _call(action="read", path="out/totals.xlsx"),
    {"tool_calls": [{"name": "shell", "arguments": {"command": "echo still-alive; ls out"}}]},
    {"content": "Invoice, totals and letter are in out/."},
]


async def scenario(settings: Settings, model: ScriptedModelServerForTests) -> dict:
    cp, _ = build_control_plane(settings, {"gvisor": GVisorDriver(settings.runtime_dir)})
    cp.manager.resolver = StaticResolver({"data.test": [UPSTREAM], "remote.test": [PUBLIC]})
    app = create_app(cp)
    token = settings.cli_token_path.read_text().strip()
    policy = {
        "name": "documents",
        "image": "docs",
        "egress": {"default": "block", "allow": ["data.test"]},
        "data": {
            "inbound": {"max_bytes": "5MB", "types": ["docx"]},
            "outbound": {"max_bytes": "5MB", "types": ["pdf", "xlsx", "docx"]},
        },
    }
    report: dict = {}
    async with app.router.lifespan_context(app), admin_client(app, token) as c:
        agent = (await c.post("/v1/agents", json={"name": "clerk"})).json()["id"]
        assert (await c.put("/v1/policies/documents", json=policy)).status_code == 200
        llm = {"base_url": model.base_url}
        assert (await c.put("/v1/model-endpoints/llm", json=llm)).status_code == 200
        for kind, name in (("policy", "documents"), ("image", "docs"), ("model-endpoint", "llm")):
            await c.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": name})
        definition = {
            "model": {"endpoint": "llm", "name": "scripted"},
            "tools": ["documents", "shell"],
            "policy": "documents",
            "limits": {"tool_timeout": "120s", "wall_time": "5m"},
        }
        assert (await c.put(f"/v1/agents/{agent}/draft", json=definition)).status_code == 200
        assert (await c.post(f"/v1/agents/{agent}/publish")).status_code == 200
        inputs = [
            {"name": name, "content_b64": base64.b64encode(data).decode()}
            for name, data in (("letter.docx", TEMPLATE), ("bomb.docx", _bomb()))
        ]
        made = await c.post(f"/v1/agents/{agent}/runs", json={"task": "t", "inputs": inputs})
        assert made.status_code in (200, 201), made.text
        run_id = made.json()["id"]
        await c.get(f"/v1/runs/{run_id}/events")  # until run.finished
        report["run"] = (await c.get(f"/v1/runs/{run_id}")).json()
        report["artifacts"] = (await c.get(f"/v1/runs/{run_id}/artifacts")).json()
        report["files"] = {}
        for item in report["artifacts"]:
            got = await c.get(f"/v1/runs/{run_id}/artifacts/{item['name']}")
            report["files"][item["name"]] = base64.b64encode(got.content).decode()
        report["health"] = (await c.get("/v1/health")).status_code
        report["sandboxes_after"] = (await c.get("/v1/sandboxes")).json()
    report.update(audit_and_tool_messages(cp.store, model))
    report["upstream_asked"] = Upstream.asked
    return report


def main() -> None:
    env = json.loads(sys.argv[1])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", f"{PUBLIC}/32", "dev", "lo"], check=True)
    for address in (UPSTREAM, PUBLIC):
        server = http.server.ThreadingHTTPServer((address, 80), Upstream)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    with ScriptedModelServerForTests(TURNS) as model:
        report = asyncio.run(scenario(Settings.from_env(env), model))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
