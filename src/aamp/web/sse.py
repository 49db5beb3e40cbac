"""Relaying one of the API's event streams to the browser as HTML: each API event (JSON) is
turned into HTML fragments, sent as server-sent events that htmx's SSE extension swaps into
the page as they arrive. A reconnecting browser's `Last-Event-ID` is passed to the API, so
nothing is shown twice or lost; the API's side of the stream is closed when the browser goes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import Response, StreamingResponse

from aamp.web.page import Page

# An API event (`event`, `id` and its decoded `data`) -> the SSE messages to send for it.
Translate = Callable[[str, Any, str | None], Awaitable[list[bytes]]]


def sse(event: str, html: str, event_id: str | None = None) -> bytes:
    lines = [f"id: {event_id}"] if event_id else []
    lines.append(f"event: {event}")
    lines += [f"data: {line}" for line in html.splitlines() or [""]]
    return ("\n".join(lines) + "\n\n").encode()


def take_events(buffer: bytearray) -> list[dict[str, str]]:
    """Whole SSE events taken off the front of `buffer` (comments kept as `comment`)."""
    out = []
    while (end := buffer.find(b"\n\n")) >= 0:
        block = bytes(buffer[:end]).decode("utf-8", "replace")
        del buffer[: end + 2]
        item: dict[str, str] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                item["comment"] = line
            key, _, value = line.partition(": ")
            if key in ("id", "event", "data"):
                item[key] = item.get(key, "") + value
        out.append(item)
    return out


async def relay(page: Page, api_path: str, translate: Translate) -> Response:
    """The API's event stream at `api_path`, as this person, each event translated to HTML
    messages; the API's refusal (or 404) is the answer's status."""
    request = page.request
    headers = {}
    if last := request.headers.get("last-event-id", ""):
        headers["last-event-id"] = last[:20]
    streamed = await page.backend.stream(request, "GET", api_path, headers=headers)
    if not streamed.answer.ok:
        await streamed.close()
        return Response(status_code=streamed.answer.status)

    async def messages() -> AsyncIterator[bytes]:
        buffer = bytearray()
        try:
            async for chunk in streamed.chunks:
                buffer += chunk
                for event in take_events(buffer):
                    if "event" not in event:
                        yield b": keep-alive\n\n"
                        continue
                    data = json.loads(event.get("data") or "{}")
                    for message in await translate(event["event"], data, event.get("id")):
                        yield message
        finally:
            await streamed.close()

    return StreamingResponse(
        messages(),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )
