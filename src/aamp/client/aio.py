"""`AsyncClient`: the SDK for asyncio programs, built on the same sync core, not a second one.

Each call borrows a sync `Client` (one keep-alive connection) from a small pool and runs the
very same code (`aamp.client.sandboxes`, `aamp.client.runs`) in a worker thread, so requests,
errors, the one agent-name rule and the checks on artifacts cannot drift between the two;
concurrent awaits get connections of their own. Output callbacks and streamed events are
handed back to the event loop, so `on_stdout` runs on the loop's thread, as async code expects.
A connection that lives on the event loop itself (the control plane's in-process one, for
`/mcp`) says how that code runs over it instead (its `offload`: on the loop, no thread).

    async with AsyncClient(url, token) as client:
        async with await client.sandboxes.create(image="base") as sandbox:
            result = await sandbox.exec(["echo", "hi"], on_stdout=print)
        run = await client.agents.run("reporter", "count", inputs=["a.csv"])
        async for event in run.events(): ...
"""

from __future__ import annotations

import asyncio
import contextlib

from aamp.client.api import Client, find_credentials
from aamp.client.runs import Artifact, Event, Run
from aamp.client.sandboxes import ExecResult, Sandbox, Screenshot

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
    from typing import Any


class AsyncClient:
    """Like `Client`, with coroutines; close it or use `async with`."""

    def __init__(self, *args: Any, **kw: Any):
        """The arguments of `Client`: (url, token), a `profile=`, or none (as the CLI signs
        in), and `timeout=`."""
        first = Client(*args, **kw)
        self.base: str = first.base
        self._make = lambda: Client(
            first.base, first._token, timeout=first._http.timeout, connection=first._connection
        )
        self._idle: list[Client] = [first]
        self._offload: Callable[..., Awaitable[Any]] = getattr(
            first._http, "offload", asyncio.to_thread
        )
        self.sandboxes = AsyncSandboxes(self)
        self.agents = AsyncAgents(self)

    @classmethod
    def from_settings(cls, settings: Any, *, timeout: float | None = 120.0) -> AsyncClient:
        url, token = find_credentials(settings)
        return cls(url, token, timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for client in idle:
            client.close()

    @contextlib.asynccontextmanager
    async def _borrowed(self) -> AsyncIterator[Client]:
        client = self._idle.pop() if self._idle else self._make()
        try:
            yield client
        finally:
            self._idle.append(client)

    async def _run(self, work: Callable[[Client], Any]) -> Any:
        async with self._borrowed() as client:
            return await self._offload(work, client)

    async def call(self, method: str, path: str, **kw: Any) -> Any:
        return await self._run(lambda c: c.call(method, path, **kw))

    async def whoami(self) -> dict[str, Any]:
        return await self._run(lambda c: c.whoami())

    async def _iterate(self, make: Callable[[Client], Iterator[Any]]) -> AsyncIterator[Any]:
        """A sync generator, run in a worker thread, as an async one (closed when left)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = False

        def pump(client: Client) -> None:
            it = make(client)
            try:
                for item in it:
                    if stop:
                        break
                    loop.call_soon_threadsafe(queue.put_nowait, ("item", item))
            except BaseException as exc:
                if not stop:
                    loop.call_soon_threadsafe(queue.put_nowait, ("error", exc))
                return
            finally:
                it.close()
            loop.call_soon_threadsafe(queue.put_nowait, ("end", None))

        client = self._idle.pop() if self._idle else self._make()
        worker = asyncio.ensure_future(self._offload(pump, client))
        try:
            while True:
                kind, value = await queue.get()
                if kind == "item":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        finally:
            stop = True
            if worker.done():
                self._idle.append(client)
            else:
                # Left early: a stream may wait long for its next item, so the connection is
                # cut under it, which ends the worker; that client is not used again.
                client.abort()
                with contextlib.suppress(BaseException):
                    await worker
                client.close()


def _on_loop(
    loop: asyncio.AbstractEventLoop, callback: Callable[[bytes], object] | None
) -> Callable[[bytes], object] | None:
    if callback is None:
        return None
    return lambda data: loop.call_soon_threadsafe(callback, data)


class AsyncFiles:
    def __init__(self, owner: AsyncClient, info: dict[str, Any]):
        self._owner, self._info = owner, info

    async def write(self, path: str, data: bytes) -> int:
        return await self._owner._run(lambda c: Sandbox(c, self._info).files.write(path, data))

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        return await self._owner._run(lambda c: Sandbox(c, self._info).files.read(path, max_bytes))


class AsyncSandbox:
    """A live sandbox; `async with` destroys it on the way out, also when the block raises."""

    def __init__(self, owner: AsyncClient, info: dict[str, Any]):
        self._owner, self.info = owner, info
        self.id: str = info["id"]
        self.files = AsyncFiles(owner, info)

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r})"

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()

    async def exec(
        self,
        argv: list[str],
        *,
        timeout: float | None = None,
        on_stdout: Callable[[bytes], object] | None = None,
        on_stderr: Callable[[bytes], object] | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        keep: int | None = None,
    ) -> ExecResult:
        """As `Sandbox.exec`; the callbacks run on the event loop as output arrives."""
        loop = asyncio.get_running_loop()
        out, err = _on_loop(loop, on_stdout), _on_loop(loop, on_stderr)
        return await self._owner._run(
            lambda c: Sandbox(c, self.info).exec(
                argv,
                timeout=timeout,
                on_stdout=out,
                on_stderr=err,
                env=env,
                cwd=cwd,
                stdin=stdin,
                keep=keep,
            )
        )

    async def screenshot(
        self, url: str, *, full_page: bool = False, timeout: float | None = None
    ) -> Screenshot:
        """As `Sandbox.screenshot`."""
        return await self._owner._run(
            lambda c: Sandbox(c, self.info).screenshot(url, full_page=full_page, timeout=timeout)
        )

    async def destroy(self) -> None:
        await self._owner._run(lambda c: Sandbox(c, self.info).destroy())


class AsyncSandboxes:
    def __init__(self, owner: AsyncClient):
        self._owner = owner

    async def create(self, **kw: Any) -> AsyncSandbox:
        """As `Sandboxes.create` (same keywords)."""
        made = await self._owner._run(lambda c: c.sandboxes.create(**kw))
        return AsyncSandbox(self._owner, made.info)

    async def list(self) -> list[AsyncSandbox]:
        found = await self._owner._run(lambda c: c.sandboxes.list())
        return [AsyncSandbox(self._owner, s.info) for s in found]


class AsyncArtifact:
    def __init__(self, owner: AsyncClient, run_id: str, item: dict[str, Any]):
        self._owner, self.run_id, self._item = owner, run_id, item
        self.name: str = item["name"]
        self.size: int = item["size"]
        self.sha256: str = item["sha256"]

    def __repr__(self) -> str:
        return f"AsyncArtifact({self.name!r}, {self.size} bytes)"

    async def read(self) -> bytes:
        return await self._owner._run(lambda c: Artifact(c, self.run_id, self._item).read())


class AsyncRun:
    """As `Run`: `events()` is an async iterator, resumable the same way."""

    def __init__(self, owner: AsyncClient, info: dict[str, Any]):
        self._owner, self.info = owner, info
        self.id: str = info["id"]
        self.last_event_id = 0

    @property
    def status(self) -> str:
        return str(self.info["status"])

    def _sync(self, client: Client) -> Run:
        run = Run(client, self.info)
        run.last_event_id = self.last_event_id
        return run

    async def refresh(self) -> AsyncRun:
        self.info = (await self._owner._run(lambda c: self._sync(c).refresh())).info
        return self

    async def events(self, *, after: int | None = None) -> AsyncIterator[Event]:
        if after is not None:
            self.last_event_id = after
        async for event in self._owner._iterate(lambda c: self._sync(c).events()):
            self.last_event_id = event.id
            yield event
        await self.refresh()

    async def wait(self, timeout: float | None = None) -> AsyncRun:
        self.info = (await self._owner._run(lambda c: self._sync(c).wait(timeout))).info
        return self

    async def artifacts(self) -> list[AsyncArtifact]:
        found = await self._owner._run(lambda c: self._sync(c).artifacts())
        listed = [{"name": a.name, "size": a.size, "sha256": a.sha256} for a in found]
        return [AsyncArtifact(self._owner, self.id, item) for item in listed]

    async def cancel(self) -> AsyncRun:
        self.info = (await self._owner._run(lambda c: self._sync(c).cancel())).info
        return self


class AsyncAgents:
    def __init__(self, owner: AsyncClient):
        self._owner = owner

    async def list(self) -> list[dict[str, Any]]:
        return await self._owner._run(lambda c: c.agents.list())

    async def run(
        self,
        agent: str,
        task: str,
        *,
        inputs: Iterable[str | tuple[str, bytes]] = (),
        version: int | str = "latest",
    ) -> AsyncRun:
        items = list(inputs)
        made = await self._owner._run(
            lambda c: c.agents.run(agent, task, inputs=items, version=version)
        )
        return AsyncRun(self._owner, made.info)

    async def get_run(self, run_id: str) -> AsyncRun:
        found = await self._owner._run(lambda c: c.agents.get_run(run_id))
        return AsyncRun(self._owner, found.info)
