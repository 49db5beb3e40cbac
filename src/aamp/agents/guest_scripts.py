"""Small Python programs the tools run inside the guest (standard library + playwright only).

Each reads one JSON request on stdin and prints one JSON answer on stdout; the host parses
that answer as untrusted data (`answer`). They are sent with each call (`python3 -c`), so the
guest image needs nothing of aamp beyond its guest agent.
"""

from __future__ import annotations

import json
from typing import Any


def answer(stdout: bytes) -> dict[str, Any] | None:
    """A script's answer: the JSON object on the last line of its output, or None (anything
    else — no output, not JSON, not an object — is no answer)."""
    try:
        value = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    except (ValueError, IndexError):
        return None
    return value if isinstance(value, dict) else None


# The browser lives across tool calls: the first call starts chromium (in its own session so
# that it outlives the exec) with a DevTools port on the guest's loopback and the egress proxy
# as its only way out; every call attaches playwright to it over CDP and uses its one page.
BROWSER = r"""
import base64, json, os, subprocess, sys, time, urllib.request
req = json.load(sys.stdin)
CDP = "http://127.0.0.1:9222"
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def up():
    try:
        direct.open(CDP + "/json/version", timeout=1).read()
        return True
    except Exception:
        return False
if not up():
    log = open("/tmp/aamp-chromium.log", "ab")
    subprocess.Popen(
        ["/usr/bin/chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
         "--no-first-run", "--disable-sync", "--disable-background-networking",
         "--disable-component-update", "--disable-dev-shm-usage",
         "--proxy-server=http://127.0.0.1:3128", "--remote-debugging-address=127.0.0.1",
         "--remote-debugging-port=9222", "--user-data-dir=/tmp/aamp-chromium",
         "--window-size=1280,800", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.time() + 60
    while not up():
        if time.time() > deadline:
            print(json.dumps({"error": "chromium did not start"})); sys.exit(0)
        time.sleep(0.2)
from playwright.sync_api import sync_playwright, Error as PwError
out = {}
with sync_playwright() as p:
    browser = p.chromium.connect_over_cdp(CDP)
    ctx = browser.contexts[0] if browser.contexts else browser.new_context()
    page = ctx.pages[0] if ctx.pages else ctx.new_page()
    page.set_default_timeout(req.get("timeout_ms", 30000))
    def target():
        if req.get("selector"):
            return page.locator(req["selector"]).first
        return page.get_by_text(req["text"], exact=False).first
    try:
        a = req["action"]
        if a == "open":
            r = page.goto(req["url"], wait_until="load")
            out["status"] = r.status if r else None
        elif a == "click":
            target().click()
            page.wait_for_load_state("load")
        elif a == "fill":
            target().fill(req["value"])
        elif a == "screenshot":
            out["png_b64"] = base64.b64encode(page.screenshot()).decode()
        out["url"] = page.url
        out["title"] = page.title()
        if a in ("open", "read", "click"):
            out["text"] = page.inner_text("body")
    except PwError as e:
        out["error"] = str(e).splitlines()[0][:2000]
        out["url"] = page.url
print(json.dumps(out))
"""

# A call to a granted service: through the egress proxy (from the environment), which adds the
# credential host-side; the answer's status, a few headers and the body come back.
SERVICE = r"""
import json, sys, urllib.request, urllib.error
req = json.load(sys.stdin)
r = urllib.request.Request(req["url"], method=req["method"],
    data=req["body"].encode() if req.get("body") is not None else None,
    headers=req.get("headers") or {})
try:
    with urllib.request.urlopen(r, timeout=req["timeout"]) as resp:
        status, headers, body = resp.status, resp.headers, resp.read(2_000_000)
except urllib.error.HTTPError as e:
    status, headers, body = e.code, e.headers, e.read(2_000_000)
except Exception as e:
    print(json.dumps({"error": repr(e)})); sys.exit(0)
print(json.dumps({"status": status,
    "content_type": headers.get("Content-Type"),
    "egress_rule": headers.get("X-Aamp-Egress-Rule"),
    "body": body.decode("utf-8", "replace")}))
"""

# Lists a directory under /workspace (recursively, at most 1000 entries).
LIST = r"""
import json, os, sys
root = sys.argv[1]
out = []
for d, dirs, files in os.walk(root):
    dirs.sort()
    for f in sorted(files):
        full = os.path.join(d, f)
        try:
            out.append([os.path.relpath(full, "/workspace"), os.path.getsize(full)])
        except OSError:
            pass
        if len(out) >= 1000:
            break
print(json.dumps({"entries": out}))
"""
