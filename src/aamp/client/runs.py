"""The SDK's agents and runs: `client.agents.run(name, task, inputs=[...])` → a `Run` whose
steps arrive with `events()` and whose outputs are `artifacts()`.

    run = client.agents.run("reporter", "count the rows", inputs=["data.csv"])
    for event in run.events():          # live; resumes after the last event it yielded
        print(event.id, event.type, event.data)
    for artifact in run.artifacts():
        data = artifact.read()          # checked against the listed size and SHA-256

`events()` reads the run's server-sent events (`/v1/runs/{id}/events`). When the stream
breaks off before `run.finished` (a proxy, a restart of the control plane), it reconnects
with `Last-Event-ID` set to the last event it yielded, so no step is lost or repeated; a
`Run` remembers that id, so calling `events()` again also goes on where the last call ended.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from urllib.parse import quote

from aamp.client.transport import ClientError

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.client
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any

    from aamp.client.api import Client

FINISHED = ("succeeded", "failed", "cancelled", "timed_out")
AGENT_ID_PREFIX = "ag-"


class Event:
    """One step of a run: its id (increasing), type (`model.call`, `tool.result`,
    `artifact`, `run.finished`, ...) and data."""

    __slots__ = ("data", "id", "type")

    def __init__(self, id: int, type: str, data: dict[str, Any]):
        self.id, self.type, self.data = id, type, data

    def __repr__(self) -> str:
        return f"Event({self.id}, {self.type!r})"


def parse_sse(lines: Iterable[str]) -> Iterator[Event]:
    """Server-sent events from a stream's lines; comments (keep-alives) are skipped."""
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "event" in fields:
                data = json.loads(fields.get("data") or "{}")
                yield Event(int(fields.get("id", "0")), fields["event"], data)
            fields = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            fields[key] = value.removeprefix(" ")


class Artifact:
    """A file a run produced: its name (its path under /workspace/out), size and SHA-256."""

    __slots__ = ("_client", "name", "run_id", "sha256", "size")

    def __init__(self, client: Client, run_id: str, item: dict[str, Any]):
        self._client, self.run_id = client, run_id
        self.name: str = item["name"]
        self.size: int = item["size"]
        self.sha256: str = item["sha256"]

    def __repr__(self) -> str:
        return f"Artifact({self.name!r}, {self.size} bytes)"

    def read(self) -> bytes:
        """The artifact's bytes, refused unless they are the size and SHA-256 listed."""
        path = f"/v1/runs/{self.run_id}/artifacts/{quote(self.name, safe='/')}"
        with self._client.stream("GET", path, timeout=None) as resp:
            data = bytearray()
            for chunk in resp.iter_bytes():
                data += chunk
                if len(data) > self.size:
                    raise ClientError("artifact_mismatch", f"{self.name}: more bytes than listed")
        if len(data) != self.size or hashlib.sha256(data).hexdigest() != self.sha256:
            raise ClientError(
                "artifact_mismatch", f"{self.name}: the bytes are not the size and SHA-256 listed"
            )
        return bytes(data)


class Run:
    """One run of an agent. `info` is the control plane's view as last read (`refresh`)."""

    def __init__(self, client: Client, info: dict[str, Any]):
        self._client = client
        self.info = info
        self.id: str = info["id"]
        self.last_event_id = 0

    def __repr__(self) -> str:
        return f"Run({self.id!r}, status={self.status!r})"

    @property
    def status(self) -> str:
        return str(self.info["status"])

    def refresh(self) -> Run:
        self.info = self._client.call("GET", f"/v1/runs/{self.id}")
        return self

    def events(self, *, after: int | None = None) -> Iterator[Event]:
        """The run's steps as they happen, ending with `run.finished`. `after`: start after
        that event id (default: after the last one this `Run` yielded)."""
        if after is not None:
            self.last_event_id = after
        while True:
            headers = {"last-event-id": str(self.last_event_id)} if self.last_event_id else {}
            path = f"/v1/runs/{self.id}/events"
            got = finished = False
            with self._client.stream("GET", path, headers=headers, timeout=None) as resp:
                for event in parse_sse(resp.iter_lines()):
                    got = True
                    self.last_event_id = event.id
                    yield event
                    if event.type == "run.finished":
                        finished = True
                        break
            # The stream broke off early (a proxy, a restart): resume after the last event
            # yielded, until the run has ended and nothing more is stored.
            if self.refresh().status in FINISHED and (finished or not got):
                return

    def wait(self, timeout: float | None = None, poll: float = 0.5) -> Run:
        """Block until the run ends (`timeout` seconds at most: then `ClientError`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.refresh().status not in FINISHED:
            if deadline is not None and time.monotonic() >= deadline:
                raise ClientError("timed_out", f"run {self.id} is still {self.status}")
            self._client.pause(poll)
        return self

    def artifacts(self) -> list[Artifact]:
        items = self._client.call("GET", f"/v1/runs/{self.id}/artifacts")
        return [Artifact(self._client, self.id, item) for item in items]

    def cancel(self) -> Run:
        self.info = self._client.call("POST", f"/v1/runs/{self.id}/cancel")
        return self


def _input(item: str | tuple[str, bytes]) -> dict[str, str]:
    """A run input: a local file's path, or (name, bytes)."""
    if isinstance(item, tuple):
        name, content = item
    else:
        from pathlib import Path

        path = Path(item)
        name, content = path.name, path.read_bytes()
    return {"name": name, "content_b64": base64.b64encode(content).decode()}


class Agents:
    """`client.agents`: the agents you can see, and runs of them."""

    __slots__ = ("_client",)

    def __init__(self, client: Client):
        self._client = client

    def list(self) -> list[dict[str, Any]]:
        return self._client.call("GET", "/v1/agents")

    def id_of(self, ref: str) -> str:
        """An agent's id from its id or name: `ag-…` is only ever an id, anything else a name;
        either must be an agent you can see."""
        by_id = ref.startswith(AGENT_ID_PREFIX)
        for agent in self.list():
            if agent["id" if by_id else "name"] == ref:
                return str(agent["id"])
        what = "with id" if by_id else "named"
        raise ClientError("not_found", f"no agent {what} {ref!r} that you can see", 404)

    def run(
        self,
        agent: str,
        task: str,
        *,
        inputs: Iterable[str | tuple[str, bytes]] = (),
        version: int | str = "latest",
    ) -> Run:
        """Start a run of `agent` (its id or name) on `task`. `inputs`: local file paths, or
        (name, bytes) pairs; they land in the run's /workspace/in."""
        body = {"task": task, "inputs": [_input(i) for i in inputs], "version": version}
        started = self._client.call("POST", f"/v1/agents/{self.id_of(agent)}/runs", json=body)
        return Run(self._client, started)

    def get_run(self, run_id: str) -> Run:
        return Run(self._client, self._client.call("GET", f"/v1/runs/{run_id}"))
