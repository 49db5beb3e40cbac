"""The SDK's sandboxes: `client.sandboxes.create(...)` → a `Sandbox` that runs commands and
moves files, and is destroyed when its `with` block ends, however it ends.

    with client.sandboxes.create(image="base", ttl="10m") as sandbox:
        result = sandbox.exec(["python3", "-c", "print(6*7)"], on_stdout=sys.stdout.write)
        sandbox.files.write("in/data.csv", b"x,y\\n1,2\\n")
        data = sandbox.files.read("in/data.csv")

Everything goes through the control plane's /v1 routes with the client's token, so a sandbox
made here obeys the same grants, policy, lifetime and audit as one made with the CLI.
"""

from __future__ import annotations

import json

from aamp.client.transport import ClientError

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.client
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any

    from aamp.client.api import Client


def seconds(value: float | str, field: str) -> float:
    """Seconds from a number or a duration as a policy writes it ("90s", "15m", "1h30m")."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    from aamp.policy import parse_duration  # policy's own grammar, loaded only for text

    try:
        return float(parse_duration(value))
    except ValueError as exc:
        raise ClientError("invalid_request", f"{field}: {exc}") from None


class ExecResult:
    """How a command ended, and its output: each stream kept up to `keep` bytes, and how many
    bytes the command wrote to each (`stdout_size`, `stderr_size`: more than is kept when
    `truncated`)."""

    __slots__ = (
        "exit_code",
        "signal",
        "stderr",
        "stderr_size",
        "stdout",
        "stdout_size",
        "timed_out",
        "truncated",
    )

    def __init__(
        self,
        exit_code: int | None,
        signal: int | None,
        timed_out: bool,
        stdout: bytes,
        stderr: bytes,
        truncated: bool,
        sizes: tuple[int, int] | None = None,
    ):
        self.exit_code, self.signal, self.timed_out = exit_code, signal, timed_out
        self.stdout, self.stderr, self.truncated = stdout, stderr, truncated
        self.stdout_size, self.stderr_size = sizes or (len(stdout), len(stderr))

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.signal

    def __repr__(self) -> str:
        return (
            f"ExecResult(exit_code={self.exit_code}, signal={self.signal}, "
            f"timed_out={self.timed_out}, stdout={len(self.stdout)} bytes, "
            f"stderr={len(self.stderr)} bytes)"
        )


def collect_exec(
    events: Iterator[dict[str, Any]],
    *,
    on_stdout: Callable[[bytes], object] | None = None,
    on_stderr: Callable[[bytes], object] | None = None,
    keep: int | None = None,
) -> ExecResult:
    """Fold an exec's event stream into an `ExecResult`, calling the callbacks as output
    arrives. `keep` bounds what the result holds of each stream (None: all of it); the rest
    is only counted, never held."""
    out, err = bytearray(), bytearray()
    out_size = err_size = 0
    truncated = False
    for event in events:
        if "data" in event:
            data: bytes = event["data"]
            is_out = event["stream"] == "stdout"
            callback = on_stdout if is_out else on_stderr
            if callback is not None:
                callback(data)
            if is_out:
                out_size += len(data)
            else:
                err_size += len(data)
            buf = out if is_out else err
            room = len(data) if keep is None else max(0, keep - len(buf))
            truncated = truncated or room < len(data)
            buf += data[:room]
        elif "error" in event:
            raise ClientError(str(event["error"]), str(event.get("message", event["error"])))
        else:
            result = ExecResult(
                event.get("exit_code"),
                event.get("signal"),
                bool(event.get("timed_out")),
                bytes(out),
                bytes(err),
                truncated,
                (out_size, err_size),
            )
            # Read on to the body's end (the result is its last line), so the connection
            # stays usable for the next request instead of being closed and made again.
            for _ in events:
                pass
            return result
    raise ClientError("transfer_failed", "the exec stream ended without a result")


class Screenshot:
    """A web page as a sandbox's browser showed it: the PNG's bytes (checked against the
    size and SHA-256 the API gave), the URL it ended on, the page's title and HTTP status."""

    __slots__ = ("png", "sha256", "status", "title", "url")

    def __init__(self, answer: dict[str, Any]):
        import base64
        import hashlib

        png = base64.b64decode(answer["png_b64"])
        if len(png) != answer["bytes"] or hashlib.sha256(png).hexdigest() != answer["sha256"]:
            raise ClientError(
                "screenshot_mismatch", "the screenshot is not the size and SHA-256 the API gave"
            )
        self.png: bytes = png
        self.sha256: str = answer["sha256"]
        self.url: str = answer["url"]
        self.title: str = answer["title"]
        self.status: int | None = answer["status"]

    def __repr__(self) -> str:
        return f"Screenshot({self.url!r}, status={self.status}, {len(self.png)} bytes)"


class Files:
    """A sandbox's files, in and out through the control plane (checked, hashed, audited)."""

    __slots__ = ("_client", "_id")

    def __init__(self, client: Client, sandbox_id: str):
        self._client, self._id = client, sandbox_id

    def write(self, path: str, data: bytes) -> int:
        """Write `data` to `path` in the sandbox (relative paths are under /workspace)."""
        self._client._http.send(
            "PUT",
            f"/v1/sandboxes/{self._id}/files",
            params={"path": path},
            content=bytes(data),
            headers={"content-type": "application/octet-stream"},
            timeout=None,
        )
        return len(data)

    def read(self, path: str, max_bytes: int | None = None) -> bytes:
        """The bytes of `path` in the sandbox; a short answer is an error, not fewer bytes.
        With `max_bytes`, a larger file is refused (`too_large`) before more than that is
        read."""
        with self._client.stream(
            "GET", f"/v1/sandboxes/{self._id}/files", params={"path": path}, timeout=None
        ) as resp:
            expected = int(resp.headers.get("content-length", "-1"))
            if max_bytes is not None and expected > max_bytes:
                raise ClientError("too_large", f"{path} is {expected} bytes; at most {max_bytes}")
            chunks, seen = [], 0
            for chunk in resp.iter_bytes():
                seen += len(chunk)
                if max_bytes is not None and seen > max_bytes:
                    raise ClientError("too_large", f"{path} is over {max_bytes} bytes")
                chunks.append(chunk)
            data = b"".join(chunks)
        if expected >= 0 and len(data) != expected:
            raise ClientError("truncated", f"got {len(data)} of {expected} bytes")
        return data

    def upload(self, local: str, path: str) -> int:
        """Copy the local file `local` into the sandbox at `path`, streamed."""
        from pathlib import Path

        return self._client.put_file(self._id, Path(local), path)

    def download(self, path: str, local: str) -> int:
        """Copy `path` out of the sandbox to the local file `local` (atomically)."""
        from pathlib import Path

        return self._client.get_file(self._id, path, Path(local))


class Sandbox:
    """One live sandbox. `with` destroys it on the way out, also when the block raises."""

    def __init__(self, client: Client, info: dict[str, Any]):
        self._client = client
        self.info = info
        self.id: str = info["id"]
        self.files = Files(client, self.id)

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, image={self.info.get('image')!r})"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def exec(
        self,
        argv: list[str],
        *,
        timeout: float | None = None,
        on_stdout: Callable[[bytes], object] | None = None,
        on_stderr: Callable[[bytes], object] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        keep: int | None = None,
    ) -> ExecResult:
        """Run `argv` and wait for it; output goes to the callbacks as it arrives and is kept
        in the result — at most `keep` bytes of each stream, when given (the rest is counted:
        `truncated`, `stdout_size`, `stderr_size`). A command that fails is a result
        (`exit_code`, `timed_out`), not an error; only the API's refusals and a broken
        connection raise `ClientError`."""
        if isinstance(argv, str):
            raise TypeError("argv is a list of words, e.g. ['sh', '-c', 'echo hi']")
        events = self._client.exec(
            self.id, list(argv), env=dict(env or {}), cwd=cwd, stdin=stdin, timeout=timeout
        )
        try:
            return collect_exec(events, on_stdout=on_stdout, on_stderr=on_stderr, keep=keep)
        finally:
            events.close()

    def screenshot(
        self, url: str, *, full_page: bool = False, timeout: float | None = None
    ) -> Screenshot:
        """Load `url` in this sandbox's browser (a sandbox of the `browser` image) and take a
        PNG of it. The page is reached only through the sandbox policy's egress rules: a
        domain they do not allow is refused (`ClientError` `egress_refused`, naming the
        rule), never loaded. `timeout`: seconds for loading the page (the API's default
        otherwise)."""
        body: dict[str, Any] = {"url": url, "full_page": full_page}
        if timeout is not None:
            body["timeout_seconds"] = timeout
        path = f"/v1/sandboxes/{self.id}/screenshot"
        # No client-side limit: the API bounds the page's load, and the browser's start.
        return Screenshot(self._client.call("POST", path, json=body, timeout=None))

    def refresh(self) -> dict[str, Any]:
        """The control plane's current view of this sandbox (expiry, image, owner)."""
        self.info = self._client.call("GET", f"/v1/sandboxes/{self.id}")
        return self.info

    def destroy(self) -> None:
        """Destroy the sandbox; one already gone (ttl, idle, destroyed before) is fine."""
        try:
            self._client.delete_sandbox(self.id)
        except ClientError as exc:
            if exc.status != 404:
                raise


class Sandboxes:
    """`client.sandboxes`: make, list and find sandboxes."""

    __slots__ = ("_client",)

    def __init__(self, client: Client):
        self._client = client

    def create(
        self,
        *,
        policy: str | Mapping[str, Any] | None = None,
        agent: str | None = None,
        image: str | None = None,
        ttl: float | str | None = None,
        idle: float | str | None = None,
        driver: str | None = None,
    ) -> Sandbox:
        """A new sandbox. Either for an agent (`agent=` its id, `policy=` the name of a policy
        granted to it: the policy sets image, lifetime, resources, egress and services), or,
        for admins, from a whole policy (`policy=` a mapping, as in a policy file) or from
        `image`/`ttl`/`idle` alone. `ttl` and `idle` are seconds or durations like "15m"."""
        body: dict[str, Any] = {}
        if driver:
            body["driver"] = driver
        given = [n for n, v in (("image", image), ("ttl", ttl), ("idle", idle)) if v]
        if policy is not None and given:
            raise ClientError(
                "invalid_request",
                f"{', '.join(given)}: the policy sets the sandbox's image and lifetime; "
                "leave these out (or put them in the policy)",
            )
        if isinstance(policy, str):
            body["policy"] = policy
        elif policy is not None:
            # JSON is YAML: the API parses a policy document as YAML.
            body["policy_document"] = json.dumps(dict(policy))
        else:
            body["image"] = image or "base"
            if ttl is not None:
                body["ttl_seconds"] = seconds(ttl, "ttl")
            if idle is not None:
                body["idle_seconds"] = seconds(idle, "idle")
        if agent is not None:
            body["agent"] = agent
        return Sandbox(self._client, self._client.create_sandbox(**body))

    def list(self) -> list[Sandbox]:
        """The sandboxes you may see (all of them for an admin)."""
        return [Sandbox(self._client, info) for info in self._client.list_sandboxes()]

    def get(self, sandbox_id: str) -> Sandbox:
        return Sandbox(self._client, self._client.call("GET", f"/v1/sandboxes/{sandbox_id}"))
