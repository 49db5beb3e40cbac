"""`aamp host serve`: a sandbox host on its own machine — the sandbox manager, its drivers and
egress proxies, the host's end of the link (`link_server.py`), and its life with the control
plane: register (a new epoch, what it offers, where its link listens), heartbeat every few
seconds with the sandboxes it runs, and begin again when told its epoch is stale.

It keeps no database and no credential of anyone else: its token (`X-Aamp-Host-Token`, from
`aamp host add`) speaks for it to a replica; its link certificate proves to a replica which
host it is. Each registration attempt carries a fresh random proof that the host serves on its
link while the attempt is in flight (`link_server.py`'s hello, to replicas only), so the
replica checking the link knows the registration is this host's own; the answer gives the
life's heartbeat secret, which every heartbeat carries (kept in memory only). The link key
must be readable by this user only, or the host does not start.

At start-up the manager reaps whatever an earlier process left (a `kill -9`'d host starts
with nothing), and only then does it register; a heartbeat refused as stale (409: marked
lost while it stalled, or not of its current registration) destroys everything it still runs
before it registers again. The read-only files its creates mount (`host_files.py`,
`$AAMP_HOME/host-files`) are all deleted at start-up and when its epoch is found stale, and
each one as soon as no sandbox it runs uses it (checked at every heartbeat too). The control
plane answers each heartbeat with the reported
sandboxes it has no record of in this epoch (a create whose record failed): the host destroys
those once they are older than a few heartbeats (a sandbox created a moment ago may not be
recorded yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from aamp.egress.ca import given_ca_cert_path
from aamp.errors import AampError
from aamp.fleet.host_files import HostFiles
from aamp.fleet.host_outbox import HostOutbox
from aamp.fleet.link_server import link_app, link_server
from aamp.fleet.upkeep import images_present, machine_facts
from aamp.sandbox.image_tree import BAKED_CA
from aamp.sandbox.manager import SandboxManager

log = logging.getLogger("aamp.fleet.host")
TOKEN_HEADER = "X-Aamp-Host-Token"
CERT_FILES = ("host.crt", "host.key", "ca.crt")


class HostStartError(RuntimeError):
    """The host cannot start as configured; the message says what to fix."""


@dataclass
class HostConfig:
    host_id: str
    control_plane: str  # a replica's base URL (or the load balancer in front of them)
    token: str
    cert_dir: Path  # host.crt, host.key, ca.crt (from `aamp host add --out`)
    listen_host: str
    listen_port: int
    advertise: str  # HOST:PORT where replicas reach the link

    def cert_paths(self) -> tuple[Path, Path, Path]:
        paths = tuple(self.cert_dir / name for name in CERT_FILES)
        for path in paths:
            if not path.is_file():
                raise HostStartError(f"{path} is missing; `aamp host add ID --out DIR` writes it")
        _check_private(paths[1])
        return paths  # type: ignore[return-value]


def _check_private(key: Path) -> None:
    """The link key is the host's identity: refused unless only this user can read it (as
    `InstallationCA` refuses a CA key others can read)."""
    info = key.stat()
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise HostStartError(
            f"{key} has mode {stat.S_IMODE(info.st_mode):o}; the link key must be 0600"
        )
    if info.st_uid != os.geteuid():
        raise HostStartError(
            f"{key} belongs to uid {info.st_uid}, not to the user this host runs as"
            f" ({os.geteuid()}); chown it"
        )


class SandboxHost:
    def __init__(
        self, config: HostConfig, manager: SandboxManager, outbox: HostOutbox | None = None
    ) -> None:
        self.config = config
        self.manager = manager
        self.outbox = outbox  # egress records and credential asks, collected by replicas
        self.files = HostFiles(manager.settings.home / "host-files", manager.recorder)
        self.epoch = 0
        self.interval = 3.0
        self.heartbeat_secret = ""
        self.proof: str | None = None  # served on the link only while a registration is sent
        self._api = httpx.AsyncClient(
            base_url=config.control_plane,
            headers={TOKEN_HEADER: config.token},
            timeout=15,
            trust_env=False,
        )

    async def _call(self, what: str, body: dict[str, object]) -> httpx.Response:
        return await self._api.post(f"/v1/hosts/{self.config.host_id}/{what}", json=body)

    async def register(self) -> None:
        facts = machine_facts(self.manager)
        self.proof = secrets.token_urlsafe(32)
        try:
            response = await self._call(
                "register",
                {
                    "drivers": list(facts.drivers),
                    "cpus": facts.cpus,
                    "memory_mb": facts.memory_mb,
                    "sandboxes": facts.sandboxes,
                    "images": list(facts.images),
                    "link": self.config.advertise,
                    "proof": self.proof,
                },
            )
        finally:
            self.proof = None  # a proof seen once (on the wire) proves nothing later
        if response.status_code != 200:
            raise HostStartError(
                f"the control plane refused host {self.config.host_id}'s registration "
                f"({response.status_code}): {response.text[:500]}"
            )
        lease = response.json()
        self.epoch, self.interval = lease["epoch"], float(lease["heartbeat_seconds"])
        self.heartbeat_secret = lease["heartbeat_secret"]
        self.keep_egress_ca(str(lease["egress_ca"]))
        log.info("host %s registered, epoch %s", self.config.host_id, self.epoch)

    def keep_egress_ca(self, pem: str) -> None:
        """Keep the installation's egress CA certificate (public) where `aamp image build`
        on this machine takes it (`ca_cert_path`), so the images built here trust the CA the
        replicas sign this host's leaves with; warn of images that trust another."""
        path = given_ca_cert_path(self.manager.settings)
        if not path.is_file() or path.read_text() != pem:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(pem)
            tmp.chmod(0o644)
            tmp.replace(path)
        for image in self.manager.images.list():
            baked = image.root / BAKED_CA
            if not baked.is_file() or baked.read_text() != pem:
                log.warning(
                    "image %s does not trust the installation's egress CA: its guests cannot"
                    " call HTTPS services; build it again here (`aamp image build %s`)",
                    image.name,
                    image.name,
                )

    async def heartbeat(self) -> None:
        running = {s.id: s.created_at for s in self.manager.list()}
        self.files.sweep(set(running))  # a sandbox its ttl or idle ended took its files along
        response = await self._call(
            "heartbeat",
            {
                "epoch": self.epoch,
                "secret": self.heartbeat_secret,
                "images": list(images_present(self.manager.images)),
                "sandboxes": sorted(running),
            },
        )
        if response.status_code == 409:
            await self.begin_again(response.text[:500])
            return
        if response.status_code != 200:
            log.error("heartbeat refused (%s): %s", response.status_code, response.text[:500])
            return
        old_enough = time.time() - 3 * self.interval
        for sandbox_id in response.json().get("unknown", []):
            if running.get(sandbox_id, time.time()) < old_enough:
                with contextlib.suppress(AampError):
                    await self.manager.destroy(
                        sandbox_id, reason="the control plane has no record of it"
                    )

    async def begin_again(self, why: str) -> None:
        log.error("host %s must begin again: %s", self.config.host_id, why)
        for sandbox in self.manager.list():
            with contextlib.suppress(AampError):
                await self.manager.destroy(
                    sandbox.id,
                    reason=f"its host {self.config.host_id} was marked lost; "
                    "destroyed before new work",
                )
        self.files.clear()
        await self.register()

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.heartbeat()
            except Exception:  # the clock keeps going whatever one heartbeat met
                log.exception("heartbeat failed")

    async def serve(self) -> None:
        cert, key, ca = self.config.cert_paths()
        await self.manager.start()  # reaps what an earlier process left
        self.files.clear()  # and what it kept for its sandboxes' mounts
        app = link_app(
            self.manager,
            lambda: self.epoch,
            self.config.host_id,
            lambda: self.proof,
            self.outbox,
            self.files,
        )
        server = link_server(app, cert, key, ca, self.config.listen_host, self.config.listen_port)
        # uvicorn catches SIGTERM while its server runs and raises it again once the server
        # has stopped, with the default handler back: that killed the host before it had
        # destroyed its sandboxes (a warm pool's were left running). The host stops on its
        # own handlers instead, and its shutdown below runs to the end.
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        for stop in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(stop, setattr, server, "should_exit", True)
        serving = asyncio.create_task(server.serve(), name="link")
        beating: asyncio.Task[None] | None = None
        try:
            while not server.started:
                if serving.done():
                    serving.result()
                    raise HostStartError("the link server stopped before it started")
                await asyncio.sleep(0.05)
            await self.register()
            beating = asyncio.create_task(self._beat(), name="heartbeat")
            await serving
        finally:
            if beating is not None:
                beating.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beating
            server.should_exit = True
            with contextlib.suppress(BaseException):
                await serving
            await self.manager.shutdown()
            await self._api.aclose()
