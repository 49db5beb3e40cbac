"""Assembles the host process from settings: store, audit log, vault, identity, sandboxes, API.

`aamp up` opens the store (SQLite under $AAMP_HOME unless AAMP_DATABASE_URL says otherwise)
and migrates it, creates the first admin on a fresh installation (printing a generated
password once), keeps an admin API token for the local CLI in $AAMP_HOME/cli-token (0600),
and wires the sandbox manager's lifecycle records to the real audit log.
"""

from __future__ import annotations

import asyncio
import gc
import logging

import uvicorn

from aamp.agents.registry import AgentRegistry
from aamp.api.context import ControlPlane
from aamp.api.runs import rebuilt_request
from aamp.audit import AuditLog
from aamp.catalog import Catalog
from aamp.config import Settings
from aamp.egress.ca import InstallationCA, ca_dir
from aamp.egress.installation import InstallationListeners
from aamp.egress.ledger import AuditEgressSink
from aamp.egress.resolver import DnsServerResolver, Resolver, SystemResolver
from aamp.egress.services import VaultSecretReader
from aamp.fleet import (
    FleetPlacer,
    FleetUpkeep,
    HostRegistry,
    LocalHost,
    Placement,
    check_host_id,
)
from aamp.fleet.link_ca import LinkCA
from aamp.fleet.links import HostLinks
from aamp.fleet.registry import DEFAULT_HEARTBEAT_SECONDS, DEFAULT_LOST_SECONDS
from aamp.identity import Directory, LoginThrottle
from aamp.identity.bootstrap import ensure_cli_token, ensure_first_admin
from aamp.runs.leases import DEFAULT_LEASE_SECONDS
from aamp.runs.service import RunService
from aamp.sandbox import DEFAULT_MAX_WARM
from aamp.sandbox.driver import Driver
from aamp.sandbox.drivers import available_drivers, choose_default_driver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import SandboxManager
from aamp.store import Store
from aamp.vault import Vault
from aamp.web import create_site

log = logging.getLogger("aamp")
KEEP_ALIVE_S = 75


def parse_pool(spec: str) -> dict[str, int]:
    """`AAMP_WARM_POOL="base=2,browser=1"` -> {"base": 2, "browser": 1}."""
    pool: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, count = item.partition("=")
        if not sep or not count.isdigit() or not name:
            raise ValueError(f"AAMP_WARM_POOL item {item!r} must look like IMAGE=COUNT")
        pool[name] = int(count)
    return pool


def egress_resolver(settings: Settings) -> Resolver:
    """Names are resolved on the host: by this host's resolver, or by the DNS servers in
    AAMP_EGRESS_DNS (comma-separated addresses), as air-gapped sites often need. The sandbox
    manager holds it (`manager.resolver`); the egress proxies and runs' model-endpoint
    connections both resolve with it."""
    servers = [s.strip() for s in settings.env.get("AAMP_EGRESS_DNS", "").split(",") if s.strip()]
    return DnsServerResolver(servers) if servers else SystemResolver()


def build_manager(
    settings: Settings,
    audit: AuditLog,
    drivers: dict[str, Driver] | None = None,
    vault: Vault | None = None,
) -> tuple[SandboxManager, ImageStore]:
    images = ImageStore(settings)
    drivers = available_drivers(settings) if drivers is None else drivers
    if not drivers:
        raise SystemExit("no isolation driver works on this host; run `aamp doctor` to see why")
    default = choose_default_driver(settings, drivers)
    pool = parse_pool(settings.env.get("AAMP_WARM_POOL", ""))
    learn = settings.env.get("AAMP_WARM_POOL_LEARN", "0").strip() or "0"
    if not learn.isdigit():
        raise ValueError(f"AAMP_WARM_POOL_LEARN must be a number of pools, got {learn!r}")
    warm_max = settings.env.get("AAMP_WARM_POOL_MAX", "").strip() or str(DEFAULT_MAX_WARM)
    if not warm_max.isdigit():
        raise ValueError(f"AAMP_WARM_POOL_MAX must be a number of sandboxes, got {warm_max!r}")
    manager = SandboxManager(
        settings,
        images,
        drivers,
        default,
        recorder=audit,
        warm_pool=pool,
        learn_pools=int(learn),
        warm_max=int(warm_max),
        egress_sink=AuditEgressSink(audit),
        resolver=egress_resolver(settings),
        secrets=VaultSecretReader(vault) if vault is not None else None,
        ca=InstallationCA.load_or_create(ca_dir(settings)),
        listeners=InstallationListeners.of(settings),
    )
    return manager, images


def _seconds(settings: Settings, name: str, default: float) -> float:
    raw = settings.env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not 0 < value <= 86400:
        raise ValueError(f"{name} must be more than 0 and at most 86400 seconds, got {raw!r}")
    return value


def build_fleet(
    settings: Settings, store: Store, audit: AuditLog, manager: SandboxManager
) -> tuple[HostRegistry, FleetUpkeep, HostLinks]:
    """The host registry and this replica's fleet task, which heartbeats this process's own
    sandbox host (`AAMP_FLEET_HOST_ID`, default `local`) every AAMP_FLEET_HEARTBEAT_SECONDS
    and marks lost the hosts silent for AAMP_FLEET_LOST_SECONDS."""
    heartbeat = _seconds(settings, "AAMP_FLEET_HEARTBEAT_SECONDS", DEFAULT_HEARTBEAT_SECONDS)
    lost = _seconds(settings, "AAMP_FLEET_LOST_SECONDS", DEFAULT_LOST_SECONDS)
    if heartbeat * 2 > lost:
        raise ValueError(
            f"AAMP_FLEET_LOST_SECONDS ({lost:g}) must be at least twice "
            f"AAMP_FLEET_HEARTBEAT_SECONDS ({heartbeat:g}), or one late heartbeat loses a host"
        )
    host_id = check_host_id(settings.env.get("AAMP_FLEET_HOST_ID", "").strip() or "local")
    registry = HostRegistry(store, lost_after=lost)
    local = LocalHost(registry, manager, host_id)
    # Every sandbox this process makes is placed, its capacity reserved: on its own host, or
    # on a host with a link (`aamp host serve`), reached with this replica's certificate.
    links = HostLinks(LinkCA.of(settings))
    manager.placer = FleetPlacer(Placement(registry), host_id, links)
    return registry, FleetUpkeep(registry, audit, local, heartbeat), links


def build_control_plane(
    settings: Settings, drivers: dict[str, Driver] | None = None
) -> tuple[ControlPlane, str | None]:
    """The whole host process; also the first admin's generated password, if one was made.

    `drivers` defaults to every driver usable on this host.
    """
    settings.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = Store.open(settings)
    audit = AuditLog.open(settings, store)
    vault = Vault.open(settings, store, audit)
    directory = Directory(store)
    password = ensure_first_admin(directory, settings.env)
    ensure_cli_token(directory, settings.cli_token_path)
    manager, images = build_manager(settings, audit, drivers, vault)
    hosts, fleet, links = build_fleet(settings, store, audit, manager)
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
    return cp, password


def serve(settings: Settings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    cp, password = build_control_plane(settings)
    app = create_site(cp)
    if password is not None:
        print(
            f"created the first admin: user 'admin', password {password} (shown only now; "
            "set AAMP_ADMIN_PASSWORD to choose it)",
            flush=True,
        )
    drivers = ", ".join(sorted(cp.manager.drivers))
    print(
        f"aamp control plane on {settings.api_url} (drivers: {drivers};"
        f" default {cp.manager.default_driver}); admin API token in {settings.cli_token_path}",
        flush=True,
    )
    from aamp.mcp import with_mcp  # /mcp beside the API, acting through it

    config = uvicorn.Config(
        with_mcp(app, cp, settings.api_url),
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
    )
    # Everything built so far lives as long as the process: move it out of the cyclic GC's
    # sight, whose full collections otherwise walked all of it (100 ms pauses under load).
    gc.collect()
    gc.freeze()
    try:
        asyncio.run(uvicorn.Server(config).serve())
    finally:
        cp.store.close()
