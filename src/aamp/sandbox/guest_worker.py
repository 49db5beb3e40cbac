"""Running one of the guest's JSON workers in a sandbox: `aamp.guest.<module>` (baked into the
image under /opt/aamp/lib) started with the isolated interpreter, one JSON request on stdin,
its answer on stdout, capped at `max_answer` bytes. The answer is the guest's word: callers
check every field of it."""

from __future__ import annotations

import json
from typing import Any

from aamp.sandbox.channel.guest_channel import GuestChannel

GUEST_LIB = "/opt/aamp/lib"


def _boot(module: str) -> str:
    return (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        f"from aamp.guest.{module} import main; raise SystemExit(main(sys.argv[2:]))"
    )


def worker_argv(module: str, *args: str) -> list[str]:
    """The command that starts worker `module` in a sandbox, with `args` for its `main`."""
    return ["python3", "-I", "-c", _boot(module), GUEST_LIB, *args]


async def run_worker(
    channel: GuestChannel, module: str, request: dict[str, Any], timeout: float, max_answer: int
) -> tuple[Any, bytes, bytes]:
    """The worker's exit result, stdout and stderr, as `GuestChannel.run` gives them."""
    return await channel.run(
        worker_argv(module),
        cwd="/workspace",
        stdin=json.dumps(request).encode(),
        timeout=timeout,
        max_output=max_answer,
    )
