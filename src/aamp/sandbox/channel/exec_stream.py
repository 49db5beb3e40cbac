"""A running command as the NDJSON lines the API's exec route and the host link stream: each
output chunk a line (`stream`, `data` in base64), then the result — or the guest's timeout as
an error line — last.

Usage::

    async with manager.use(sandbox_id) as channel:
        session = await channel.exec(argv, timeout=30)
        return StreamingResponse(exec_lines(session), media_type="application/x-ndjson")
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from aamp.sandbox.channel.errors import GuestTimeout
from aamp.sandbox.channel.guest_channel import Session

RESULT_FIELDS = ("exit_code", "signal", "timed_out", "duration")


def ndjson(obj: dict[str, object]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


async def exec_lines(
    session: Session, ended: Callable[[dict[str, object]], Awaitable[None]] | None = None
) -> AsyncIterator[bytes]:
    """`session`'s output and end as lines; `ended` is given the last one before it is sent
    (the API records it), a timeout's being `{"error": "guest_timeout", "message": ...}`."""
    async with session:
        try:
            async for out in session:
                yield ndjson({"stream": out.stream, "data": base64.b64encode(out.data).decode()})
        except GuestTimeout as exc:
            last: dict[str, object] = {"error": "guest_timeout", "message": str(exc)}
        else:
            result = session.result
            assert result is not None
            last = {name: getattr(result, name) for name in RESULT_FIELDS}
        if ended is not None:
            await ended(last)
        yield ndjson(last)
