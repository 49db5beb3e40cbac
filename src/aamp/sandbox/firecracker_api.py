"""Firecracker's API socket, as a tiny client: every call has a deadline, every refusal is a
`DriverError` with Firecracker's own words; `boot` is the sequence that starts a fresh VM."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from aamp.sandbox.driver import DriverError

API_SOCK = "fc.sock"  # in the VM root, where Firecracker runs


class FirecrackerApi:
    """A tiny client for one Firecracker API socket: every call has a deadline, and a refusal
    comes back as DriverError carrying Firecracker's own `fault_message`."""

    def __init__(self, socket_path: Path, timeout: float = 10.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self.timings: dict[str, float] = {}
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket_path)),
            base_url="http://localhost",
            timeout=timeout,
        )

    async def __aenter__(self) -> FirecrackerApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        started = time.monotonic()
        try:
            response = await self._client.request(method, path, json=body)
        except httpx.TimeoutException:
            raise DriverError(
                f"firecracker did not answer {method} {path} within {self.timeout:.0f}s"
            ) from None
        except httpx.TransportError as exc:
            raise DriverError(
                f"firecracker's API socket {self.socket_path} failed on {method} {path}: {exc}"
            ) from None
        finally:
            self.timings[f"{method} {path}"] = time.monotonic() - started
        if response.status_code >= 300:
            try:
                fault = response.json().get("fault_message") or response.text
            except ValueError:
                fault = response.text
            raise DriverError(f"firecracker refused {method} {path}: {fault}")
        return response.json() if response.content else None

    async def boot(
        self, vcpus: int, memory_mib: int, boot_source: dict[str, Any], guest_cid: int, vsock: str
    ) -> None:
        """Configure a fresh VM from the files in its root (rootfs.ext4 read-only, scratch.ext4
        writable, the kernel in `boot_source`) and start it."""
        await self.call(
            "PUT",
            "/machine-config",
            {"vcpu_count": vcpus, "mem_size_mib": memory_mib, "smt": False},
        )
        await self.call("PUT", "/boot-source", boot_source)
        await self.call(
            "PUT",
            "/drives/rootfs",
            {
                "drive_id": "rootfs",
                "path_on_host": "rootfs.ext4",
                "is_root_device": True,
                "is_read_only": True,
            },
        )
        await self.call(
            "PUT",
            "/drives/scratch",
            {
                "drive_id": "scratch",
                "path_on_host": "scratch.ext4",
                "is_root_device": False,
                "is_read_only": False,
            },
        )
        await self.call("PUT", "/vsock", {"guest_cid": guest_cid, "uds_path": vsock})
        await self.call("PUT", "/actions", {"action_type": "InstanceStart"})
