"""`aamp up` loads what it needs to serve its first request and no more: the SDKs only a run's
model call uses are imported when a run makes that call, not at every control plane's start
(the suite starts dozens of planes; each import is paid by every one of them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Imported by `aamp up` (aamp.cli.local.up -> aamp.server.serve) before it answers.
SERVER_MODULES = ("aamp.server", "aamp.web", "aamp.mcp")
# Packages the server side uses only later, inside the code that needs them.
LATER = ("openai",)


def test_the_server_start_up_does_not_import_the_model_sdk() -> None:
    probe = (
        "import json, sys\n"
        + "".join(f"import {m}\n" for m in SERVER_MODULES)
        + f"print(json.dumps([p for p in {LATER!r} if p in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=os.environ, check=True
    )
    assert json.loads(out.stdout) == [], f"loaded at start-up: {out.stdout}"


def test_the_model_client_still_finds_the_sdk_when_it_is_used() -> None:
    from aamp.agents import model

    assert [c.__name__ for c in model._retried()] == [
        "APIConnectionError",
        "RateLimitError",
        "InternalServerError",
    ]
