"""`LegacyAppForTests`: a legacy-style back-office web app, for the browser tool's tests and the
agent eval (benchmarks/agent_eval.py). A real HTTP server (standard library) that records
everything it receives, so a test checks what the app got, not what the model said.

What it has, the way old intranet apps have it: a login form with a session cookie; an invoice
table with a search box that submits on Enter; a detail form with every field type (text,
number, date, e-mail, drop-down, multi-select, text area, checkboxes, radio buttons, a file
field, a hidden field) posted as multipart; a Delete button guarded by `confirm()`; a customer
field that suggests as you type (key by key); a menu that appears on hover; a note asked for
with `prompt()`; a report that opens
in a new tab and pulls a tracker image and a script from hosts outside any policy; a CSV export
(Content-Disposition: attachment); a frameset; a page with an iframe holding a form; a board
rendered by JavaScript after a delay; a long list that loads more rows when scrolled to its end.

    with LegacyAppForTests(host="127.0.0.10", port=80) as app:
        ...                               # browse http://legacy.test/
        app.received                      # [{"method", "path", "query", "form", "files"}]
        app.posted("/invoice/7")          # the form fields of every POST to that path
"""

from __future__ import annotations

import email.parser
import email.policy
import html
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

USER, PASSWORD = "clerk", "s3cret"
INVOICES = [
    {"no": 7, "customer": "Acme Corp", "amount": "120.00", "status": "open"},
    {"no": 8, "customer": "Globex", "amount": "80.00", "status": "paid"},
    {"no": 9, "customer": "Initech", "amount": "42.50", "status": "open"},
    {"no": 10, "customer": "Acme Corp", "amount": "57.50", "status": "disputed"},
]
EXPORT_CSV = "no,customer,amount,status\n" + "".join(
    f"{i['no']},{i['customer']},{i['amount']},{i['status']}\n" for i in INVOICES
)
CUSTOMERS = ["Acme Corp", "Acme Logistics", "Globex", "Initech"]
# Hosts the pages pull from that no policy of the tests allows.
TRACKER = "http://tracker.test/pixel.gif"
BLOCKED_SCRIPT = "https://cdn.blocked.test/lib.js"


def _page(title: str, body: str, head: str = "") -> bytes:
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"{head}</head><body>{body}</body></html>"
    ).encode()


LOGIN = """<h1>Please log in</h1>{error}
<form method="post" action="/login">
<p><label for="user">User name</label> <input id="user" name="user"></p>
<p><label>Password <input type="password" name="password"></label></p>
<p><button type="submit">Log in</button></p></form>"""

DETAIL = """<h1>Invoice {no}</h1>
<form method="post" action="/invoice/{no}" enctype="multipart/form-data">
<input type="hidden" name="csrf" value="{token}">
<table>
<tr><td><label for="customer">Customer</label></td>
    <td><input id="customer" name="customer" value="{customer}"></td></tr>
<tr><td><label for="amount">Amount</label></td>
    <td><input id="amount" type="number" step="0.01" name="amount" value="{amount}"></td></tr>
<tr><td><label for="due">Due date</label></td><td><input id="due" type="date" name="due"></td></tr>
<tr><td><label for="email">Contact e-mail</label></td>
    <td><input id="email" type="email" name="email"></td></tr>
<tr><td><label for="status">Status</label></td><td><select id="status" name="status">
  <option value="open">Open</option><option value="paid">Paid</option>
  <option value="disputed">Disputed</option></select></td></tr>
<tr><td><label for="tags">Tags</label></td><td><select id="tags" name="tags" multiple>
  <option value="urgent">Urgent</option><option value="export">Export</option>
  <option value="q3">Q3</option></select></td></tr>
<tr><td><label for="notes">Notes</label></td>
    <td><textarea id="notes" name="notes"></textarea></td></tr>
<tr><td>Flags</td><td><label><input type="checkbox" name="approved" value="yes"> Approved</label>
  <label><input type="checkbox" name="reminder" value="yes" checked> Send reminder</label></td></tr>
<tr><td>Priority</td><td>
  <label><input type="radio" name="priority" value="low"> Low</label>
  <label><input type="radio" name="priority" value="normal" checked> Normal</label>
  <label><input type="radio" name="priority" value="high"> High</label></td></tr>
<tr><td><label for="attachment">Attachment</label></td>
    <td><input id="attachment" type="file" name="attachment"></td></tr>
<tr><td><label for="code">Customer code</label></td>
    <td><input id="code" name="code" autocomplete="off"><ul id="suggestions"></ul></td></tr>
</table>
<p><button type="submit">Save</button></p></form>
<form method="post" action="/invoice/{no}/delete"
      onsubmit="return confirm('Delete invoice {no}? This cannot be undone.')">
<button type="submit">Delete invoice</button></form>
<script>
document.getElementById("code").addEventListener("keyup", function () {{
  fetch("/api/suggest?q=" + encodeURIComponent(this.value)).then(r => r.json()).then(list => {{
    const ul = document.getElementById("suggestions");
    ul.innerHTML = "";
    for (const name of list) {{ const li = document.createElement("li"); li.textContent = name;
      ul.appendChild(li); }}
  }});
}});
</script>"""

INVOICES_PAGE = """<h1>Invoices</h1><p>Signed in as {user}. Session mark {token}.</p>
<form method="get" action="/invoices"><label>Search <input name="q" value="{q}"></label></form>
<table id="invoices"><caption>Open items</caption>
<thead><tr><th>No</th><th>Customer</th><th>Amount</th><th>Status</th></tr></thead>
<tbody>{rows}</tbody></table>
<p><a href="/export.csv">Export CSV</a> · <a href="/report" target="_blank">Quarterly report</a>
 · <a href="/frames">Account frames</a> · <a href="/inbox">Messages</a>
 · <a href="/board">Status board</a> · <a href="/long">All items</a></p>
<style>#menu .items {{ display: none; }} #menu:hover .items {{ display: block; }}</style>
<div id="menu"><span>Bulk actions</span>
  <div class="items"><a href="/archive?status=paid">Archive paid invoices</a></div></div>
<p><button id="note" onclick="const n = prompt('Note for this list?', 'none');
  if (n !== null) fetch('/api/note?text=' + encodeURIComponent(n));">Add note</button></p>"""

BOARD = """<h1>Status board</h1><div id="board">Loading…</div>
<script>
setTimeout(function () {
  fetch("/api/board").then(r => r.json()).then(data => {
    const board = document.getElementById("board");
    board.innerHTML = "<p>" + data.waiting + " invoices waiting for approval</p>";
    const button = document.createElement("button");
    button.textContent = "Approve all";
    button.onclick = function () {
      fetch("/api/approve", {method: "POST", body: "all"}).then(r => r.text()).then(t => {
        board.innerHTML = "<p id='done'>" + t + "</p>";
      });
    };
    board.appendChild(button);
  });
}, 1500);
</script>"""

LONG = """<h1>All items</h1><ol id="items">{rows}</ol><p id="end">Loading more…</p>
<script>
let loaded = false;
window.addEventListener("scroll", function () {{
  if (loaded || window.innerHeight + window.scrollY < document.body.scrollHeight - 50) return;
  loaded = true;
  fetch("/api/more").then(r => r.json()).then(items => {{
    const ol = document.getElementById("items");
    for (const item of items) {{ const li = document.createElement("li"); li.textContent = item;
      ol.appendChild(li); }}
    document.getElementById("end").textContent = "All items loaded";
  }});
}});
</script>"""


class LegacyAppForTests:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.received: list[dict[str, Any]] = []
        self.token = secrets.token_hex(6)  # shown on pages: a read of them must contain it
        self._sessions: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def __enter__(self) -> LegacyAppForTests:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def requests_to(self, path: str, method: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                r
                for r in self.received
                if r["path"] == path and (method is None or r["method"] == method)
            ]

    def posted(self, path: str) -> list[dict[str, Any]]:
        return [r["form"] for r in self.requests_to(path, "POST")]

    def _record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.received.append(entry)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        app = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._serve("GET", b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._serve("POST", self.rfile.read(length))

            def _serve(self, method: str, body: bytes) -> None:
                parts = urlsplit(self.path)
                form, files = _form(self.headers.get("Content-Type", ""), body)
                app._record(
                    {
                        "method": method,
                        "path": parts.path,
                        "query": parse_qs(parts.query),
                        "form": form,
                        "files": files,
                        "signed_in": self._session() is not None,
                    }
                )
                route = _ROUTES.get((method, parts.path))
                if route is None and not parts.path.startswith("/invoice"):
                    self._send(404, _page("Not found", "<h1>Not found</h1>"))
                    return
                if parts.path not in ("/login", "/") and self._session() is None:
                    self._redirect("/login")
                    return
                if route is None:
                    route = _invoice_route(method, parts.path)
                route(self, app, parse_qs(parts.query), form, files)

            def _session(self) -> str | None:
                for part in (self.headers.get("Cookie") or "").split(";"):
                    name, _, value = part.strip().partition("=")
                    if name == "sid" and value in app._sessions:
                        return value
                return None

            def _send(
                self,
                status: int,
                body: bytes,
                kind: str = "text/html; charset=utf-8",
                headers: dict[str, str] | None = None,
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def _redirect(self, to: str, headers: dict[str, str] | None = None) -> None:
                self.send_response(303)
                self.send_header("Location", to)
                self.send_header("Content-Length", "0")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def _form(content_type: str, body: bytes) -> tuple[dict[str, list[str]], dict[str, list[Any]]]:
    """Fields (name -> values) and files (name -> [filename, text]) of a request body."""
    if content_type.startswith("application/x-www-form-urlencoded"):
        return parse_qs(body.decode(), keep_blank_values=True), {}
    if not content_type.startswith("multipart/form-data"):
        return ({"_body": [body.decode("utf-8", "replace")]} if body else {}), {}
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    fields: dict[str, list[str]] = {}
    files: dict[str, list[Any]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        filename = part.get_filename()
        data = part.get_payload(decode=True) or b""
        if filename is not None:
            files[name] = [filename, data.decode("utf-8", "replace")]
        else:
            fields.setdefault(name, []).append(data.decode("utf-8", "replace"))
    return fields, files


def _login(h: Any, app: LegacyAppForTests, query: dict, form: dict, files: dict) -> None:
    if h.command == "POST":
        if form.get("user") == [USER] and form.get("password") == [PASSWORD]:
            sid = secrets.token_hex(16)
            app._sessions.add(sid)
            h._redirect("/invoices", {"Set-Cookie": f"sid={sid}; Path=/; HttpOnly"})
            return
        error = "<p class='error'>Wrong user name or password.</p>"
    else:
        error = ""
    h._send(200, _page("Log in", LOGIN.format(error=error)))


def _invoices(h: Any, app: LegacyAppForTests, query: dict, form: dict, files: dict) -> None:
    q = (query.get("q") or [""])[0]
    rows = "".join(
        f"<tr><td><a href='/invoice?id={i['no']}'>{i['no']}</a></td><td>{i['customer']}</td>"
        f"<td>{i['amount']}</td><td>{i['status']}</td></tr>"
        for i in INVOICES
        if q.lower() in i["customer"].lower()
    )
    body = INVOICES_PAGE.format(user=USER, token=app.token, q=html.escape(q), rows=rows)
    h._send(200, _page("Invoices", body))


def _invoice_route(method: str, path: str) -> Any:
    def route(h: Any, app: LegacyAppForTests, query: dict, form: dict, files: dict) -> None:
        if method == "GET" and path == "/invoice":
            number = (query.get("id") or [""])[0]
            found = [i for i in INVOICES if str(i["no"]) == number]
            if not found:
                h._send(404, _page("No invoice", "<h1>No such invoice</h1>"))
                return
            page = DETAIL.format(token=app.token, **found[0])
            h._send(200, _page(f"Invoice {number}", page))
        elif method == "POST" and path.endswith("/delete"):
            h._send(200, _page("Deleted", f"<h1>Invoice {path.split('/')[2]} deleted</h1>"))
        elif method == "POST":
            saved = ", ".join(f"{k}={'|'.join(v)}" for k, v in sorted(form.items()))
            attached = "".join(f"; {k}: {v[0]}" for k, v in files.items() if v[0])
            h._send(200, _page("Saved", f"<h1>Invoice saved</h1><p>{html.escape(saved)}"
                                        f"{html.escape(attached)}</p>"))  # fmt: skip
        else:
            h._send(404, _page("Not found", "<h1>Not found</h1>"))

    return route


def _export(h: Any, app: LegacyAppForTests, query: dict, form: dict, files: dict) -> None:
    h._send(
        200,
        EXPORT_CSV.encode(),
        "text/csv",
        {"Content-Disposition": 'attachment; filename="invoices.csv"'},
    )


def _report(h: Any, app: LegacyAppForTests, query: dict, form: dict, files: dict) -> None:
    body = (
        f"<h1>Quarterly report</h1><p>Total invoiced this quarter: 300.00 ({app.token})</p>"
        f"<img src='{TRACKER}' alt='tracker'><script src='{BLOCKED_SCRIPT}'></script>"
    )
    h._send(200, _page("Quarterly report", body))


def _frames(h: Any, app: LegacyAppForTests, query: dict, form: dict, files: dict) -> None:
    h._send(
        200,
        b"<!DOCTYPE html><html><head><title>Accounts</title></head>"
        b"<frameset cols='25%,75%'><frame name='menu' src='/frames/menu'>"
        b"<frame name='main' src='/frames/balance'></frameset></html>",
    )


def _api_suggest(h: Any, app: LegacyAppForTests, query: dict, form: dict, files: dict) -> None:
    q = (query.get("q") or [""])[0].lower()
    found = [c for c in CUSTOMERS if q and c.lower().startswith(q)]
    h._send(200, json.dumps(found).encode(), "application/json")


def _long(h: Any, app: LegacyAppForTests, query: dict, form: dict, files: dict) -> None:
    rows = "".join(f"<li>Item {n}</li>" for n in range(1, 61))
    h._send(200, _page("All items", LONG.format(rows=rows)))


def _archive(h: Any, app: LegacyAppForTests, query: dict, form: dict, files: dict) -> None:
    status = (query.get("status") or [""])[0]
    h._send(200, _page("Archived", f"<h1>Archived all {html.escape(status)} invoices</h1>"))


def _root(h: Any, app: LegacyAppForTests, query: dict, form: dict, files: dict) -> None:
    h._redirect("/login")


def _static(title: str, body: str, kind: str = "") -> Any:
    """A route that always answers the same: an HTML page, or (with `kind`) `body` as is."""
    data = body.encode() if kind else _page(title, body)

    def route(h: Any, app: LegacyAppForTests, query: dict, form: dict, files: dict) -> None:
        h._send(200, data, kind or "text/html; charset=utf-8")

    return route


_STATIC = {
    ("GET", "/frames/menu"): _static(
        "Menu",
        "<p><a href='/frames/balance' target='main'>Balance</a></p>"
        "<p><a href='/frames/statements' target='main'>Statements</a></p>",
    ),
    ("GET", "/frames/balance"): _static(
        "Balance",
        "<h2>Balance</h2><p>Account balance: 1234.56 EUR</p>"
        "<form method='post' action='/frames/confirm'><button>Confirm balance</button></form>",
    ),
    ("GET", "/frames/statements"): _static(
        "Statements", "<h2>Statements</h2><p>March statement: 3 items</p>"
    ),
    ("POST", "/frames/confirm"): _static("Confirmed", "<h2>Balance confirmed</h2>"),
    ("GET", "/inbox"): _static(
        "Messages",
        "<h1>Messages</h1><p>1 unread message</p>"
        "<iframe name='thread' src='/inbox/thread' width='600' height='300'></iframe>",
    ),
    ("GET", "/inbox/thread"): _static(
        "Thread",
        "<p>From Acme Corp: please send invoice 7 again.</p>"
        "<form method='post' action='/inbox/reply'><label>Reply <textarea name='reply'>"
        "</textarea></label><button>Send reply</button></form>",
    ),
    ("POST", "/inbox/reply"): _static("Sent", "<p>Reply sent</p>"),
    ("GET", "/board"): _static("Status board", BOARD),
    ("GET", "/api/board"): _static("", json.dumps({"waiting": 3}), "application/json"),
    ("GET", "/api/note"): _static("", "noted", "text/plain"),
    ("POST", "/api/approve"): _static("", "3 invoices approved", "text/plain"),
    ("GET", "/api/more"): _static(
        "", json.dumps([f"Item {n}" for n in range(61, 71)]), "application/json"
    ),
}


_ROUTES = {
    ("GET", "/"): _root,
    ("GET", "/login"): _login,
    ("POST", "/login"): _login,
    ("GET", "/invoices"): _invoices,
    ("GET", "/export.csv"): _export,
    ("GET", "/report"): _report,
    ("GET", "/frames"): _frames,
    ("GET", "/api/suggest"): _api_suggest,
    ("GET", "/long"): _long,
    ("GET", "/archive"): _archive,
    **_STATIC,
}
