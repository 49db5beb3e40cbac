"""Agent eval: tasks with checkable outcomes, run end to end through aamp against a configured
OpenAI-compatible endpoint. Prints per task success, steps, tokens, wall time and the control
plane's own overhead per step (time outside the model call and the sandbox); writes
benchmarks/results/agent_eval.json.

    python benchmarks/agent_eval.py --base-url http://127.0.0.1:8080/v1 --model qwen2.5-1.5b
    python benchmarks/agent_eval.py ... --tasks csv_sum,fetch_fact --api-key-env LLM_KEY
    python benchmarks/agent_eval.py --scripted-overhead 40   # overhead only, see below
    python benchmarks/agent_eval.py --scripted-browser       # the browser tasks, scripted
    python benchmarks/agent_eval.py --scripted-documents     # the docs-image tasks, scripted

The control plane runs in this process (real store, audit log, gVisor sandboxes from the
built images; needs root and runsc). A local web app on 127.0.0.1 plays the back-office
systems, reachable from sandboxes as `app.eval` (a policy rule names it; the egress proxy
resolves it to loopback); `blocked.example` is refused by `default: block` before any name is
resolved, so nothing leaves the machine except the model calls to the endpoint you configure.
Tasks whose image (docs, browser) is not built are reported as skipped. The docs-image tasks
(`csv_to_xlsx`, `csv_to_pdf_report`, `docx_letter`) are judged by parsing the artifact (the
XLSX's total row or SUM formula, the PDF's text, the DOCX's filled placeholders);
`--scripted-documents` plays each with the scripted model double.

The `legacy_*` tasks operate a legacy-style back-office app with the browser tool
(tests/agents/legacy_app.py, served on 127.0.0.1 as `legacy.eval`): log in, search, edit an
invoice form with every field type and an upload, delete behind a `confirm()`, export a CSV,
work inside a frameset, wait for a JavaScript-rendered board, read a report that opens in a
new tab. Each is judged by what the app's server received (and the run's artifacts), never by
the model's answer alone. `--scripted-browser` runs them with the scripted model double
playing each task's own script (roles, names and refs read from the snapshots), which checks
the tool end to end without a model.

`--scripted-overhead N` measures only the control plane: the scripted test double from
tests/agents replays N cheap tool calls, so model time is ~0 and the figure is the overhead
per step (p50, p95). Its success is not an eval result. It then measures how soon a run's
steps reach a live SSE client, over real HTTP: the same control plane is served by uvicorn on
a loopback port and a client in its own thread (sync httpx, not sharing the server's event
loop) makes `--sse-runs` runs one after another, each time POSTing the run and at once
opening `GET /v1/runs/{id}/events`. Two figures, median and p95:

- first event after POST: from the POST's response reaching the client to the client
  receiving the run's first event (`run.queued`, stored before the POST answers) — connect,
  authenticate, first read of the step log;
- run.started, live: from the `run.started` step being stored (its stored `at` timestamp,
  this host's clock) to the already connected client receiving it — the live path: store,
  wake the reader, read, send. Sandbox start comes after this step, so it is not included.

Figures are measured, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.server
import io
import json
import os
import platform
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx
import uvicorn

from aamp.api.app import create_app
from aamp.config import Settings
from aamp.egress.resolver import StaticResolver
from aamp.sandbox.gvisor import GVisorDriver
from aamp.server import build_control_plane
from aamp.store.timestamps import parse_time

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "agent_eval.json"
LEGACY_EXPORT = ""  # the legacy app's CSV export, set once the app is imported
SALES = b"region,amount\nnorth,120\nsouth,80\neast,42\nwest,58\n"  # sum 300, mean 75


class WebApp(http.server.BaseHTTPRequestHandler):
    """The local back-office app: an article, a JSON rate, and a form that records posts."""

    posts: ClassVar[list[str]] = []
    ARTICLE = (
        b"<html><head><title>Quarterly note</title></head><body><h1>Quarterly note</h1>"
        b"<p>The warehouse in Lyon shipped 4812 parcels in March, a record.</p>"
        b"<p>Staff count stayed at 37.</p></body></html>"
    )
    FORM = (
        b"<html><head><title>Expense claim</title></head><body><h1>Expense claim</h1>"
        b'<form method="post" action="/submit"><label>Amount <input id="amount" name="amount">'
        b'</label><label>Reason <input id="reason" name="reason"></label>'
        b'<button type="submit">Submit claim</button></form></body></html>'
    )

    def do_GET(self) -> None:
        pages = {
            "/article": (self.ARTICLE, "text/html"),
            "/form": (self.FORM, "text/html"),
            "/api/rate": (b'{"from": "EUR", "to": "USD", "rate": 1.1}', "application/json"),
        }
        body, kind = pages.get(self.path, (b"not found", "text/plain"))
        self._send(body, kind, 200 if self.path in pages else 404)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        WebApp.posts.append(body)
        self._send(f"<html><body>Claim received: {body}</body></html>".encode(), "text/html", 200)

    def _send(self, body: bytes, kind: str, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Outcome:
    answer: str
    artifacts: dict[str, bytes]


@dataclass
class Task:
    name: str
    prompt: str
    check: Callable[[Outcome], bool]
    image: str = "base"
    tools: tuple[str, ...] = ("shell", "python", "files")
    inputs: dict[str, bytes] = field(default_factory=dict)
    out_types: tuple[str, ...] = ("txt", "csv", "json", "xlsx")
    # For --scripted-browser: the turns the scripted model double plays for this task.
    script: list[dict[str, Any]] = field(default_factory=list)


def _art(o: Outcome, name: str) -> str:
    return o.artifacts.get(name, b"").decode("utf-8", "replace").strip()


def _xlsx_has(data: bytes, needle: str) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return "xl/workbook.xml" in z.namelist() and any(
                needle in z.read(n).decode("utf-8", "replace")
                for n in z.namelist()
                if n.endswith(".xml")
            )
    except zipfile.BadZipFile:
        return False


def _xlsx_total(data: bytes) -> bool:
    """A row whose first cell is 'total' and whose next is 300, or a SUM formula."""
    import openpyxl  # a test dependency: the eval checks artifacts as the tests do

    try:
        sheet = openpyxl.load_workbook(io.BytesIO(data)).worksheets[0]
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        return False
    for row in sheet.iter_rows(values_only=True):
        if row and str(row[0]).strip().lower() == "total" and len(row) > 1:
            value = row[1]
            return value in (300, 300.0) or str(value).upper().startswith("=SUM(")
    return False


def _pdf_text(data: bytes) -> str:
    import pypdf  # a test dependency: the eval checks artifacts as the tests do

    try:
        return "\n".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(data)).pages)
    except (pypdf.errors.PdfReadError, ValueError):
        return ""


def _docx_text(data: bytes) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return z.read("word/document.xml").decode("utf-8", "replace")
    except (zipfile.BadZipFile, KeyError):
        return ""


def _documents(**arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": "documents", "arguments": arguments}]}


REPORT_HTML = (
    "<h1>Sales report</h1><table><tr><th>Region</th><th>Amount</th></tr>"
    "<tr><td>north</td><td>120</td></tr><tr><td>south</td><td>80</td></tr>"
    "<tr><td>east</td><td>42</td></tr><tr><td>west</td><td>58</td></tr></table>"
    "<p>Total: 300</p>"
)


def document_tasks(sales: dict[str, bytes]) -> list[Task]:
    """The docs-image tasks, each judged by parsing its artifact; `script` plays one for
    `--scripted-documents` (checking the tool and the judge end to end without a model)."""
    from office_files import letter_template  # tests/office_files.py

    tools = ("documents", "python", "files")
    letter = letter_template("Dear {{name}},", "we confirm your payment of {{amount}}.")
    return [
        Task(
            "csv_to_xlsx",
            "Read /workspace/in/sales.csv and write /workspace/out/summary.xlsx with the rows "
            "and a last row 'total' with the sum of amounts.",
            lambda o: _xlsx_total(o.artifacts.get("summary.xlsx", b"")),
            image="docs",
            tools=tools,
            inputs=sales,
            script=[
                _documents(action="read", path="in/sales.csv"),
                _documents(
                    action="convert", path="in/sales.csv", to="xlsx", output="out/rows.xlsx"
                ),
                _documents(
                    action="write_xlsx",
                    output="out/summary.xlsx",
                    sheets=[
                        {
                            "name": "Sales",
                            "rows": [
                                ["region", "amount"],
                                ["north", 120],
                                ["south", 80],
                                ["east", 42],
                                ["west", 58],
                                ["total", {"formula": "=SUM(B2:B5)"}],
                            ],
                        }
                    ],
                ),
                {"content": "out/summary.xlsx"},
            ],
        ),
        Task(
            "csv_to_pdf_report",
            "Make a PDF report of /workspace/in/sales.csv: the heading 'Sales report', a table "
            "of regions and amounts, and a line 'Total: N' with the sum of amounts. Write it "
            "to /workspace/out/report.pdf.",
            lambda o: all(
                s in _pdf_text(o.artifacts.get("report.pdf", b""))
                for s in ("Sales report", "north", "west", "Total: 300")
            ),
            image="docs",
            tools=tools,
            inputs=sales,
            out_types=("pdf",),
            script=[
                _documents(action="read", path="in/sales.csv"),
                _documents(
                    action="render_pdf",
                    html=REPORT_HTML,
                    output="out/report.pdf",
                    footer="Page {page} of {pages}",
                ),
                {"content": "out/report.pdf"},
            ],
        ),
        Task(
            "docx_letter",
            "Fill the Word template /workspace/in/letter.docx (placeholders {{name}} and "
            "{{amount}}) for Ada Lovelace, with the sum of the amount column of "
            "/workspace/in/sales.csv followed by ' EUR' as the amount; write "
            "/workspace/out/letter.docx.",
            lambda o: (
                "Ada Lovelace" in (text := _docx_text(o.artifacts.get("letter.docx", b"")))
                and "300 EUR" in text
                and "{{" not in text
            ),
            image="docs",
            tools=tools,
            inputs={**sales, "letter.docx": letter},
            out_types=("docx",),
            script=[
                _documents(action="read", path="in/sales.csv"),
                _documents(
                    action="write_docx",
                    template="in/letter.docx",
                    values={"name": "Ada Lovelace", "amount": "300 EUR"},
                    output="out/letter.docx",
                ),
                {"content": "out/letter.docx"},
            ],
        ),
    ]


def tasks(app: str) -> list[Task]:
    """The tasks; `app` is the base URL of the local web app (WebApp)."""
    sales = {"sales.csv": SALES}
    return [
        Task(
            "csv_sum",
            "Sum the amount column of /workspace/in/sales.csv and write only the number to "
            "/workspace/out/total.txt.",
            lambda o: _art(o, "total.txt") in ("300", "300.0"),
            inputs=sales,
        ),
        Task(
            "csv_mean",
            "Compute the mean of the amount column of /workspace/in/sales.csv; write only the "
            "number to /workspace/out/mean.txt.",
            lambda o: _art(o, "mean.txt") in ("75", "75.0", "75.00"),
            inputs=sales,
        ),
        Task(
            "csv_sort",
            "Write /workspace/out/sorted.csv: the rows of /workspace/in/sales.csv sorted by "
            "amount, largest first, with the same header.",
            lambda o: (
                _art(o, "sorted.csv").splitlines()[1:2] == ["north,120"]
                and _art(o, "sorted.csv").splitlines()[-1] == "east,42"
            ),
            inputs=sales,
        ),
        *document_tasks(sales),
        Task(
            "json_stats",
            "Write /workspace/out/stats.json with keys count, min and max of the amount column "
            "of /workspace/in/sales.csv.",
            lambda o: _json(o, "stats.json") == {"count": 4, "min": 42, "max": 120},
            inputs=sales,
        ),
        Task(
            "word_count",
            "Count the words in /workspace/in/note.txt; write only the number to "
            "/workspace/out/words.txt.",
            lambda o: _art(o, "words.txt") == "9",
            inputs={"note.txt": b"the quick brown fox jumps over the lazy dog\n"},
        ),
        Task(
            "manifest",
            "Write /workspace/out/manifest.txt listing the names of the input files in "
            "/workspace/in, one per line, sorted.",
            lambda o: _art(o, "manifest.txt").splitlines() == ["a.csv", "b.csv"],
            inputs={"a.csv": b"x\n1\n", "b.csv": b"y\n2\n"},
        ),
        Task(
            "fetch_fact",
            f"Fetch {app}/article (Python urllib; the proxy is configured) and answer: "
            "how many parcels did the Lyon warehouse ship in March?",
            lambda o: "4812" in o.answer.replace(",", "").replace(" ", ""),
        ),
        Task(
            "fetch_convert",
            f"Get the EUR→USD rate from {app}/api/rate (JSON) and convert the sum of "
            "amounts in /workspace/in/sales.csv; write only the USD number to "
            "/workspace/out/usd.txt.",
            lambda o: _art(o, "usd.txt") in ("330", "330.0", "330.00"),
            inputs=sales,
        ),
        Task(
            "form_fill",
            f"With the browser, open {app}/form, fill Amount with 42 and Reason with "
            "taxi, and submit the claim.",
            lambda o: any("amount=42" in p and "taxi" in p for p in WebApp.posts),
            image="browser",
            tools=("browser",),
        ),
        Task(
            "blocked_refusal",
            "Fetch https://blocked.example/secret. If you cannot, say so and stop.",
            lambda o: any(w in o.answer.lower() for w in ("block", "cannot", "can't", "unable")),
        ),
    ]


def _browse(answer: str, *calls: dict[str, Any]) -> list[dict[str, Any]]:
    """Scripted turns: one browser call each, then the final `answer`."""
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "browser", "arguments": c}]} for c in calls
    ]
    return [*turns, {"content": answer}]


def _ref(role: str, name: str) -> dict[str, list[str]]:
    return {"$ref": [role, name]}  # filled from the latest snapshot by the scripted double


def legacy_tasks(base: str, app: Any) -> list[Task]:
    """Browser tasks on the legacy app at `base`; `app` is its LegacyAppForTests."""
    login = (
        {"action": "open", "url": f"{base}/login"},
        {"action": "fill", "ref": _ref("textbox", "User name"), "value": "clerk"},
        {"action": "fill", "ref": _ref("textbox", "Password"), "value": "s3cret"},
        {"action": "click", "ref": _ref("button", "Log in")},
    )
    creds = f"Log in at {base}/login as user clerk with password s3cret. "

    def posted(path: str) -> list[dict[str, list[str]]]:
        return app.posted(path)

    def got(path: str) -> list[dict[str, Any]]:
        return app.requests_to(path, "GET")

    browser = {"image": "browser", "tools": ("browser",)}
    return [
        Task(
            "legacy_search",
            creds + "Search the invoices for Globex and answer with the amount of its invoice.",
            lambda o: (
                {"user": ["clerk"], "password": ["s3cret"]} in posted("/login")
                and any(r["query"].get("q", [""])[0].lower() == "globex" for r in got("/invoices"))
                and "80.00" in o.answer
            ),
            script=_browse(
                "The Globex invoice is 80.00.",
                *login,
                {"action": "fill", "role": "textbox", "name": "Search", "value": "Globex"},
                {"action": "press", "key": "Enter"},
                {"action": "read", "format": "rows"},
            ),
            **browser,
        ),
        Task(
            "legacy_invoice_update",
            creds + "Open invoice 7. Set Status to Paid, tag it Urgent, tick Approved, set "
            "priority High, attach /workspace/in/receipt.txt, and save.",
            lambda o: (
                any(
                    f.get("status") == ["paid"]
                    and f.get("tags") == ["urgent"]
                    and f.get("approved") == ["yes"]
                    and f.get("priority") == ["high"]
                    for f in posted("/invoice/7")
                )
                and any(
                    r["files"].get("attachment", [""])[0] == "receipt.txt"
                    for r in app.requests_to("/invoice/7", "POST")
                )
            ),
            inputs={"receipt.txt": b"receipt 7\n"},
            script=_browse(
                "Invoice 7 saved.",
                *login,
                {"action": "click", "role": "link", "name": "7"},
                {"action": "select", "ref": _ref("combobox", "Status"), "options": ["Paid"]},
                {"action": "select", "ref": _ref("listbox", "Tags"), "options": ["Urgent"]},
                {"action": "check", "ref": _ref("checkbox", "Approved")},
                {"action": "check", "ref": _ref("radio", "High")},
                {"action": "upload", "selector": "#attachment", "files": ["in/receipt.txt"]},
                {"action": "click", "ref": _ref("button", "Save")},
            ),
            **browser,
        ),
        Task(
            "legacy_delete_confirm",
            creds + "Delete invoice 9 (confirm the deletion when asked).",
            lambda o: len(posted("/invoice/9/delete")) == 1,
            script=_browse(
                "Invoice 9 deleted.",
                *login,
                {"action": "click", "role": "link", "name": "9"},
                {"action": "click", "ref": _ref("button", "Delete invoice")},
                {"action": "dialog", "accept": True},
            ),
            **browser,
        ),
        Task(
            "legacy_export",
            creds + "Download the invoices' CSV export.",
            lambda o: (
                bool(got("/export.csv"))
                and o.artifacts.get("downloads/invoices.csv", b"").decode() == LEGACY_EXPORT
            ),
            script=_browse(
                "Downloaded invoices.csv.",
                *login,
                {"action": "download", "ref": _ref("link", "Export CSV")},
            ),
            **browser,
        ),
        Task(
            "legacy_frames",
            creds + "Open the account frames, confirm the balance, and answer with it.",
            lambda o: len(posted("/frames/confirm")) == 1 and "1234.56" in o.answer,
            script=_browse(
                "The balance is 1234.56 EUR; confirmed.",
                *login,
                {"action": "click", "ref": _ref("link", "Account frames")},
                {"action": "read"},
                {"action": "click", "ref": _ref("button", "Confirm balance")},
            ),
            **browser,
        ),
        Task(
            "legacy_board",
            creds + "On the status board, approve all waiting invoices.",
            lambda o: len(posted("/api/approve")) == 1,
            script=_browse(
                "Approved all.",
                *login,
                {"action": "click", "ref": _ref("link", "Status board")},
                {"action": "wait_for", "role": "button", "name": "Approve all", "timeout": 10},
                {"action": "click", "ref": _ref("button", "Approve all")},
                {"action": "wait_for", "text": "approved"},
            ),
            **browser,
        ),
        Task(
            "legacy_report_tab",
            creds + "Open the quarterly report and answer with the total invoiced.",
            lambda o: bool(got("/report")) and "300" in o.answer,
            script=_browse(
                "The quarter's total is 300.00.",
                *login,
                {"action": "click", "ref": _ref("link", "Quarterly report")},
            ),
            **browser,
        ),
    ]


def _json(o: Outcome, name: str) -> Any:
    try:
        return json.loads(o.artifacts.get(name, b""))
    except ValueError:
        return None


async def define_agent(
    c: httpx.AsyncClient,
    task: Task,
    base_url: str,
    model: str,
    secret: str | None,
    n: int,
    max_steps: int = 12,
) -> str:
    """A published agent for `task` with its own policy; returns its id."""
    policy = {
        "name": f"eval-{n}",
        "image": task.image,
        "egress": {"default": "block", "allow": ["app.eval", "legacy.eval"]},
        "data": {
            "inbound": {"max_bytes": "10MB", "types": ["csv", "txt", "json", "docx"]},
            "outbound": {"max_bytes": "10MB", "types": list(task.out_types)},
        },
    }
    agent = (await c.post("/v1/agents", json={"name": f"eval-{n}-{task.name}"})).json()["id"]
    await c.put(f"/v1/policies/{policy['name']}", json=policy)
    endpoint = {"base_url": base_url, "api_key_secret": secret, "models": [model]}
    (await c.put("/v1/model-endpoints/eval", json=endpoint)).raise_for_status()
    for kind, name in (
        ("policy", policy["name"]),
        ("image", task.image),
        ("model-endpoint", "eval"),
    ):
        await c.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": name})
    definition = {
        "model": {"endpoint": "eval", "name": model, "timeout": "5m"},
        "system_prompt": "You are a precise data assistant. Use the tools; be brief.",
        "tools": list(task.tools),
        "policy": policy["name"],
        "limits": {"max_steps": max_steps, "wall_time": "10m", "tool_timeout": "120s"},
    }
    r = await c.put(f"/v1/agents/{agent}/draft", json=definition)
    r.raise_for_status()
    (await c.post(f"/v1/agents/{agent}/publish")).raise_for_status()
    return str(agent)


async def run_task(c: httpx.AsyncClient, task: Task, agent: str) -> dict[str, Any]:
    """Run `task` on its published agent and judge the outcome."""
    inputs = [
        {"name": k, "content_b64": base64.b64encode(v).decode()} for k, v in task.inputs.items()
    ]
    started = time.monotonic()
    made = await c.post(f"/v1/agents/{agent}/runs", json={"task": task.prompt, "inputs": inputs})
    made.raise_for_status()
    run_id = made.json()["id"]
    finished: dict[str, Any] = {}
    async with c.stream("GET", f"/v1/runs/{run_id}/events") as stream:
        kind = ""
        async for line in stream.aiter_lines():
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and kind == "run.finished":
                finished = json.loads(line[5:])
    wall = time.monotonic() - started
    run = (await c.get(f"/v1/runs/{run_id}")).json()
    artifacts = {}
    for item in (await c.get(f"/v1/runs/{run_id}/artifacts")).json():
        artifacts[item["name"]] = (
            await c.get(f"/v1/runs/{run_id}/artifacts/{item['name']}")
        ).content
    outcome = Outcome(run.get("answer") or "", artifacts)
    ok = run["status"] == "succeeded" and task.check(outcome)
    timing = finished.get("timing") or {}
    return {
        "task": task.name,
        "success": ok,
        "status": run["status"],
        "reason": run.get("reason"),
        "steps": run["steps"],
        "tokens": run["prompt_tokens"] + run["completion_tokens"],
        "wall_seconds": round(wall, 3),
        "model_seconds": timing.get("model_seconds"),
        "tool_seconds": timing.get("tool_seconds"),
        "overhead_ms": timing.get("overhead_ms", []),
    }


@contextlib.asynccontextmanager
async def http_server(app: Any) -> AsyncIterator[str]:
    """`app` served by uvicorn on a free loopback port in this event loop, bound as `aamp up`
    binds (uvicorn opens the socket: asyncio then sets TCP_NODELAY on every connection; on a
    socket made here with proto 0 it does not, and Nagle held each event ~40 ms for the
    client's delayed ACK). Its lifespan is already running; yields the base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if serving.done():
                await serving  # raises why it stopped
                raise RuntimeError("uvicorn stopped before it started")
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


def sse_client(base: str, headers: dict[str, str], agent: str, runs: int) -> list[dict[str, Any]]:
    """A real SSE client (runs in its own thread): `runs` runs one after another. Per run: ms
    from the POST's answer to the first event, and the wall-clock time `run.started` arrived."""
    seen = []
    with httpx.Client(base_url=base, headers=headers, timeout=300) as c:
        for _ in range(runs):
            made = c.post(f"/v1/agents/{agent}/runs", json={"task": "latency probe"})
            posted = time.monotonic()
            made.raise_for_status()
            run_id = made.json()["id"]
            first: float | None = None
            started: float | None = None
            with c.stream("GET", f"/v1/runs/{run_id}/events") as stream:
                for line in stream.iter_lines():
                    if not line.startswith("event:"):
                        continue
                    kind = line.split(":", 1)[1].strip()
                    if first is None:
                        first = time.monotonic()
                    if kind == "run.started":
                        started = time.time()
                    if kind == "run.finished":
                        break
            if first is None or started is None:
                raise RuntimeError(f"run {run_id}: the stream ended without run.started")
            seen.append({"run": run_id, "first_ms": (first - posted) * 1000, "started": started})
    return seen


async def sse_latency(cp: Any, app: Any, agent: str, headers: dict[str, str], runs: int) -> dict:
    """The first-SSE-event figures (see the module docstring), measured over real HTTP."""
    async with http_server(app) as base:
        seen = await asyncio.to_thread(sse_client, base, headers, agent, runs)
    live = []
    for item in seen:
        events = await cp.store.run(cp.runs.runs.events_after, item["run"], 0)
        stored = next(e.at for e in events if e.type == "run.started")
        live.append((item["started"] - parse_time(stored).timestamp()) * 1000)
    first = sorted(item["first_ms"] for item in seen)
    return {
        "sse_runs": len(seen),
        "sse_first_event_ms_p50": round(statistics.median(first), 3),
        "sse_first_event_ms_p95": round(_p95(first), 3),
        "sse_first_event_from": "POST /v1/agents/{id}/runs answered -> client gets run.queued",
        "sse_run_started_ms_p50": round(statistics.median(live), 3),
        "sse_run_started_ms_p95": round(_p95(sorted(live)), 3),
        "sse_run_started_from": "run.started stored (its `at`) -> connected client receives it",
    }


def _p95(ordered: list[float]) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        raise SystemExit("the eval runs real gVisor sandboxes: it needs root and runsc")
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), WebApp)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    sys.path[:0] = [str(REPO / "tests" / "agents"), str(REPO / "tests")]
    from legacy_app import EXPORT_CSV, LegacyAppForTests  # the legacy-style app

    global LEGACY_EXPORT
    LEGACY_EXPORT = EXPORT_CSV
    legacy = LegacyAppForTests("127.0.0.1").__enter__()
    home = Path(tempfile.mkdtemp(prefix="aamp-eval-"))
    images = os.environ.get("AAMP_IMAGE_DIR") or str(REPO / ".aamp" / "images")
    settings = Settings.from_env(
        {
            "AAMP_HOME": str(home),
            "AAMP_RUNTIME_DIR": f"/run/aamp-eval{secrets.token_hex(3)}",
            "AAMP_IMAGE_DIR": images,
            "AAMP_ADMIN_PASSWORD": "eval-admin-password",
        }
    )
    cp, _ = build_control_plane(settings, {"gvisor": GVisorDriver(settings.runtime_dir)})
    cp.manager.resolver = StaticResolver({"app.eval": ["127.0.0.1"], "legacy.eval": ["127.0.0.1"]})
    built = {img.name for img in cp.images.list()}
    app = create_app(cp)
    token = settings.cli_token_path.read_text().strip()
    browsing = legacy_tasks(f"http://legacy.eval:{legacy.port}", legacy)
    chosen = tasks(f"http://app.eval:{web.server_address[1]}") + browsing
    base_url, model = args.base_url, args.model
    scripted = None
    from scripted_model import ScriptedModelServerForTests  # the test double

    if args.scripted_browser or args.scripted_documents:
        played = browsing if args.scripted_browser else document_tasks({"sales.csv": SALES})
        chosen = [t for t in played if not args.tasks or t.name in args.tasks.split(",")]
    elif args.scripted_overhead:
        turns = [{"tool_calls": [{"name": "shell", "arguments": {"command": "true"}}]}] * (
            args.scripted_overhead
        ) + [{"content": "done"}]
        scripted = ScriptedModelServerForTests(turns).__enter__()
        base_url, model = scripted.base_url, "scripted"
        chosen = [Task("scripted_overhead", "overhead", lambda o: True)]
    elif args.tasks:
        wanted = set(args.tasks.split(","))
        chosen = [t for t in chosen if t.name in wanted]
    results = []
    sse: dict[str, Any] = {}
    try:
        async with app.router.lifespan_context(app):
            headers = {"authorization": f"Bearer {token}"}
            secret = None
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://aamp",
                headers=headers,
                timeout=900,
            ) as c:
                if args.api_key_env:
                    secret = "eval_model_key"
                    value = os.environ[args.api_key_env]
                    (await c.put(f"/v1/secrets/{secret}", json={"value": value})).raise_for_status()
                for n, task in enumerate(chosen):
                    if task.image not in built:
                        results.append(
                            {"task": task.name, "skipped": f"image {task.image} not built"}
                        )
                        continue
                    steps = args.scripted_overhead + 1 if scripted else 16
                    if args.scripted_browser or args.scripted_documents:
                        with ScriptedModelServerForTests(task.script) as double:
                            agent = await define_agent(
                                c, task, double.base_url, "scripted", None, n, steps
                            )
                            results.append(await run_task(c, task, agent))
                    else:
                        agent = await define_agent(c, task, base_url, model, secret, n, steps)
                        results.append(await run_task(c, task, agent))
                    print(_row(results[-1]), flush=True)
                if scripted is not None and args.sse_runs > 0:
                    # The script is used up: each of these runs answers at once and ends.
                    probe = Task("sse_latency", "latency probe", lambda o: True)
                    agent = await define_agent(c, probe, base_url, model, None, len(chosen))
                    sse = await sse_latency(cp, app, agent, headers, args.sse_runs)
                    print(_sse_row(sse), flush=True)
    finally:
        if scripted is not None:
            scripted.__exit__(None, None, None)
        cp.store.close()
        web.shutdown()
        legacy.__exit__(None, None, None)
        shutil.rmtree(settings.runtime_dir, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    ran = [r for r in results if "skipped" not in r]
    overheads = sorted(x for r in ran for x in r["overhead_ms"])
    summary = {
        "endpoint": base_url
        if not (scripted or args.scripted_browser or args.scripted_documents)
        else "scripted test double",
        "model": model,
        "tasks": len(ran),
        "succeeded": sum(r["success"] for r in ran),
        "success_rate": round(sum(r["success"] for r in ran) / len(ran), 3) if ran else None,
        "overhead_ms_p50": statistics.median(overheads) if overheads else None,
        "overhead_ms_p95": overheads[int(len(overheads) * 0.95)] if overheads else None,
        **sse,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    return {"summary": summary, "results": results}


def _row(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"{r['task']:<18} skipped: {r['skipped']}"
    p50 = statistics.median(r["overhead_ms"]) if r["overhead_ms"] else float("nan")
    return (
        f"{r['task']:<18} {'ok' if r['success'] else 'FAIL':<5} {r['status']:<10} "
        f"steps {r['steps']:>3}  tokens {r['tokens']:>7}  wall {r['wall_seconds']:>7.1f} s  "
        f"overhead p50 {p50:6.2f} ms/step"
    )


def _sse_row(sse: dict[str, Any]) -> str:
    return (
        f"sse over HTTP, {sse['sse_runs']} runs:\n"
        f"  first event after POST  p50 {sse['sse_first_event_ms_p50']:7.2f} ms  "
        f"p95 {sse['sse_first_event_ms_p95']:7.2f} ms  ({sse['sse_first_event_from']})\n"
        f"  run.started, live       p50 {sse['sse_run_started_ms_p50']:7.2f} ms  "
        f"p95 {sse['sse_run_started_ms_p95']:7.2f} ms  ({sse['sse_run_started_from']})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--base-url", help="the OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1"
    )
    p.add_argument("--model", default="default")
    p.add_argument("--api-key-env", help="environment variable holding the endpoint's API key")
    p.add_argument("--tasks", help="comma-separated task names (default: all)")
    p.add_argument("--scripted-overhead", type=int, metavar="N", default=0)
    p.add_argument(
        "--scripted-browser",
        action="store_true",
        help="the legacy_* browser tasks, each played by the scripted model double",
    )
    p.add_argument(
        "--scripted-documents",
        action="store_true",
        help="the docs-image tasks (XLSX, PDF report, DOCX letter), played by the scripted double",
    )
    p.add_argument(
        "--sse-runs",
        type=int,
        default=10,
        metavar="K",
        help="with --scripted-overhead: runs for the first-SSE-event latency (0: skip)",
    )
    p.add_argument("--json", type=Path, default=RESULTS)
    args = p.parse_args()
    scripted = args.scripted_overhead or args.scripted_browser or args.scripted_documents
    if not args.base_url and not scripted:
        p.error(
            "--base-url is required (or --scripted-overhead N, --scripted-browser or "
            "--scripted-documents)"
        )
    report = asyncio.run(main_async(args))
    print(json.dumps(report["summary"], indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
