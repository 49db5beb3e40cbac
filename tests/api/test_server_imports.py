"""`aamp up` loads what it needs to serve its first request and no more: the SDKs only a run's
model call uses are imported when a run makes that call, not at every control plane's start
(the suite starts dozens of planes; each import is paid by every one of them). Likewise a
command that reads the store without migrating it (`aamp audit verify|export`) does not load
the migration tool."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Imported by `aamp up` (aamp.cli.local.up -> aamp.server.serve) before it answers.
SERVER_MODULES = ("aamp.server", "aamp.web", "aamp.mcp")
# Packages the server side uses only later, inside the code that needs them.
LATER = ("openai",)


# What `aamp audit verify|export` imports (aamp.cli.local's `audit`), and what it must not.
AUDIT_READ_MODULES = ("aamp.cli.local", "aamp.audit", "aamp.store")
MIGRATION_TOOL = ("alembic", "mako")


def _loaded(modules: tuple[str, ...], unwanted: tuple[str, ...]) -> list[str]:
    """Which of `unwanted` a fresh interpreter has loaded after importing `modules`."""
    probe = (
        "import json, sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + f"print(json.dumps([p for p in {unwanted!r} if p in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=os.environ, check=True
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_the_server_start_up_does_not_import_the_model_sdk() -> None:
    assert _loaded(SERVER_MODULES, LATER) == []


def test_reading_the_store_without_migrating_it_does_not_import_alembic() -> None:
    assert _loaded(AUDIT_READ_MODULES, MIGRATION_TOOL) == []


def test_the_model_client_still_finds_the_sdk_when_it_is_used() -> None:
    from aamp.agents import model

    assert [c.__name__ for c in model._retried()] == [
        "APIConnectionError",
        "RateLimitError",
        "InternalServerError",
    ]
