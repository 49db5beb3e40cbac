"""`Client`: the control plane's /v1 API as Python calls, over one `transport.Connection`.

Generic calls (`call`, `stream`) reach any route; the sandbox routes have methods of their
own (create, list, delete, exec with its output as it comes, files in and out). This is what
the CLI is built on and what the SDK grows from, so it holds no terminal concerns: it returns
data and raises `ClientError`, and the caller decides what to print.

    with Client.from_settings(Settings.from_env()) as client:
        sandbox = client.create_sandbox(image="base", ttl_seconds=600)
        for event in client.exec(sandbox["id"], ["uname", "-a"]): ...
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from aamp import __version__
from aamp.client.transport import ClientError, Connection, Response

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.client
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from aamp.client.runs import Agents
    from aamp.client.sandboxes import Sandboxes
    from aamp.config import Settings

TOKEN_ENV = "AAMP_TOKEN"


def find_token(settings: Settings) -> str | None:
    """AAMP_TOKEN if set, else what `aamp up` wrote to the installation's token file."""
    given = settings.env.get(TOKEN_ENV)
    if given:
        return given.strip() or None
    try:
        return settings.cli_token_path.read_text().strip() or None
    except OSError:
        return None


def find_credentials(settings: Settings) -> tuple[str, str]:
    """The address and token a command signs in with, under one rule: AAMP_TOKEN (for
    AAMP_HOST:AAMP_PORT) if set; else the login profile (AAMP_PROFILE, or the default one
    `aamp login` made) with its own address; else this host's installation, as `aamp up`
    left its admin token in $AAMP_HOME/cli-token."""
    from aamp.client.profiles import PROFILE_ENV, Profiles

    if settings.env.get(TOKEN_ENV, "").strip():
        return settings.api_url, settings.env[TOKEN_ENV].strip()
    chosen = Profiles.load(settings.env).chosen(settings.env.get(PROFILE_ENV) or None)
    if chosen is not None:
        return chosen[1]["url"], chosen[1]["token"]
    token = find_token(settings)
    if token is None:
        raise ClientError(
            "no_token",
            f"no API token: run `aamp login`, set AAMP_TOKEN, or run the control plane here "
            f"(`aamp up` writes {settings.cli_token_path}) and check AAMP_HOME",
        )
    return settings.api_url, token


class Client:
    """A signed-in client of one control plane; close it (or use `with`) when done.

    `Client(url, token)`; `Client()` signs in as the CLI would (`find_credentials`:
    AAMP_TOKEN, the login profile, or this host's installation); `Client(profile="prod")`
    uses that login profile.

    `connection` makes the connection requests go over, called as
    `connection(base_url, headers, timeout=timeout)`; by default `transport.Connection`, a
    socket. (The control plane's `/mcp` gives one that reaches its own API in process, on
    the event loop: `aamp.mcp.in_process`.)"""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        profile: str | None = None,
        timeout: float | None = 120.0,
        connection: Callable[..., Connection] = Connection,
    ):
        if base_url is None or token is None:
            if base_url is not None or token is not None:
                raise ClientError("invalid_request", "give both the url and the token, or neither")
            base_url, token = self._signed_in(profile)
        elif profile is not None:
            raise ClientError("invalid_request", "give a url and token, or a profile, not both")
        self.base = base_url
        self._token = token
        self._connection = connection
        self._http = connection(
            base_url,
            {"authorization": f"Bearer {token}", "user-agent": f"aamp/{__version__}"},
            timeout=timeout,
        )
        self._sandboxes: Sandboxes | None = None
        self._agents: Agents | None = None

    @staticmethod
    def _signed_in(profile: str | None) -> tuple[str, str]:
        from aamp.config import Settings

        settings = Settings.from_env()
        if profile is None:
            return find_credentials(settings)
        from aamp.client.profiles import Profiles

        chosen = Profiles.load(settings.env).chosen(profile)
        assert chosen is not None  # a named profile that is missing raised
        return chosen[1]["url"], chosen[1]["token"]

    @classmethod
    def from_settings(cls, settings: Settings, *, timeout: float | None = 120.0) -> Client:
        """Signed in as `find_credentials` says for these settings."""
        url, token = find_credentials(settings)
        return cls(url, token, timeout=timeout)

    @property
    def sandboxes(self) -> Sandboxes:
        """Make, list and find sandboxes (`aamp.client.sandboxes`)."""
        if self._sandboxes is None:
            from aamp.client.sandboxes import Sandboxes

            self._sandboxes = Sandboxes(self)
        return self._sandboxes

    @property
    def agents(self) -> Agents:
        """The agents you can see, and runs of them (`aamp.client.runs`)."""
        if self._agents is None:
            from aamp.client.runs import Agents

            self._agents = Agents(self)
        return self._agents

    def whoami(self) -> dict[str, Any]:
        """Who the token is: username, role, how signed in, the agents you can reach."""
        return self.call("GET", "/v1/me")

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def abort(self) -> None:
        """Cut the connection, from any thread: a request under way fails at once, and so
        does every later one (a client cut this way is done)."""
        self._http.abort()

    def pause(self, seconds: float) -> None:
        """Wait between polls; a connection on the event loop (`/mcp`'s in-process one)
        waits there without stopping it, any other sleeps."""
        getattr(self._http, "pause", time.sleep)(seconds)

    def call(self, method: str, path: str, **kw: Any) -> Any:
        """One JSON request; the decoded body (None for an empty one). `kw`: params, json,
        content, headers, timeout."""
        return self._http.send(method, path, **kw).json()

    def stream(self, method: str, path: str, **kw: Any) -> AbstractContextManager[Response]:
        """A request whose body the caller reads as it arrives (`iter_lines`, `iter_bytes`)."""
        return self._http.stream(method, path, **kw)

    def create_sandbox(self, **body: Any) -> dict[str, Any]:
        return self.call("POST", "/v1/sandboxes", json=body)

    def list_sandboxes(self) -> list[dict[str, Any]]:
        return self.call("GET", "/v1/sandboxes")

    def delete_sandbox(self, sandbox_id: str) -> None:
        self._http.send("DELETE", f"/v1/sandboxes/{sandbox_id}")

    def list_images(self) -> list[dict[str, Any]]:
        return self.call("GET", "/v1/images")

    def exec(
        self,
        sandbox_id: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Yield the exec's events as they arrive: {"stream", "data": bytes} then the result.
        Closing the generator early closes the connection, and the server kills the command."""
        import base64  # loaded here: only exec's bytes are base64, and a command pays ~1 ms

        body: dict[str, Any] = {"argv": argv, "env": env or {}, "cwd": cwd}
        if stdin is not None:
            body["stdin_b64"] = base64.b64encode(stdin).decode()
        if timeout is not None:
            body["timeout_seconds"] = timeout
        with self.stream(
            "POST", f"/v1/sandboxes/{sandbox_id}/exec", json=body, timeout=None
        ) as resp:
            for line in resp.iter_lines():
                if not line:
                    continue
                event = json.loads(line)
                if "data" in event:
                    event["data"] = base64.b64decode(event["data"])
                yield event

    def put_file(self, sandbox_id: str, local: Path, guest_path: str) -> int:
        size = local.stat().st_size

        def chunks() -> Iterator[bytes]:
            with local.open("rb") as f:
                while chunk := f.read(1024 * 1024):
                    yield chunk

        self._http.send(
            "PUT",
            f"/v1/sandboxes/{sandbox_id}/files",
            params={"path": guest_path},
            content=chunks(),
            headers={"content-length": str(size)},
            timeout=None,
        )
        return size

    def get_file(self, sandbox_id: str, guest_path: str, local: Path) -> int:
        """Download to `local` atomically: on any error the destination is left untouched."""
        tmp = local.with_name(f".{local.name}.aamp-partial")
        written = 0
        try:
            with self.stream(
                "GET",
                f"/v1/sandboxes/{sandbox_id}/files",
                params={"path": guest_path},
                timeout=None,
            ) as resp:
                expected = int(resp.headers.get("content-length", "-1"))
                with tmp.open("wb") as f:
                    for chunk in resp.iter_bytes():
                        f.write(chunk)
                        written += len(chunk)
            if expected >= 0 and written != expected:
                raise ClientError("truncated", f"got {written} of {expected} bytes")
            tmp.replace(local)
        finally:
            tmp.unlink(missing_ok=True)
        return written
