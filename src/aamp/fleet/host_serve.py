"""`serve_host`: `aamp host serve`'s start-up — this machine's settings and drivers, the
host's credentials from `--cert-dir`, then `SandboxHost.serve` until stopped.

The host keeps no audit log of its own: its sandboxes' lifecycle and its refusals of the
read-only files a replica sends (`host.file_refused`, `host_files.py`) go to its process log,
the control plane audits every request it sends over the link, and its egress proxies'
records reach the control plane's audit chain through the link (`host_outbox.py`).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import uvloop

from aamp.config import Settings
from aamp.egress.services import ServiceSet
from aamp.fleet.host_outbox import HostOutbox, LinkEgressSink, LinkLeaves, LinkSecrets
from aamp.fleet.host_process import HostConfig, HostStartError, SandboxHost
from aamp.fleet.links import check_address
from aamp.fleet.registry import check_host_id
from aamp.sandbox import SandboxManager, available_drivers, configured_manager


def host_config(args: argparse.Namespace, settings: Settings) -> HostConfig:
    host_id = check_host_id(args.id or settings.env.get("AAMP_FLEET_HOST_ID", "").strip())
    listen = check_address(args.listen)
    advertise = check_address(args.advertise or listen)
    cert_dir = Path(args.cert_dir)
    token_file = cert_dir / "host.token"
    if not token_file.is_file():
        raise HostStartError(f"{token_file} is missing; `aamp host add ID --out DIR` writes it")
    host, port = listen.rsplit(":", 1)
    return HostConfig(
        host_id=host_id,
        control_plane=args.control_plane.rstrip("/"),
        token=token_file.read_text().strip(),
        cert_dir=cert_dir,
        listen_host=host.strip("[]"),
        listen_port=int(port),
        advertise=advertise,
    )


def host_manager(settings: Settings, outbox: HostOutbox) -> SandboxManager:
    """This machine's sandbox manager, built as `aamp up` builds its own (`configured_manager`:
    the same settings read the same way, the warm pools included). Its egress proxies' records,
    credential asks and leaf certificate requests go to the control plane through `outbox`:
    the host holds no egress CA key — a replica signs each HTTPS service's leaf with the
    installation's CA, which the host's images trust (given at registration)."""
    drivers = available_drivers(settings)
    if not drivers:
        raise HostStartError("no isolation driver works on this host; run `aamp doctor`")
    manager: SandboxManager

    def secrets_for(sandbox_id: str) -> LinkSecrets:
        return LinkSecrets(outbox, sandbox_id, lambda: manager.get(sandbox_id).egress.services)

    def leaves_for(sandbox_id: str) -> LinkLeaves:
        def services() -> ServiceSet:
            return manager.get(sandbox_id).egress.services

        return LinkLeaves(outbox, sandbox_id, services, settings.runtime_dir)

    manager = configured_manager(
        settings,
        drivers,
        egress_sink=LinkEgressSink(outbox),
        secrets_for=secrets_for,
        leaves_for=leaves_for,
    )
    return manager


def serve_host(args: argparse.Namespace, settings: object) -> int:
    assert isinstance(settings, Settings)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per heartbeat
    config = host_config(args, settings)
    outbox = HostOutbox()
    host = SandboxHost(config, host_manager(settings, outbox), outbox)
    print(f"aamp sandbox host {config.host_id}: link on {config.advertise}", flush=True)
    try:
        uvloop.run(host.serve())  # as `aamp up` runs (server.py)
    except HostStartError as exc:
        print(f"aamp: {exc}", flush=True)
        return 1
    return 0
