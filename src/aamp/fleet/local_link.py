"""`LocalLink`: the link of a replica's own sandbox host (`aamp up` with
`AAMP_FLEET_LINK_LISTEN`), so that every other replica reaches the sandboxes of this process
— exec, files, destroy, and creates placed here — as it reaches a remote host's, through
the same `link_app` and the same mutual TLS.

Without that setting nothing changes: the single-host `aamp up` serves no link and needs no
TLS, and its own host registers with no link address (then only this process reaches its
sandboxes, as before). With it, the host's link certificate is issued at each start by the
installation's link CA, which a replica holds anyway (`$AAMP_HOME/link-ca`); the certificate
and its key are written, 0600, to this process's runtime directory only for the TLS server
to load, and removed when it stops. The local host registers in its process (its link
needs no proof: the process holds the CA) with the address other replicas dial
(`AAMP_FLEET_LINK_ADVERTISE`, default the listen address). The read-only files other
replicas' creates send it (`host_files.py`) are kept under `$AAMP_HOME/host-files/HOST_ID`
(the home may be the replicas' shared one: each own host has its directory), emptied at start
and stop; one no sandbox uses is deleted at the next file or destroy request of the link.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import uvicorn

from aamp.fleet.host_files import HostFiles
from aamp.fleet.link_ca import LinkCA
from aamp.fleet.link_server import link_app, link_server
from aamp.fleet.links import check_address
from aamp.sandbox.manager import SandboxManager


class LocalLink:
    def __init__(
        self,
        ca: LinkCA,
        manager: SandboxManager,
        host_id: str,
        listen: str,
        advertise: str | None = None,
    ) -> None:
        self.ca, self.manager, self.host_id = ca, manager, host_id
        self.listen = check_address(listen)
        self.address = check_address(advertise or listen)
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._dir: Path | None = None
        root = manager.settings.home / "host-files" / host_id
        self.files = HostFiles(root, manager.recorder)

    async def start(self, epoch: Callable[[], int]) -> None:
        """Serve the link (`epoch()`: the local host's current life) until `stop`."""
        directory = self.manager.settings.runtime_dir / "link"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, mode=0o700)
        self._dir = directory
        cert, key = await asyncio.to_thread(self.ca.issue_host, self.host_id)
        files = []
        for name, data in (("host.crt", cert), ("host.key", key)):
            path = directory / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            files.append(path)
        host, port = self.listen.rsplit(":", 1)
        self.files.clear()
        app = link_app(self.manager, epoch, self.host_id, lambda: None, files=self.files)
        self._server = server = link_server(
            app, files[0], files[1], self.ca.cert_path, host.strip("[]"), int(port)
        )
        self._task = asyncio.create_task(server.serve(), name="local-link")
        while not server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError(f"the local host's link on {self.listen} did not start")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(BaseException):
                await self._task
        self._server = self._task = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            shutil.rmtree(self.files.root, ignore_errors=True)
