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

import base64
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from aamp import __version__
from aamp.client.transport import ClientError, Connection, Response

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.client
if TYPE_CHECKING:
    from typing import Any

    from aamp.config import Settings

TOKEN_ENV = "AAMP_TOKEN"


def find_token(settings: Settings) -> str | None:
    """The CLI's API token: AAMP_TOKEN if set, else what `aamp up` wrote to the token file."""
    given = settings.env.get(TOKEN_ENV)
    if given:
        return given.strip() or None
    try:
        return settings.cli_token_path.read_text().strip() or None
    except OSError:
        return None


class Client:
    """A signed-in client of one control plane; close it (or use `with`) when done."""

    def __init__(self, base_url: str, token: str, *, timeout: float | None = 120.0):
        self.base = base_url
        self._http = Connection(
            base_url,
            {"authorization": f"Bearer {token}", "user-agent": f"aamp/{__version__}"},
            timeout=timeout,
        )

    @classmethod
    def from_settings(cls, settings: Settings, *, timeout: float | None = 120.0) -> Client:
        """The installation's API (AAMP_HOST, AAMP_PORT) as the CLI token's holder."""
        token = find_token(settings)
        if token is None:
            raise ClientError(
                "no_token",
                f"no API token: set AAMP_TOKEN, or run the control plane here (`aamp up` writes "
                f"{settings.cli_token_path}) and check AAMP_HOME",
            )
        return cls(settings.api_url, token, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

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
