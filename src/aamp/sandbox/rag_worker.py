"""The host's side of the knowledge-base worker (`aamp.guest.rag`, in the rag image): one
request in, one answer out, and the check an index file passes before the host keeps it.

The answer and the index file come from a sandbox that parsed untrusted documents, so both
are untrusted: the answer is size-capped and must be a JSON object; an index file is never
opened on the host (no SQLite library of the host ever reads it — it is only ever opened
inside sandboxes), so what can be checked here is checked on its bytes: its size is within
bounds, and its header is SQLite's with a sane page size that divides the file.
"""

from __future__ import annotations

import json
from typing import Any

from aamp.sandbox.channel.guest_channel import GuestChannel
from aamp.sandbox.guest_worker import run_worker

MAX_ANSWER = 4_000_000
MAX_INDEX_BYTES = 2 * 2**30
_SQLITE_MAGIC = b"SQLite format 3\x00"


class WorkerFailed(RuntimeError):
    """The worker gave no usable answer (it timed out, was killed, or wrote garbage)."""


async def call(channel: GuestChannel, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one worker request in the sandbox; its JSON answer (untrusted: check each field)."""
    result, out, err = await run_worker(channel, "rag", request, timeout, MAX_ANSWER)
    if result.timed_out:
        raise WorkerFailed(f"the knowledge-base worker took longer than {timeout:g} s")
    lines = out.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        why = err.decode("utf-8", "replace")[-1000:] or f"exit code {result.exit_code}"
        if result.signal:
            why = f"killed by signal {result.signal} (a sandbox limit?)"
        raise WorkerFailed(f"the knowledge-base worker gave no answer: {why}")
    return answer


class BadIndex(ValueError):
    """An index file that is not kept: the message says which check it failed."""


def check_index_header(head: bytes, size: int, max_bytes: int = MAX_INDEX_BYTES) -> None:
    """Refuse an index file by its size and its first 100 bytes (SQLite's header): the magic
    string, a power-of-two page size of 512..65536 that divides the file, and a page count
    that agrees with the size. Nothing else of the file is read on the host."""
    if not 0 < size <= max_bytes:
        raise BadIndex(f"the index is {size} bytes; an index is 1 to {max_bytes} bytes")
    if len(head) < 100 or head[:16] != _SQLITE_MAGIC:
        raise BadIndex("the index is not an SQLite database (bad header)")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1) or size % page_size:
        raise BadIndex(f"the index's page size {page_size} does not fit its {size} bytes")
    pages = int.from_bytes(head[28:32], "big")
    if pages * page_size != size:
        raise BadIndex(f"the index's header counts {pages} pages, the file has {size // page_size}")
    if head[18:20] != b"\x01\x01":
        raise BadIndex("the index is in WAL mode or of an unknown file format version")
