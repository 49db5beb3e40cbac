"""Small Python programs the tools run inside the guest (standard library only).

Each reads one JSON request on stdin and prints one JSON answer on stdout; the host parses
that answer as untrusted data (`answer`). They are sent with each call (`python3 -c`), so the
guest image needs nothing of aamp beyond its guest agent. (The browser is not one of them: it
stays alive across calls in the guest's browser driver, `aamp.guest.browser_server`.)
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

# Lists directories under /workspace (recursively, at most 1000 entries in all).
LIST = r"""
import json, os, sys
out = []
for root in sys.argv[1:]:
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            if len(out) >= 1000:
                break
            full = os.path.join(d, f)
            try:
                out.append([os.path.relpath(full, "/workspace"), os.path.getsize(full)])
            except OSError:
                pass
print(json.dumps({"entries": out}))
"""
