"""A small synchronous client for the /v1 API, used by the CLI."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from aamp.config import Settings
from aamp.identity import read_token


class ClientError(Exception):
    def __init__(self, code: str, message: str, status: int = 0):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class ApiClient:
    def __init__(self, settings: Settings, *, timeout: float = 120.0):
        token = read_token(settings.cli_token_path, settings.env)
        if token is None:
            raise ClientError(
                "no_token",
                f"no API token: set AAMP_TOKEN, or run the control plane here (`aamp up` writes "
                f"{settings.cli_token_path}) and check AAMP_HOME",
            )
        self.base = settings.api_url
        self.http = httpx.Client(
            base_url=self.base,
            headers={"authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout, connect=5.0),
        )

    def close(self) -> None:
        self.http.close()

    def _check(self, resp: httpx.Response) -> httpx.Response:
        if resp.is_success:
            return resp
        resp.read()
        try:
            body = resp.json()
            raise ClientError(body["code"], body["message"], resp.status_code)
        except (ValueError, KeyError, TypeError):
            raise ClientError("http_error", f"HTTP {resp.status_code}", resp.status_code) from None

    def _send(self, method: str, url: str, **kw: Any) -> httpx.Response:
        try:
            return self._check(self.http.request(method, url, **kw))
        except httpx.ConnectError:
            raise ClientError(
                "unreachable",
                f"the control plane is not reachable at {self.base}; start it with `aamp up`",
            ) from None

    @contextlib.contextmanager
    def stream(self, method: str, url: str, **kw: Any) -> Iterator[httpx.Response]:
        """A request whose body the caller reads as it arrives; its status is checked first,
        and a connection that fails on the way is a ClientError too."""
        try:
            with self.http.stream(method, url, **kw) as resp:
                self._check(resp)
                yield resp
        except httpx.ConnectError:
            raise ClientError(
                "unreachable", f"the control plane is not reachable at {self.base}"
            ) from None
        except httpx.HTTPError as exc:
            raise ClientError("transfer_failed", f"transfer failed: {exc}") from None

    def call(self, method: str, url: str, **kw: Any) -> Any:
        """One JSON request; the decoded body (None for an empty one)."""
        resp = self._send(method, url, **kw)
        return resp.json() if resp.content else None

    def create_sandbox(self, **body: Any) -> dict[str, Any]:
        return self._send("POST", "/v1/sandboxes", json=body).json()

    def list_sandboxes(self) -> list[dict[str, Any]]:
        return self._send("GET", "/v1/sandboxes").json()

    def delete_sandbox(self, sandbox_id: str) -> None:
        self._send("DELETE", f"/v1/sandboxes/{sandbox_id}")

    def list_images(self) -> list[dict[str, Any]]:
        return self._send("GET", "/v1/images").json()

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
        """Yield the exec's events as they arrive: {"stream", "data": bytes} then the result."""
        body: dict[str, Any] = {"argv": argv, "env": env or {}, "cwd": cwd}
        if stdin is not None:
            body["stdin_b64"] = base64.b64encode(stdin).decode()
        if timeout is not None:
            body["timeout_seconds"] = timeout
        try:
            with self.http.stream(
                "POST", f"/v1/sandboxes/{sandbox_id}/exec", json=body, timeout=None
            ) as resp:
                self._check(resp)
                for line in resp.iter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    if "data" in event:
                        event["data"] = base64.b64decode(event["data"])
                    yield event
        except httpx.ConnectError:
            raise ClientError(
                "unreachable", f"the control plane is not reachable at {self.base}"
            ) from None

    def put_file(self, sandbox_id: str, local: Path, guest_path: str) -> int:
        size = local.stat().st_size

        def chunks() -> Iterator[bytes]:
            with local.open("rb") as f:
                while chunk := f.read(1024 * 1024):
                    yield chunk

        self._send(
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
