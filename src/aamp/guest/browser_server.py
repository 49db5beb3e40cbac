"""The browser driver: the one process per sandbox that keeps chromium and Playwright alive
across the agent's browser calls, so that an action costs the action and not a start.

Started by the guest agent on the first browser request (`aamp.guest.browser_relay`), it
listens on a Unix socket at once and starts the browser meanwhile. Each connection carries
one request (a CONTROL frame: the JSON the host's browser tool sent) and gets one answer back
(its JSON as DATA frames, then EOF). Requests run one at a time, in arrival order, each
bounded by its own timeout. When the browser is gone (chromium crashed, or never started),
the request that notices is answered with the reason and the driver exits; the agent starts
a fresh one for the next request.

    python3 -I -c "...; from aamp.guest.browser_server import main" LIB SOCKET WORKSPACE GEN

Runs inside the guest (with Playwright from the browser image); never imports the host side.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys

from aamp.guest import wire
from aamp.guest.browser_session import BrowserSession

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# A request's own timeout bounds its action; this is the most its answer may take beyond it
# (the snapshot after the action, the title, the tabs).
ANSWER_GRACE = 20.0


async def _answer(
    session: BrowserSession, starting: asyncio.Future[None], request: object, fresh: dict
) -> dict[str, Any]:
    if not isinstance(request, dict):
        return {"ok": False, "error_kind": "bad_request", "error": "bad browser request"}
    try:
        await starting
    except Exception as exc:
        session.gone = f"the browser could not start: {exc}"
        return {"ok": False, "error_kind": "browser_gone", "error": session.gone}
    timeout = request.get("timeout")
    limit = (timeout if isinstance(timeout, (int, float)) else 0) + ANSWER_GRACE
    try:
        answer = await asyncio.wait_for(session.handle(request), limit)
    except TimeoutError:
        session.gone = "the browser stopped answering; the next call starts a new one"
        return {"ok": False, "error_kind": "browser_gone", "error": session.gone}
    if fresh:
        answer.update(fresh)
        fresh.clear()
    return answer


async def serve(socket_path: str, workspace: str, generation: int) -> None:
    home = os.path.dirname(socket_path)
    session = BrowserSession(workspace, home)
    starting = asyncio.ensure_future(session.start())
    turn = asyncio.Lock()
    done = asyncio.Event()
    # The first answer says this is a new browser (and, after a restart, that one was lost).
    fresh: dict[str, Any] = {"browser_started": True, "generation": generation}

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                ftype, payload = await wire.read_frame(reader, max_control=wire.MAX_PAYLOAD)
                request = wire.decode_control(payload) if ftype == wire.CONTROL else None
            except (wire.ProtocolError, EOFError, OSError):
                return
            async with turn:
                answer = await _answer(session, starting, request, fresh)
            data = json.dumps(answer, allow_nan=False, default=str).encode()
            for start in range(0, len(data), wire.DATA_CHUNK):
                wire.write_frame(writer, wire.DATA, data[start : start + wire.DATA_CHUNK])
                await writer.drain()
            wire.write_frame(writer, wire.EOF)
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the agent gave up on this request; the next one is served as usual
        finally:
            writer.close()
            if session.gone:
                done.set()

    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)  # a socket left by a driver that died
    server = await asyncio.start_unix_server(on_connection, path=socket_path)
    os.chmod(socket_path, 0o600)
    try:
        await done.wait()
    finally:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        await session.close()


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[2].isdigit():
        print("usage: browser_server SOCKET WORKSPACE GENERATION", file=sys.stderr)
        return 2
    asyncio.run(serve(argv[0], argv[1], int(argv[2])))
    return 0
