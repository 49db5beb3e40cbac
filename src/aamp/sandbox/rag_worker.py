"""The host's side of the knowledge-base worker (`aamp.guest.rag`, in the rag image): one
request in, one answer out (`call`, a process per request), searches through a worker kept
running in a sandbox (`SearchWorker`), and the check an index file passes before the host
keeps it.

The answer and the index file come from a sandbox that parsed untrusted documents, so both
are untrusted: the answer is size-capped and must be a JSON object; an index file is never
opened on the host (no SQLite library of the host ever reads it — it is only ever opened
inside sandboxes), so what can be checked here is checked on its bytes: its size is within
bounds, and its header is SQLite's with a sane page size that divides the file.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol, runtime_checkable

from aamp.errors import AampError
from aamp.sandbox.channel.errors import ChannelError
from aamp.sandbox.channel.exec_session import ExecSession
from aamp.sandbox.channel.guest_channel import GuestChannel
from aamp.sandbox.guest_worker import run_worker, worker_argv

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


@runtime_checkable
class SearchesForYou(Protocol):
    """A channel whose far end keeps the resident worker itself (a sandbox on another host:
    `aamp.fleet.link_client.LinkChannel`): `request` searched by the worker warmed on `warm`
    (None: only started), its answer (a JSON object, still the guest's word)."""

    async def search_resident(
        self, warm: tuple[str, ...], request: dict[str, Any] | None, timeout: float
    ) -> dict[str, Any]: ...


class SearchWorker:
    """Searches answered by one resident worker in a sandbox (`aamp.guest.rag` `serve`): it
    is started by `start` (a run's sandbox starting) or else on the first search, loads the
    model and reads the vectors of the `warm` indexes (paths in /workspace) as it starts,
    keeps them between searches, and takes a JSON request per line on its stdin and gives a
    JSON answer per line on stdout. `start` returns once the process is started: the model
    loads in the guest meanwhile, and the first search waits only for what is left of it.

    Through a channel to a sandbox on another host (one that `searches_for_you`: its link
    keeps no stdin open, one exec being one request) the resident worker is the host's own: the
    host keeps a `SearchWorker` per sandbox (`aamp.fleet.link_server`, `/search`) and each
    search or start here is one request to it, so the model stays loaded there too.

    One search at a time. A search that times out, a worker that died, or an answer that is
    not one JSON object of at most MAX_ANSWER bytes ends the worker (`WorkerFailed`); the next
    search starts a new one. Nothing here reads from the worker between searches, so it never
    counts as the sandbox's activity while it waits.

    Usage::

        worker = SearchWorker(warm=(".knowledge-bases/kb.sqlite",))
        await worker.start(channel, 60)  # optional: the model loads while the run goes on
        answer = await worker.search(channel, {"index": ..., "query": ..., "k": 5}, 60)
        await worker.close()        # or let the sandbox's teardown end it
    """

    def __init__(self, warm: tuple[str, ...] = ()) -> None:
        self.warm = warm
        self._session: ExecSession | None = None
        self._stdout = bytearray()
        self._stderr = bytearray()
        self._lock = asyncio.Lock()

    async def search(
        self, channel: GuestChannel, request: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        if isinstance(channel, SearchesForYou):
            return await self._elsewhere(channel, request, timeout)
        line = json.dumps({**request, "action": "search"}).encode() + b"\n"
        async with self._lock:
            try:
                async with asyncio.timeout(timeout):
                    session = await self._started(channel)
                    await session.send_stdin(line)
                    text = await self._answer_line()
            except ChannelError as exc:  # GuestTimeout too: the guest went silent
                await self.close()
                raise WorkerFailed(f"the search worker is gone: {exc}") from None
            except TimeoutError:
                await self.close()
                raise WorkerFailed(f"the search worker took longer than {timeout:g} s") from None
            except (WorkerFailed, asyncio.CancelledError):
                await self.close()  # where its answers stand is unknown: never read on
                raise
            try:
                answer = json.loads(text)
            except ValueError:
                answer = None
            if not isinstance(answer, dict):
                await self.close()
                raise WorkerFailed("the search worker answered something that is not an object")
            return answer

    async def start(self, channel: GuestChannel, timeout: float) -> None:
        """Start the worker now if it is not running (`WorkerFailed` if it cannot be)."""
        if isinstance(channel, SearchesForYou):
            await self._elsewhere(channel, None, timeout)
            return
        async with self._lock:
            try:
                async with asyncio.timeout(timeout):
                    await self._started(channel)
            except (ChannelError, TimeoutError) as exc:
                await self.close()
                raise WorkerFailed(f"the search worker did not start: {exc}") from None

    async def _elsewhere(
        self, channel: SearchesForYou, request: dict[str, Any] | None, timeout: float
    ) -> dict[str, Any]:
        async with self._lock:
            try:
                return await channel.search_resident(self.warm, request, timeout)
            except (ChannelError, AampError) as exc:  # the link's errors too
                raise WorkerFailed(f"the search worker on the sandbox's host: {exc}") from None

    async def _started(self, channel: GuestChannel) -> ExecSession:
        if self._session is None:
            self._session = await channel.exec(
                worker_argv("rag", "serve", *self.warm), cwd="/workspace", stdin_open=True
            )
        return self._session

    async def _answer_line(self) -> bytes:
        assert self._session is not None
        while b"\n" not in self._stdout:
            if len(self._stdout) > MAX_ANSWER:
                raise WorkerFailed(f"the search worker's answer is over {MAX_ANSWER} bytes")
            try:
                out = await self._session.__anext__()
            except StopAsyncIteration:
                result = self._session.result
                why = self._stderr.decode("utf-8", "replace")[-1000:].strip()
                await self.close()
                if result is not None and result.signal:
                    why = f"killed by signal {result.signal} (a sandbox limit?) {why}"
                raise WorkerFailed(f"the search worker stopped: {why or result}") from None
            if out.stream == "stdout":
                self._stdout += out.data
            else:
                self._stderr = (self._stderr + out.data)[-4000:]
        text, _, rest = bytes(self._stdout).partition(b"\n")
        self._stdout[:] = rest
        return text

    async def close(self) -> None:
        """End the worker (its process group is killed); the next search starts another."""
        session, self._session = self._session, None
        self._stdout.clear()
        if session is not None:
            await session.aclose()


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
