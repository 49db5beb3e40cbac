"""Assembles the host process from settings: store, audit log, vault, identity, sandboxes, API.

`aamp up` opens the store (SQLite under $AAMP_HOME unless AAMP_DATABASE_URL says otherwise)
and migrates it, creates the first admin on a fresh installation (printing a generated
password once), keeps an admin API token for the local CLI in $AAMP_HOME/cli-token (0600),
and wires the sandbox manager's lifecycle records to the real audit log.
"""

from __future__ import annotations

import gc
import ipaddress
import logging

import uvicorn
import uvloop

from aamp.agents.registry import AgentRegistry
from aamp.api.context import ControlPlane
from aamp.api.run_resolve import rebuilt_request
from aamp.audit import AuditLog
from aamp.catalog import Catalog
from aamp.config import Settings
from aamp.egress.ca import InstallationCA, ca_dir
from aamp.egress.ledger import AuditEgressSink
from aamp.egress.services import VaultSecretReader
from aamp.fleet import (
    FleetPlacer,
    FleetUpkeep,
    HostCollectors,
    HostCredentials,
    HostLeaves,
    HostRegistry,
    LocalHost,
    Placement,
    check_host_id,
)
from aamp.fleet.link_ca import LinkCA
from aamp.fleet.links import HostLinks
from aamp.fleet.local_link import LocalLink
from aamp.fleet.registry import DEFAULT_HEARTBEAT_SECONDS, DEFAULT_LOST_SECONDS
from aamp.identity import Directory, LoginThrottle
from aamp.identity.bootstrap import ensure_cli_token, ensure_first_admin
from aamp.runs.leases import DEFAULT_LEASE_SECONDS
from aamp.runs.service import RunService
from aamp.sandbox import available_drivers, configured_manager
from aamp.sandbox.driver import Driver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import SandboxManager
from aamp.sandbox.wheelhouse import Wheelhouse
from aamp.store import Store, database_url
from aamp.vault import Vault
from aamp.web import create_site

log = logging.getLogger("aamp")
KEEP_ALIVE_S = 75
# `aamp up --role`: `both`, the API and this machine's own sandbox host; `api`, the API only.
ROLES = ("both", "api")


def build_manager(
    settings: Settings,
    audit: AuditLog,
    drivers: dict[str, Driver] | None = None,
    vault: Vault | None = None,
    role: str = "both",
) -> tuple[SandboxManager, ImageStore]:
    """The sandbox manager: this machine's drivers (`both`), or none (`api`: every sandbox
    on a registered host)."""
    if role == "api":
        drivers = {}
    elif drivers is None:
        drivers = available_drivers(settings)
    if role != "api" and not drivers:
        raise SystemExit("no isolation driver works on this host; run `aamp doctor` to see why")
    manager = configured_manager(
        settings,
        drivers,
        recorder=audit,
        egress_sink=AuditEgressSink(audit),
        secrets=VaultSecretReader(vault) if vault is not None else None,
        ca=InstallationCA.load_or_create(ca_dir(settings)),
    )
    return manager, manager.images


def _seconds(settings: Settings, name: str, default: float) -> float:
    raw = settings.env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not 0 < value <= 86400:
        raise ValueError(f"{name} must be more than 0 and at most 86400 seconds, got {raw!r}")
    return value


def trusted_proxies(settings: Settings) -> list[str]:
    """AAMP_TRUSTED_PROXIES: the addresses (or networks) of the reverse proxies in front of
    the API, whose `X-Forwarded-For` names the client. None by default: otherwise any client
    of a loopback listener (every client, on one machine) could name its own address, which
    the login throttle counts and the audit log records."""
    raw = settings.env.get("AAMP_TRUSTED_PROXIES", "").strip()
    found = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        try:
            found.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ValueError(
                f"AAMP_TRUSTED_PROXIES: {item!r} is not an IP address or network "
                "(give the proxies' addresses, comma-separated)"
            ) from None
    return found


def http_config(app: object, settings: Settings) -> uvicorn.Config:
    """How the API is served (uvicorn): on AAMP_HOST:AAMP_PORT, a client's address taken from
    `X-Forwarded-For` only when it connects from a trusted proxy."""
    proxies = trusted_proxies(settings)
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=settings.listen_host,
        port=settings.listen_port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        # Idle keep-alive connections are closed by the server only after clients have long
        # let them go (httpx forgets one after 5 s). With uvicorn's default of 5 s the two
        # race: a client reusing a connection just as the server closes it gets the
        # connection reset (`httpx.ReadError`), which crashed the API benchmark under load.
        timeout_keep_alive=KEEP_ALIVE_S,
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies or None,
    )


def build_fleet(
    settings: Settings, store: Store, audit: AuditLog, manager: SandboxManager, role: str = "both"
) -> tuple[HostRegistry, FleetUpkeep, HostLinks]:
    """The host registry and this replica's fleet task, which heartbeats this process's own
    sandbox host (`AAMP_FLEET_HOST_ID`, default `local`; none with role `api`) every
    AAMP_FLEET_HEARTBEAT_SECONDS and marks lost the hosts silent for AAMP_FLEET_LOST_SECONDS.
    With AAMP_FLEET_LINK_LISTEN (HOST:PORT; AAMP_FLEET_LINK_ADVERTISE, what others dial) that
    host serves a link."""
    heartbeat = _seconds(settings, "AAMP_FLEET_HEARTBEAT_SECONDS", DEFAULT_HEARTBEAT_SECONDS)
    lost = _seconds(settings, "AAMP_FLEET_LOST_SECONDS", DEFAULT_LOST_SECONDS)
    if heartbeat * 2 > lost:
        raise ValueError(
            f"AAMP_FLEET_LOST_SECONDS ({lost:g}) must be at least twice "
            f"AAMP_FLEET_HEARTBEAT_SECONDS ({heartbeat:g}), or one late heartbeat loses a host"
        )
    registry = HostRegistry(store, lost_after=lost)
    # Every sandbox this process makes is placed, its capacity reserved: on its own host, or
    # on a host with a link (`aamp host serve`), reached with this replica's certificate.
    links = HostLinks(LinkCA.of(settings), audit)
    # Several replicas: each one's own host serves a link too, so any replica reaches its
    # sandboxes; one machine alone sets none (no TLS, as before).
    listen = settings.env.get("AAMP_FLEET_LINK_LISTEN", "").strip()
    advertise = settings.env.get("AAMP_FLEET_LINK_ADVERTISE", "").strip() or None
    if advertise and not listen:
        raise ValueError("AAMP_FLEET_LINK_ADVERTISE needs AAMP_FLEET_LINK_LISTEN")
    local = None
    if role != "api":
        host_id = check_host_id(settings.env.get("AAMP_FLEET_HOST_ID", "").strip() or "local")
        link = LocalLink(links.ca, manager, host_id, listen, advertise) if listen else None
        local = LocalHost(registry, manager, host_id, link=link)
    elif listen:
        raise ValueError(
            "AAMP_FLEET_LINK_LISTEN serves this replica's own host; `--role api` has none"
        )
    manager.placer = FleetPlacer(
        Placement(registry), local.host_id if local else None, links, Wheelhouse(settings)
    )
    return registry, FleetUpkeep(registry, audit, local, heartbeat), links


def build_control_plane(
    settings: Settings, drivers: dict[str, Driver] | None = None, role: str = "both"
) -> tuple[ControlPlane, str | None]:
    """The whole host process; also the first admin's generated password, if one was made.

    `role` is `both` (the API and this machine's own sandbox host; `drivers` defaults to
    every driver usable here) or `api` (a replica that runs no sandbox: every one is placed
    on a registered host, so it needs PostgreSQL, which the hosts' replicas share).
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    settings.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    if role == "api" and database_url(settings).get_backend_name() != "postgresql":
        raise SystemExit(
            "aamp up --role api needs PostgreSQL (AAMP_DATABASE_URL=postgresql://...): a"
            " replica that runs no sandboxes shares the hosts and everything else with the"
            " other replicas through it; SQLite serves one machine's `aamp up` only"
        )
    store = Store.open(settings)
    audit = AuditLog.open(settings, store)
    vault = Vault.open(settings, store, audit)
    directory = Directory(store)
    password = ensure_first_admin(directory, settings.env)
    ensure_cli_token(directory, settings.cli_token_path)
    manager, images = build_manager(settings, audit, drivers, vault, role)
    hosts, fleet, links = build_fleet(settings, store, audit, manager, role)
    cp = ControlPlane(
        settings=settings,
        store=store,
        audit=audit,
        vault=vault,
        directory=directory,
        agents=AgentRegistry(store),
        catalog=Catalog(store),
        manager=manager,
        images=images,
        throttle=LoginThrottle(store),
        hosts=hosts,
        fleet=fleet,
        links=links,
        runs=RunService(
            settings,
            store,
            audit,
            manager,
            vault,
            _seconds(settings, "AAMP_RUN_LEASE_SECONDS", DEFAULT_LEASE_SECONDS),
        ),
    )
    assert cp.runs is not None and isinstance(manager.placer, FleetPlacer)
    # A run another replica stopped driving is resolved again as the API resolves a new one.
    cp.runs.rebuild = lambda run: rebuilt_request(cp, run)
    # Runs whose sandboxes were lost with their host fail with that reason within a heartbeat,
    # whichever replica marked the host.
    cp.runs.sandbox_losses = manager.placer.lost
    fleet.after_sweep.append(cp.runs.fail_lost_sandboxes)
    # Sandboxes on other hosts past their ttl that their host kept: reaped, recorded.
    fleet.after_sweep.append(manager.reap_elsewhere)
    # The hosts on other machines: their egress records into this audit chain, their
    # credential asks decided here (`aamp.fleet.collector`).
    credentials = HostCredentials(
        store, lambda name: cp.catalog.get_service(name).secrets, vault, audit
    )
    # ... and the leaves of their HTTPS services signed here, with the one egress CA.
    assert manager.egress.ca is not None
    leaves = HostLeaves(
        store, lambda name: cp.catalog.get_service(name).for_egress(), manager.egress.ca, audit
    )
    # ... and the `default: ask` questions of sandboxes whose runs this replica drives.
    collectors = HostCollectors(
        hosts, links, manager.placer.host_id, credentials, audit, vault, leaves,
        manager.remote_approver,
    )  # fmt: skip
    fleet.after_sweep.append(collectors.sync)
    fleet.after_stop.append(collectors.stop)
    return cp, password


def serve(settings: Settings, role: str = "both") -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    trusted_proxies(settings)  # a bad value stops `aamp up` before anything starts
    cp, password = build_control_plane(settings, role=role)
    app = create_site(cp)
    if password is not None:
        print(
            f"created the first admin: user 'admin', password {password} (shown only now; "
            "set AAMP_ADMIN_PASSWORD to choose it)",
            flush=True,
        )
    drivers = ", ".join(sorted(cp.manager.drivers))
    where = (
        f"drivers: {drivers}; default {cp.manager.default_driver}"
        if role != "api"
        else "role api: every sandbox on a registered host"
    )
    print(
        f"aamp control plane on {settings.api_url} ({where}); admin API token in"
        f" {settings.cli_token_path}",
        flush=True,
    )
    from aamp.mcp import with_mcp  # /mcp beside the API, acting through it

    config = http_config(with_mcp(app, cp, settings.api_url), settings)
    # Everything built so far lives as long as the process: move it out of the cyclic GC's
    # sight, whose full collections otherwise walked all of it (100 ms pauses under load).
    gc.collect()
    gc.freeze()
    try:
        # On uvloop: its event loop and transports cost the egress proxies, which share this
        # loop, a quarter less CPU per request than asyncio's own (benchmarks/egress.py).
        uvloop.run(uvicorn.Server(config).serve())
    finally:
        cp.store.close()
